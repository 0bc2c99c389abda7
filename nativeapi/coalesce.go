package nativeapi

import (
	"context"
	"io"
	"net/http"
)

// coalesceSize is how much request body one underlying read may take:
// room for hundreds of heartbeats, which are about ten bytes each.
const coalesceSize = 16 << 10

// coalesceFlushes wraps a bidirectional stream whose handler receives and
// sends on one goroutine, such as KeepAlive, so that responses are flushed
// only when the handler has answered everything the client has sent so
// far and is about to wait for more. connect flushes after every message,
// which over HTTP/2 costs a frame, a hop to the connection's writer and a
// write system call per heartbeat; a client that pipelines a thousand
// heartbeats now gets their answers in a few frames. A client that sends
// one heartbeat and waits sees no difference: its answer is flushed
// before the handler blocks to read the next.
//
// Only for handlers that never wait on anything but the request body
// between a Send and the next Receive: a response stays buffered until
// the next read that would block, or until the handler returns.
func coalesceFlushes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok || r.ProtoMajor < 2 {
			next.ServeHTTP(w, r)
			return
		}
		cw := &coalescingWriter{ResponseWriter: w, flusher: f}
		r.Body = &flushingBody{body: r.Body, w: cw}
		next.ServeHTTP(cw, r)
	})
}

// coalescingWriter defers Flush until flushPending. It is used by one
// goroutine, the handler's, as http.ResponseWriter requires.
type coalescingWriter struct {
	http.ResponseWriter
	flusher http.Flusher
	pending bool // a Flush was asked for and not yet done
}

func (w *coalescingWriter) Flush() { w.pending = true }

func (w *coalescingWriter) flushPending() {
	if w.pending {
		w.pending = false
		w.flusher.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *coalescingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// flushingBody reads the request body in large chunks and serves the
// handler's small reads from them. Before each read from the client,
// which may block, it flushes the responses written so far.
type flushingBody struct {
	body io.ReadCloser
	w    *coalescingWriter
	buf  []byte
	r, n int   // buf[r:n] is read but not yet handed out
	err  error // from the read that filled buf, returned once it is drained
}

func (b *flushingBody) Read(p []byte) (int, error) {
	if b.r == b.n {
		if b.err != nil {
			return 0, b.err
		}
		b.w.flushPending()
		if b.buf == nil {
			b.buf = make([]byte, coalesceSize)
		}
		b.r = 0
		b.n, b.err = b.body.Read(b.buf)
		if b.n == 0 {
			return 0, b.err
		}
	}
	c := copy(p, b.buf[b.r:b.n])
	b.r += c
	return c, nil
}

func (b *flushingBody) Close() error { return b.body.Close() }

// batchFlushes wraps a stream whose answers are sent by one goroutine in
// batches (Pipeline's sendQueue): connect's flush after each message is
// held back until the sender calls flushPending at the end of a batch.
// The writer reaches the handler through its context.
func batchFlushes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		bw := &batchingWriter{coalescingWriter{ResponseWriter: w, flusher: f}}
		next.ServeHTTP(bw, r.WithContext(context.WithValue(r.Context(), batchingKey{}, bw)))
	})
}

type batchingKey struct{}

// batchingWriter is a coalescingWriter flushed by the sending goroutine
// rather than by reads: writes, Flush and flushPending all happen on it.
type batchingWriter struct{ coalescingWriter }
