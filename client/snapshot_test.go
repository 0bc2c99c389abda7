package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
)

// badSnapshots serves a snapshot whose checksum does not match its bytes.
type badSnapshots struct {
	tenurev1connect.UnimplementedClusterServiceHandler
	calls atomic.Int32
}

func (b *badSnapshots) Snapshot(ctx context.Context, req *connect.Request[tenurev1.SnapshotRequest], stream *connect.ServerStream[tenurev1.SnapshotChunk]) error {
	b.calls.Add(1)
	if err := stream.Send(&tenurev1.SnapshotChunk{Data: []byte("first half "), Revision: 7}); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte("something else"))
	return stream.Send(&tenurev1.SnapshotChunk{Data: []byte("second half"), Revision: 7, Sha256: hex.EncodeToString(sum[:])})
}

func TestSnapshotWithAWrongChecksumFailsAndWritesNothing(t *testing.T) {
	h := &badSnapshots{}
	_, handler := tenurev1connect.NewClusterServiceHandler(h)
	srv := httptest.NewServer(handler)
	defer srv.Close()
	cl := newFakeClient(t, []string{srv.URL})

	var buf bytes.Buffer
	_, err := cl.Snapshot(context.Background(), &buf)
	if !errors.Is(err, client.ErrChecksumMismatch) {
		t.Fatalf("got = %v, expected: ErrChecksumMismatch", err)
	}
	if buf.Len() != 0 {
		t.Errorf("written got = %q, expected: nothing", buf.String())
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("attempts got = %d, expected: 1 (a mismatch is not retried)", n)
	}
}
