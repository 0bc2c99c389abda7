package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testnet"
)

// proxy forwards TCP connections from a 127.0.0.1 port to a target, and
// makes network failures plain function calls: Block stops every byte in
// both directions without closing anything (a partition), Resume lets
// them flow again, Close cuts every connection (the endpoint dies).
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // counts the accept loop and every pipe

	mu       sync.Mutex // guards the fields below
	cond     *sync.Cond // signalled when blocked, closed or inflight change
	blocked  bool
	closed   bool
	inflight int // writes under way
	conns    map[net.Conn]struct{}
}

// startProxy listens on a free 127.0.0.1 port and forwards to target.
// It is closed when the test ends.
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln := testnet.Listen(t)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's endpoint, "127.0.0.1:port".
func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		if !p.track(in, out) {
			in.Close()
			out.Close()
			return
		}
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, holding each chunk while the proxy is blocked.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.blocked && !p.closed {
				p.cond.Wait()
			}
			if p.closed {
				p.mu.Unlock()
				return
			}
			p.inflight++
			p.mu.Unlock()
			_, werr := dst.Write(buf[:n])
			p.mu.Lock()
			p.inflight--
			p.cond.Broadcast()
			p.mu.Unlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Block stops forwarding in both directions, without closing anything.
// When it returns, no write is under way and none will start until
// Resume: nothing the client sends reaches the server, and nothing the
// server sends reaches the client.
func (p *proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	for p.inflight > 0 {
		p.cond.Wait()
	}
}

// Resume forwards again, starting with what was held.
func (p *proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = false
	p.cond.Broadcast()
}

// Close stops listening, cuts every connection and waits for the pipes.
// Safe to call twice.
func (p *proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// deadAddr returns a 127.0.0.1 address with nothing listening on it.
func deadAddr(t testing.TB) string {
	t.Helper()
	return testnet.Free(t)
}

func TestFailoverFirstEndpointDead(t *testing.T) {
	addr := startServer(t)
	dead := deadAddr(t)
	c := newClient(t, dead, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const ttl = 500 * time.Millisecond
	s := newSession(t, c, client.WithTTL(ttl), client.WithIdentity("failover"))
	if got := c.Endpoints(); len(got) != 2 || got[0] != "http://"+addr {
		t.Fatalf("got = endpoints %v, expected: the live http://%s first", got, addr)
	}
	other := newSession(t, newClient(t, addr), client.WithTTL(ttl))

	// Locks: a grant, a refusal, a handover.
	m := s.Mutex("failover-lock")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := tokenOf(m)
	if err := other.Mutex("failover-lock").TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("got = %v, expected: ErrLocked", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if tokenOf(m) <= first || !m.Valid() {
		t.Fatalf("got = token %d valid %v, expected: above %d and valid", tokenOf(m), m.Valid(), first)
	}

	// KV, including a watch.
	kv := c.KV()
	_, start, _, err := kv.Range(ctx, "failover/", 0)
	if err != nil {
		t.Fatal(err)
	}
	events := kv.Watch(ctx, "failover/", client.WithPrefix(), client.WithRevision(start+1))
	rev, err := kv.Put(ctx, "failover/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := kv.Get(ctx, "failover/a")
	if err != nil || got.Value != "1" || got.ModRevision != rev {
		t.Fatalf("got = %+v, %v, expected: value 1 at revision %d", got, err, rev)
	}
	select {
	case ev := <-events:
		if ev.Err != nil || ev.Type != client.EventPut || ev.Revision != rev {
			t.Fatalf("got = %+v, expected: PUT at revision %d", ev, rev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event within 5s")
	}

	// Heartbeats keep the session past its TTL.
	time.Sleep(2 * ttl)
	if !s.Valid() || !m.Valid() {
		t.Fatalf("got = session valid %v lock valid %v after 2 TTLs, expected: both valid", s.Valid(), m.Valid())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFailoverEndpointDiesMidSession: two endpoints reach one server
// through two proxies; the one in use dies while a lock is held. The
// heartbeats and the grant's monitor both notice and move to the other
// endpoint, each from the endpoint it was using, and do so within the
// validity window, so nothing is lost. Several rounds, because the
// heartbeats and the monitor race to fail over.
func TestFailoverEndpointDiesMidSession(t *testing.T) {
	addr := startServer(t)
	other := newSession(t, newClient(t, addr), client.WithTTL(time.Second))
	const ttl = 500 * time.Millisecond
	for round := range 4 {
		p1, p2 := startProxy(t, addr), startProxy(t, addr)
		c := newClient(t, p1.Addr(), p2.Addr())
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s := newSession(t, c, client.WithTTL(ttl))
		watchdog := make(chan struct{}, 1)
		name := fmt.Sprintf("dies-%d", round)
		m := s.Mutex(name, client.WithWatchdog(func() { watchdog <- struct{}{} }))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		token := tokenOf(m)
		lost := m.Lost()

		p1.Close()
		// Past the server's TTL since the cut, only heartbeats through
		// p2 can have kept the session. Meanwhile, once the client has
		// moved to p2 it must never move back to the dead p1.
		var backToDead int
		moved := false
		for end := time.Now().Add(ttl + ttl/2); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			switch c.Endpoints()[0] {
			case "http://" + p2.Addr():
				moved = true
			case "http://" + p1.Addr():
				if moved {
					backToDead++
				}
			}
		}
		if backToDead > 0 {
			t.Fatalf("round %d: got = client back on the dead endpoint in %d samples after moving off it, expected: never", round, backToDead)
		}
		select {
		case <-lost:
			t.Fatalf("round %d: got = lock lost (%v), expected: kept across the failover", round, context.Cause(m.Context()))
		case <-watchdog:
			t.Fatalf("round %d: got = watchdog called, expected: not called", round)
		default:
		}
		if !s.Valid() || !m.Valid() {
			t.Fatalf("round %d: got = session valid %v lock valid %v, expected: both valid", round, s.Valid(), m.Valid())
		}
		if got := c.Endpoints()[0]; got != "http://"+p2.Addr() {
			t.Fatalf("round %d: got = endpoint %s in use, expected: http://%s", round, got, p2.Addr())
		}
		// The server agrees: another session cannot take the lock.
		if err := other.Mutex(name).TryLock(ctx); !errors.Is(err, client.ErrLocked) {
			t.Fatalf("round %d: got = %v, expected: ErrLocked", round, err)
		}
		if _, err := c.KV().Put(ctx, name, "v"); err != nil {
			t.Fatal(err)
		}
		if tokenOf(m) != token {
			t.Fatalf("round %d: got = token %d, expected: %d", round, tokenOf(m), token)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := other.Mutex(name).TryLock(ctx); err != nil {
			t.Fatalf("round %d: got = %v after Unlock, expected: lock taken", round, err)
		}
	}
}
