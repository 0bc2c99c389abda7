// Package framing is the wire format of the Go client's pipelined
// connection: an HTTP/1.1 connection upgraded to a plain stream of
// protobuf messages (tenure.v1.PipelineRequest one way, PipelineResponse
// the other), each preceded by its length as an unsigned varint.
//
// Why not a gRPC or Connect bidirectional stream? Both are served too
// (SessionService.Pipeline), but on Go's HTTP/2 every message crosses
// several goroutines (caller, frame writer, the peer's read loop and
// serve loop, the handler) and costs about twice the CPU of an HTTP/1.1
// call on a small VM, which is what made per-call transport the floor
// of Tenure's latency and throughput (docs/benchmarks.md). A length
// prefix over TCP needs nothing between the caller and the socket: the
// caller that finds the connection idle writes its own frame, callers
// that arrive meanwhile add theirs to the next write, and one read on
// the other side picks up every frame that came in.
//
// The Writer here does that batching for both ends, and keeps count of
// the bytes the kernel accepted, so that a client whose connection broke
// knows which requests never left it (safe to send again anywhere) and
// which may have been taken.
package framing

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

const (
	// Path is where a client asks to upgrade: POST, with "Connection:
	// Upgrade" and "Upgrade: tenure-pipeline".
	Path = "/v1/pipeline"
	// Protocol is the Upgrade header's value, and the server's answer in
	// its 101 Switching Protocols response.
	Protocol = "tenure-pipeline"
)

// ErrEncode is returned by Writer.Append for a message that cannot be
// encoded (a string that is not UTF-8); the stream is unharmed.
var ErrEncode = errors.New("cannot encode frame")

// ErrTooLarge is returned by Reader.Next for a frame longer than the
// reader's limit; the stream cannot be resynchronised after it.
var ErrTooLarge = errors.New("frame too large")

// Reader reads length-prefixed frames.
type Reader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewReader reads frames of at most max bytes from r.
func NewReader(r *bufio.Reader, max int) *Reader { return &Reader{r: r, max: max} }

// Next returns the next frame's bytes, valid until the following call.
// A stream that ends between frames returns io.EOF; one that ends inside
// a frame, io.ErrUnexpectedEOF.
func (r *Reader) Next() ([]byte, error) {
	n, err := binary.ReadUvarint(r.r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, err
		}
		return nil, fmt.Errorf("frame length: %w", err)
	}
	if n > uint64(r.max) {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, n, r.max)
	}
	if uint64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(r.r, r.buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return r.buf, nil
}

// Buffered reports whether a read would return without waiting for the
// network: more frames (or part of one) have already arrived.
func (r *Reader) Buffered() bool { return r.r.Buffered() > 0 }

// Writer batches frames from many goroutines into few writes. Append adds
// a frame; Flush writes everything appended so far, unless another
// goroutine is writing, in which case that one writes it next and Flush
// returns at once. A frame is therefore written within one write of the
// Flush after its Append, and a lone caller writes its own frame with no
// hand-off to another goroutine.
type Writer struct {
	w io.Writer

	mu      sync.Mutex
	buf     []byte // appended, not yet being written
	spare   []byte // the last batch's buffer, reused for the next
	writing bool   // a goroutine is writing and will pick up buf
	queued  int64  // bytes ever appended
	written int64  // bytes the underlying writer accepted
	err     error
	idle    sync.Cond // signalled when a write ends; L is &mu
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer {
	fw := &Writer{w: w}
	fw.idle.L = &fw.mu
	return fw
}

// Append adds m as a frame and returns the stream offset its last byte
// ends at: once Written passes it, the whole frame left this end.
func (w *Writer) Append(m proto.Message) (end int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	before := len(w.buf)
	w.buf = protowire.AppendVarint(w.buf, uint64(proto.Size(m)))
	w.buf, err = proto.MarshalOptions{}.MarshalAppend(w.buf, m)
	if err != nil {
		w.buf = w.buf[:before]
		return 0, fmt.Errorf("%w: %w", ErrEncode, err)
	}
	w.queued += int64(len(w.buf) - before)
	return w.queued, nil
}

// Flush writes what was appended, or leaves it to the goroutine already
// writing. It returns the error that broke the stream, if any has.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.writing {
		return w.err
	}
	w.writing = true
	for len(w.buf) > 0 && w.err == nil {
		out := w.buf
		w.buf = w.spare[:0]
		w.mu.Unlock()
		n, err := w.w.Write(out)
		w.mu.Lock()
		w.spare = out
		w.written += int64(n)
		if err != nil {
			w.err = fmt.Errorf("write: %w", err)
		}
	}
	w.writing = false
	w.idle.Broadcast()
	return w.err
}

// Written is the stream offset up to which the underlying writer took
// the bytes. A frame that ends past it never left whole, and a peer
// cannot act on part of a frame.
func (w *Writer) Written() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written
}

// Settled is Written once no write is under way: it waits for the one
// under way, if any, to return. Written alone can lag behind what the
// kernel took — the writing goroutine counts a write's bytes only after
// the write returns — so a stream that broke must be settled before its
// frames are sorted into sent and not sent. Call it after Fail and after
// closing the underlying writer, which ends a write that would block.
func (w *Writer) Settled() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.writing {
		w.idle.Wait()
	}
	return w.written
}

// Fail makes every later Append and Flush return err (the first error
// set wins), for a stream whose other direction broke.
func (w *Writer) Fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}
