package framing_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// request is a small, distinct PipelineRequest per id, so that a frame
// delivered twice, lost or mixed with another shows.
func request(id uint64) *tenurev1.PipelineRequest {
	switch id % 3 {
	case 0:
		return &tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{
			SessionId: int64(id), Name: fmt.Sprintf("lease-%d", id), Value: strings.Repeat("v", int(id%200)),
		}}}
	case 1:
		return &tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_Release{Release: &tenurev1.ReleaseRequest{Name: fmt.Sprintf("lease-%d", id), Token: int64(id)}}}
	}
	return &tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}}
}

func reader(b []byte, max int) *framing.Reader {
	return framing.NewReader(bufio.NewReader(bytes.NewReader(b)), max)
}

// readAll decodes frames until the stream ends, and returns the error
// that ended it.
func readAll(t *testing.T, r *framing.Reader) ([]*tenurev1.PipelineRequest, error) {
	t.Helper()
	var out []*tenurev1.PipelineRequest
	for {
		frame, err := r.Next()
		if err != nil {
			return out, err
		}
		m := &tenurev1.PipelineRequest{}
		if err := proto.Unmarshal(frame, m); err != nil {
			t.Fatalf("frame %d: %v", len(out), err)
		}
		out = append(out, m)
	}
}

// frameBytes is m as one frame: its length as a varint, then m.
func frameBytes(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

func TestFramesRoundTripInOrder(t *testing.T) {
	var buf bytes.Buffer
	w := framing.NewWriter(&buf)
	const n = 1000
	var end int64
	for i := range uint64(n) {
		got, err := w.Append(request(i))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if got <= end {
			t.Fatalf("append %d: got end offset %d, expected: past the previous frame's %d", i, got, end)
		}
		end = got
		// Flush now and then, so that both a batch of many frames and a
		// batch of one go through.
		if i%7 == 0 {
			if err := w.Flush(); err != nil {
				t.Fatalf("flush: %v", err)
			}
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := w.Written(); got != end || got != int64(buf.Len()) {
		t.Fatalf("Written: got = %d, expected: the last frame's end %d, the %d bytes written", got, end, buf.Len())
	}
	got, err := readAll(t, reader(buf.Bytes(), 1<<20))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: got = %v, expected: io.EOF", err)
	}
	if len(got) != n {
		t.Fatalf("got = %d frames, expected: %d", len(got), n)
	}
	for i, m := range got {
		if want := request(uint64(i)); !proto.Equal(m, want) {
			t.Fatalf("frame %d: got = %v, expected: %v", i, m, want)
		}
	}
}

func TestAnEmptyMessageIsAFrameOfItsOwn(t *testing.T) {
	// A zero-length frame is a valid message (every field at its
	// default), not the end of the stream.
	got, err := readAll(t, reader([]byte{0, 0}, 16))
	if !errors.Is(err, io.EOF) || len(got) != 2 {
		t.Fatalf("got = %d frames, %v, expected: 2 empty frames, then io.EOF", len(got), err)
	}
}

func TestReaderRejectsAFrameOverItsLimit(t *testing.T) {
	const limit = 64
	atLimit := make([]byte, limit)
	overLimit := make([]byte, limit+1)
	stream := append(binary.AppendUvarint(nil, limit), atLimit...)
	stream = append(stream, binary.AppendUvarint(nil, limit+1)...)
	stream = append(stream, overLimit...)
	r := reader(stream, limit)
	frame, err := r.Next()
	if err != nil || len(frame) != limit {
		t.Fatalf("a frame of exactly the limit: got = %d bytes, %v, expected: %d bytes", len(frame), err, limit)
	}
	frame, err = r.Next()
	if !errors.Is(err, framing.ErrTooLarge) || frame != nil {
		t.Fatalf("a frame over the limit: got = %d bytes, %v, expected: ErrTooLarge", len(frame), err)
	}
	// Only the length was read: a reader must not allocate what a
	// peer merely claims.
	huge := binary.AppendUvarint(nil, 1<<62)
	if _, err := reader(huge, limit).Next(); !errors.Is(err, framing.ErrTooLarge) {
		t.Fatalf("a claimed length of 2^62: got = %v, expected: ErrTooLarge", err)
	}
}

func TestReaderTellsATruncatedStreamFromAClosedOne(t *testing.T) {
	whole := frameBytes(t, request(3))
	cases := []struct {
		name   string
		stream []byte
		frames int
		want   error
	}{
		{"empty", nil, 0, io.EOF},
		{"ends between frames", append(append([]byte{}, whole...), whole...), 2, io.EOF},
		{"ends inside a frame's body", append(append([]byte{}, whole...), whole[:len(whole)-1]...), 1, io.ErrUnexpectedEOF},
		{"ends after the length", whole[:1], 0, io.ErrUnexpectedEOF},
		// 0x80 says more length bytes follow.
		{"ends inside the length", []byte{0x80}, 0, io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := readAll(t, reader(c.stream, 1<<20))
			if len(got) != c.frames || !errors.Is(err, c.want) {
				t.Fatalf("got = %d frames, then %v, expected: %d frames, then %v", len(got), err, c.frames, c.want)
			}
			if c.want == io.ErrUnexpectedEOF && errors.Is(err, io.EOF) {
				t.Fatalf("got = %v, expected: not io.EOF, which would read as a clean end", err)
			}
		})
	}
}

// brokenWriter takes the first budget bytes, then fails, as a
// connection that broke mid-write does: a partial write and an error.
type brokenWriter struct {
	budget int
	got    bytes.Buffer
	writes int
}

var errBroken = errors.New("connection reset")

func (b *brokenWriter) Write(p []byte) (int, error) {
	b.writes++
	if len(p) <= b.budget {
		b.budget -= len(p)
		return b.got.Write(p)
	}
	n := b.budget
	b.budget = 0
	b.got.Write(p[:n])
	return n, errBroken
}

// TestWrittenSaysWhichFramesLeft: after a write fails part way, the
// frames whose end offset is within Written left whole, and the others
// did not: a client may send those again elsewhere.
func TestWrittenSaysWhichFramesLeft(t *testing.T) {
	for _, flushEach := range []bool{false, true} {
		t.Run(fmt.Sprintf("flush after each frame %v", flushEach), func(t *testing.T) {
			// Cut inside frame 6 of 10, not at a frame boundary.
			var sizes []int
			for i := range uint64(10) {
				sizes = append(sizes, len(frameBytes(t, request(i))))
			}
			budget := 0
			for _, s := range sizes[:6] {
				budget += s
			}
			budget += sizes[6] / 2
			bw := &brokenWriter{budget: budget}
			w := framing.NewWriter(bw)
			var ends []int64
			var flushErr error
			for i := range uint64(10) {
				end, err := w.Append(request(i))
				if err != nil {
					// Only once the stream broke.
					if flushErr == nil || !errors.Is(err, errBroken) {
						t.Fatalf("append %d: got = %v, expected: no error before the write failed", i, err)
					}
					break
				}
				ends = append(ends, end)
				if flushEach {
					flushErr = w.Flush()
				}
			}
			if !flushEach {
				flushErr = w.Flush()
			}
			if !errors.Is(flushErr, errBroken) {
				t.Fatalf("flush: got = %v, expected: the writer's error", flushErr)
			}
			if got := w.Written(); got != int64(budget) {
				t.Fatalf("Written: got = %d, expected: the %d bytes the writer took", got, budget)
			}
			sent, err := readAll(t, reader(bw.got.Bytes(), 1<<20))
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("the bytes that left end with: got = %v, expected: a frame cut short", err)
			}
			var whole int
			for _, end := range ends {
				if end <= w.Written() {
					whole++
				}
			}
			if whole != 6 || len(sent) != whole {
				t.Fatalf("frames ending within Written: got = %d, expected: 6, the %d the peer can decode", whole, len(sent))
			}
			for i, m := range sent {
				if !proto.Equal(m, request(uint64(i))) {
					t.Fatalf("frame %d: got = %v, expected: %v", i, m, request(uint64(i)))
				}
			}
			// The stream stays broken.
			if _, err := w.Append(request(99)); !errors.Is(err, errBroken) {
				t.Fatalf("append after the failure: got = %v, expected: the writer's error", err)
			}
			writes := bw.writes
			if err := w.Flush(); !errors.Is(err, errBroken) || bw.writes != writes {
				t.Fatalf("flush after the failure: got = %v and %d more writes, expected: the writer's error, no write", err, bw.writes-writes)
			}
		})
	}
}

