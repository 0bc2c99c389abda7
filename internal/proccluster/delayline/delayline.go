// Package delayline adds network latency to TCP traffic on one machine:
// each forwarded chunk of bytes is delivered a set time after it arrived,
// as on a link with that one-way delay, for the fault tests' proxies
// (package proccluster) and the benchmark's (`tenure bench --peer-rtt`).
//
// # Why a delay line and not a sleep per read
//
// Sleeping before each write would serialise a link: a stream of
// pipelined messages would pay the delay once per message, and its
// throughput would fall to one read per delay. A real link delays every
// byte by the same time and keeps its bandwidth. So Copy reads on the
// caller's goroutine, stamps each chunk with its arrival time and queues
// it; a writer goroutine writes each chunk at its stamp plus the delay.
// Chunks are written in the order they arrived, so the stream is intact.
//
// # Why not time.Sleep
//
// The Go runtime wakes a timer no sooner than a millisecond when it
// otherwise idles (it waits in epoll with a millisecond timeout), so a
// 150µs sleep takes about 1.1ms on Linux: a same-zone round trip would
// become a cross-region one. On Linux the writer instead sleeps in
// nanosleep on a thread of its own with the timer slack set to 1ns,
// which wakes it some 20-40µs after the due time on an idle machine
// (more when the CPUs are busy). The delay is a lower bound: a chunk is
// never written before its time.
package delayline

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// queued bounds the chunks in flight per direction. A full queue stops
// reading, as a full TCP window stops the sender; at 32 KiB per chunk it
// holds far more than any delay this package is meant for times loopback
// bandwidth needs for a stream of messages.
const queued = 256

// chunkSize is the most one read takes.
const chunkSize = 32 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

type chunk struct {
	buf     *[]byte
	n       int
	arrived time.Time
}

// Copy copies src to dst until src ends (io.EOF) or either side fails,
// writing each chunk delay() after it was read; delay is called once per
// chunk, when it is due to be written, so a changed delay applies to
// what is still queued. Chunks keep their order. What was read before src
// ended is still delivered, at its time, before Copy returns nil; what
// was read before a read error other than io.EOF (src closed, as when a
// proxy cuts the link) is dropped, and Copy returns that error without
// waiting for its delays.
//
// Copy reads on the calling goroutine and writes on one it starts and
// waits for. When a write fails, Copy closes src, so that a Read blocked
// on it returns, and returns the write's error; a read error other than
// The caller usually closes both sides when Copy returns, as a proxy
// does.
func Copy(dst io.Writer, src io.ReadCloser, delay func() time.Duration) error {
	chunks := make(chan chunk, queued)
	failed := make(chan struct{})  // closed by the writer when a write fails
	aborted := make(chan struct{}) // closed by the reader when a read fails
	var werr error
	var wg sync.WaitGroup
	wg.Go(func() {
		var s sleeper
		for c := range chunks {
			if werr == nil && s.until(c.arrived.Add(delay()), aborted) {
				if _, err := dst.Write((*c.buf)[:c.n]); err != nil {
					werr = err
					close(failed)
					src.Close()
				}
			}
			bufs.Put(c.buf)
		}
	})
	var rerr error
	for {
		buf := bufs.Get().(*[]byte)
		n, err := src.Read(*buf)
		if n > 0 {
			select {
			case chunks <- chunk{buf: buf, n: n, arrived: time.Now()}:
			case <-failed:
				bufs.Put(buf)
			}
		} else {
			bufs.Put(buf)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				// A cut link: what is still in the line is lost.
				rerr = err
				close(aborted)
			}
			break
		}
	}
	close(chunks)
	wg.Wait()
	if werr != nil {
		return werr
	}
	return rerr
}

// Pipe forwards between two connections in both directions, each delayed
// by delay(), and closes both when either direction ends: a proxied TCP
// connection on a link with that one-way delay. It returns once both
// directions have stopped.
func Pipe(a, b net.Conn, delay func() time.Duration) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			a.Close()
			b.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = Copy(b, a, delay)
		closeBoth()
	})
	_ = Copy(a, b, delay)
	closeBoth()
	wg.Wait()
}
