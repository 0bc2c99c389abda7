package delayline

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection it accepts to a target address, each
// direction delayed by the same one-way delay: half the round trip it
// adds. The caller must call Close, which ends every connection.
type Proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // one-way, in nanoseconds

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen starts a proxy on addr (host:port, port 0 for any) that
// forwards to target, adding rtt to every round trip (rtt/2 each way).
func Listen(addr, target string, rtt time.Duration) (*Proxy, error) {
	if rtt < 0 {
		return nil, fmt.Errorf("delayline: round trip %v is negative", rtt)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("delayline: listen for %s: %w", target, err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.delay.Store(int64(rtt / 2))
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the address the proxy listens on, for dialers to use instead of
// the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetRTT changes the added round trip, also of open connections and of
// bytes already queued.
func (p *Proxy) SetRTT(rtt time.Duration) { p.delay.Store(int64(max(rtt, 0) / 2)) }

func (p *Proxy) oneWay() time.Duration { return time.Duration(p.delay.Load()) }

func (p *Proxy) accept() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(down) })
	}
}

func (p *Proxy) serve(down net.Conn) {
	if !p.track(down) {
		return
	}
	defer p.untrack(down)
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		down.Close() // the dialer sees its connection end, as when the target is down
		return
	}
	if !p.track(up) {
		down.Close()
		return
	}
	defer p.untrack(up)
	Pipe(down, up, p.oneWay)
}

// track registers c for Close to end, unless the proxy is closed, when it
// closes c instead.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Close stops listening, ends every connection and waits for the
// proxy's goroutines. Safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
