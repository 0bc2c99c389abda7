package raftnode

import (
	"bytes"
	"testing"
)

func TestAChunkWriterKeepsEveryByteInOrderInPiecesOfStatePiece(t *testing.T) {
	var w chunkWriter
	var want bytes.Buffer
	for i, n := range []int{9, 64 << 10, statePiece, 3*statePiece + 7, 1, 0, statePiece - 17} {
		p := bytes.Repeat([]byte{byte(i + 1)}, n)
		w.Write(p)
		want.Write(p)
	}
	chunks := w.chunks()
	for i, c := range chunks[:len(chunks)-1] {
		if len(c) != statePiece {
			t.Fatalf("piece %d: got = %d bytes, expected: %d", i, len(c), statePiece)
		}
	}
	if got := bytes.Join(chunks, nil); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("pieces joined: got = %d bytes, expected: the %d written, in order", len(got), want.Len())
	}
	var empty chunkWriter
	if got := empty.chunks(); len(got) != 0 {
		t.Fatalf("pieces of nothing: got = %d, expected: none", len(got))
	}
}