// TestConcurrentAppendsArriveOnceAndWhole: many goroutines append and
// flush at once; every frame arrives exactly once, none torn or
// interleaved with another. The race detector checks that only one
// goroutine writes at a time (the buffer below is not synchronised).
func TestConcurrentAppendsArriveOnceAndWhole(t *testing.T) {
	const goroutines, each = 16, 200
	var buf bytes.Buffer
	w := framing.NewWriter(&buf)
	var wg sync.WaitGroup
	ends := make(chan int64, goroutines*each)
	for g := range uint64(goroutines) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range uint64(each) {
				end, err := w.Append(request(g*each + i))
				if err != nil {
					t.Errorf("append: %v", err)
					return
				}
				ends <- end
				if err := w.Flush(); err != nil {
					t.Errorf("flush: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(ends)
	// Every Flush has returned, so every frame was written: a Flush that
	// found another goroutine writing left its frame to that one, which
	// does not return until nothing is left.
	var last int64
	seenEnd := map[int64]bool{}
	for e := range ends {
		if seenEnd[e] {
			t.Fatalf("end offset %d given to two frames", e)
		}
		seenEnd[e] = true
		last = max(last, e)
	}
	if got := w.Written(); got != last || got != int64(buf.Len()) {
		t.Fatalf("Written: got = %d, expected: %d, the last frame's end and the bytes written (%d)", got, last, buf.Len())
	}
	got, err := readAll(t, reader(buf.Bytes(), 1<<20))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: got = %v, expected: io.EOF", err)
	}
	seen := map[uint64]bool{}
	for _, m := range got {
		if seen[m.GetId()] {
			t.Fatalf("frame %d arrived twice", m.GetId())
		}
		seen[m.GetId()] = true
		if want := request(m.GetId()); !proto.Equal(m, want) {
			t.Fatalf("frame %d: got = %v, expected: %v", m.GetId(), m, want)
		}
	}
	if len(seen) != goroutines*each {
		t.Fatalf("got = %d distinct frames, expected: %d", len(seen), goroutines*each)
	}
}

// gatedWriter blocks its first Write until released, recording each
// write's size.
type gatedWriter struct {
	entered, release chan struct{}
	mu               sync.Mutex
	writes           []int
	buf              bytes.Buffer
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	first := len(g.writes) == 0
	g.writes = append(g.writes, len(p))
	g.buf.Write(p)
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.release
	}
	return len(p), nil
}

// TestFramesAppendedDuringAWriteShareTheNext: while one goroutine is in
// a write, others' Flush returns at once and their frames go out
// together in the writer's next write: one system call for the lot.
func TestFramesAppendedDuringAWriteShareTheNext(t *testing.T) {
	gw := &gatedWriter{entered: make(chan struct{}), release: make(chan struct{})}
	w := framing.NewWriter(gw)
	if _, err := w.Append(request(0)); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- w.Flush() }()
	<-gw.entered
	for i := uint64(1); i <= 10; i++ {
		if _, err := w.Append(request(i)); err != nil {
			t.Fatal(err)
		}
		// Returns without writing: the goroutine in the write will.
		if err := w.Flush(); err != nil {
			t.Fatalf("flush during a write: %v", err)
		}
	}
	close(gw.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if len(gw.writes) != 2 {
		t.Fatalf("writes: got = %v, expected: 2, the first frame's and the other ten's together", gw.writes)
	}
	got, err := readAll(t, reader(gw.buf.Bytes(), 1<<20))
	if !errors.Is(err, io.EOF) || len(got) != 11 {
		t.Fatalf("got = %d frames, %v, expected: 11, then io.EOF", len(got), err)
	}
}

func TestFailStopsTheWriter(t *testing.T) {
	var buf bytes.Buffer
	w := framing.NewWriter(&buf)
	if _, err := w.Append(request(1)); err != nil {
		t.Fatal(err)
	}
	errRead := errors.New("read side broke")
	w.Fail(errRead)
	w.Fail(errors.New("a later failure"))
	if _, err := w.Append(request(2)); !errors.Is(err, errRead) {
		t.Fatalf("append after Fail: got = %v, expected: the first error given to Fail", err)
	}
	if err := w.Flush(); !errors.Is(err, errRead) {
		t.Fatalf("flush after Fail: got = %v, expected: the first error given to Fail", err)
	}
	// What was appended before Fail is not written after it either.
	if buf.Len() != 0 || w.Written() != 0 {
		t.Fatalf("got = %d bytes written (Written %d), expected: none", buf.Len(), w.Written())
	}
}

func TestAMessageThatCannotBeEncodedLeavesTheStreamUsable(t *testing.T) {
	var buf bytes.Buffer
	w := framing.NewWriter(&buf)
	before, err := w.Append(request(1))
	if err != nil {
		t.Fatal(err)
	}
	bad := &tenurev1.PipelineRequest{Id: 2, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{Name: "not \xff UTF-8"}}}
	if _, err := w.Append(bad); !errors.Is(err, framing.ErrEncode) {
		t.Fatalf("append of a string that is not UTF-8: got = %v, expected: ErrEncode", err)
	}
	after, err := w.Append(request(3))
	if err != nil {
		t.Fatalf("append after ErrEncode: got = %v, expected: no error", err)
	}
	if size := int64(len(frameBytes(t, request(3)))); after != before+size {
		t.Fatalf("end offset after ErrEncode: got = %d, expected: %d, as if the bad frame had never been appended", after, before+size)
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("flush: got = %v, expected: no error", err)
	}
	got, err := readAll(t, reader(buf.Bytes(), 1<<20))
	if !errors.Is(err, io.EOF) || len(got) != 2 || !proto.Equal(got[0], request(1)) || !proto.Equal(got[1], request(3)) {
		t.Fatalf("got = %v, then %v, expected: frames 1 and 3, then io.EOF", got, err)
	}
}

