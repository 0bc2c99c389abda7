package delayline

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/internal/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a writer that notes when each byte arrived.
type recorder struct {
	mu   sync.Mutex // guards data and at
	data []byte
	at   []time.Time // per byte
}

func (r *recorder) Write(p []byte) (int, error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data = append(r.data, p...)
	for range p {
		r.at = append(r.at, now)
	}
	return len(p), nil
}

// TestCopyKeepsOrderAndDelaysEveryChunk writes numbered messages into a
// delay line one after the other, without waiting for them to come out,
// and checks that they come out whole, in order, each at least the delay
// after it went in.
func TestCopyKeepsOrderAndDelaysEveryChunk(t *testing.T) {
	const delay = 20 * time.Millisecond
	const messages = 50
	pr, pw := io.Pipe()
	var out recorder
	done := make(chan error, 1)
	go func() { done <- Copy(&out, pr, func() time.Duration { return delay }) }()
	sent := make([]time.Time, messages)
	for i := range messages {
		var msg [4]byte
		binary.BigEndian.PutUint32(msg[:], uint32(i))
		sent[i] = time.Now()
		if _, err := pw.Write(msg[:]); err != nil {
			t.Fatal(err)
		}
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatalf("Copy: got = %v, expected: nil at the end of its input", err)
	}
	if len(out.data) != 4*messages {
		t.Fatalf("bytes delivered: got = %d, expected: %d", len(out.data), 4*messages)
	}
	for i := range messages {
		if got := binary.BigEndian.Uint32(out.data[4*i:]); got != uint32(i) {
			t.Fatalf("message %d: got = message %d, expected: the order they were sent in", i, got)
		}
		if took := out.at[4*i].Sub(sent[i]); took < delay {
			t.Errorf("message %d: delivered %v after it was sent, expected: at least %v", i, took, delay)
		}
	}
}

// failingWriter fails every write.
type failingWriter struct{}

var errWrite = errors.New("write refused")

func (failingWriter) Write([]byte) (int, error) { return 0, errWrite }

// TestCopyEndsWhenItsWriteFails checks that a failed write ends Copy even
// while its reader is blocked: it closes the source.
func TestCopyEndsWhenItsWriteFails(t *testing.T) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Copy(failingWriter{}, pr, func() time.Duration { return time.Millisecond }) }()
	if _, err := pw.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// The writer closes pr after its write fails; the next write here
	// then fails too, and nothing else ends Copy's read.
	if err := <-done; !errors.Is(err, errWrite) {
		t.Errorf("Copy: got = %v, expected: %v", err, errWrite)
	}
	if _, err := pw.Write([]byte("y")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("write after Copy ended: got = %v, expected: %v", err, io.ErrClosedPipe)
	}
}

// TestProxyAddsTheRoundTripAndCloseEndsItsConnections times round trips
// through a proxy before and after SetRTT, and checks that Close cuts an
// open connection.
func TestProxyAddsTheRoundTripAndCloseEndsItsConnections(t *testing.T) {
	p, err := Listen("127.0.0.1:0", testnet.Echo(t), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func() time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("echo through the proxy: got = %q, %v, expected: %q", line, err, "ping\n")
		}
		return time.Since(start)
	}
	for _, rtt := range []time.Duration{10 * time.Millisecond, 30 * time.Millisecond} {
		p.SetRTT(rtt)
		for range 3 {
			if took := roundTrip(); took < rtt {
				t.Errorf("round trip at %v: got = %v, expected: at least %v", rtt, took, rtt)
			}
		}
	}
	p.Close()
	if _, err := r.ReadString('\n'); err == nil {
		t.Errorf("read after Close: got = nil error, expected: the connection ended")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		c2.Close()
		t.Errorf("dial after Close: got = connected, expected: refused")
	}
}

func TestListenRefusesANegativeRoundTrip(t *testing.T) {
	if p, err := Listen("127.0.0.1:0", "127.0.0.1:1", -time.Millisecond); err == nil {
		p.Close()
		t.Fatal("Listen with rtt -1ms: got = nil error, expected: an error naming the round trip")
	}
}

// TestCopyDropsWhatIsInTheLineWhenItsSourceIsClosed checks that closing
// the source, as a proxy cutting a link does, ends Copy without waiting
// out the delay of what is queued, and that none of it is delivered.
func TestCopyDropsWhatIsInTheLineWhenItsSourceIsClosed(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	var out recorder
	done := make(chan error, 1)
	go func() { done <- Copy(&out, pr, func() time.Duration { return time.Hour }) }()
	if _, err := pw.Write([]byte("in flight")); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	select {
	case err := <-done:
		if !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("Copy after its source was closed: got = %v, expected: %v", err, io.ErrClosedPipe)
		}
	case <-time.After(time.Minute): // a hang, not a speed goal: the delay is an hour
		t.Fatal("Copy after its source was closed: still waiting out the delay of what it had queued")
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if len(out.data) != 0 {
		t.Errorf("delivered after the cut: got = %q, expected: nothing", out.data)
	}
}