// FuzzFrames reads arbitrary bytes as a stream of PipelineRequest
// frames, as the server reads a client's connection: the reader must
// end (each frame consumes input), never return a frame over its limit,
// and what decodes must survive a trip through the Writer unchanged.
func FuzzFrames(f *testing.F) {
	const limit = 1 << 16
	var valid bytes.Buffer
	w := framing.NewWriter(&valid)
	for i := range uint64(5) {
		if _, err := w.Append(request(i)); err != nil {
			f.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{})
	f.Add(valid.Bytes())
	f.Add(valid.Bytes()[:valid.Len()-3])                                            // cut inside the last frame
	f.Add([]byte{0x00, 0x00})                                                       // two empty messages
	f.Add([]byte{0x80})                                                             // cut inside a length
	f.Add(binary.AppendUvarint(nil, limit+1))                                       // a frame over the limit
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}) // a length past 64 bits
	f.Add([]byte{0x03, 0x08, 0x96, 0x01})                                           // id 150
	f.Add([]byte{0x02, 0x0a, 0x05})                                                 // an op cut short inside the frame
	f.Fuzz(func(t *testing.T, data []byte) {
		r := reader(data, limit)
		var msgs []*tenurev1.PipelineRequest
		var frames int
		var err error
		for {
			var frame []byte
			if frame, err = r.Next(); err != nil {
				break
			}
			if frames++; frames > len(data) {
				t.Fatalf("got = %d frames from %d bytes, expected: at most one per byte", frames, len(data))
			}
			if len(frame) > limit {
				t.Fatalf("got = a %d-byte frame, expected: at most the limit %d", len(frame), limit)
			}
			m := &tenurev1.PipelineRequest{}
			if proto.Unmarshal(frame, m) == nil {
				msgs = append(msgs, m)
			}
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, framing.ErrTooLarge):
		case strings.Contains(err.Error(), "overflows"): // a length past 64 bits
		default:
			t.Fatalf("stream ended with: got = %v, expected: io.EOF, io.ErrUnexpectedEOF, ErrTooLarge or a length overflow", err)
		}

		var again bytes.Buffer
		w := framing.NewWriter(&again)
		for _, m := range msgs {
			if _, err := w.Append(m); err != nil {
				t.Fatalf("re-encode %v: %v", m, err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		back, err := readAll(t, reader(again.Bytes(), 1<<20))
		if !errors.Is(err, io.EOF) || len(back) != len(msgs) {
			t.Fatalf("re-encoded: got = %d frames, then %v, expected: %d, then io.EOF", len(back), err, len(msgs))
		}
		for i := range msgs {
			if !proto.Equal(back[i], msgs[i]) {
				t.Fatalf("frame %d re-encoded: got = %v, expected: %v", i, back[i], msgs[i])
			}
		}
	})
}
