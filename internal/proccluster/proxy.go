package proccluster

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenurehq/tenure/internal/proccluster/delayline"
)

// external is the "node" of connections no node's process opened: the
// test's own clients.
const external = -1

// unknown is the "node" of a connection not attributed yet.
const unknown = -2

// proxy forwards TCP connections to one node's port (API or raft) while
// the cluster's partition groups allow the dialer to reach that node,
// through a delay line that adds the cluster's latency on peer proxies.
type proxy struct {
	c      *Cluster
	to     int  // the node it fronts
	peer   bool // it carries raft traffic, which the cluster's latency delays
	ln     net.Listener
	target string
	port   int // the proxy's own port, the remote port of its dialers' sockets

	mu     sync.Mutex // guards links, closed, ln and listening
	links  map[*link]struct{}
	closed bool
	// listening is false while the node is down (refuse): a proxy that
	// accepted and then found no node behind it would turn a refused
	// connection, which a client knows carried nothing, into one cut
	// after the request went out, whose outcome it cannot know.
	listening bool
	wg        sync.WaitGroup
}

// link is one forwarded connection: the dialer's side and the node's.
type link struct {
	// from is the node index of the dialer, external, or unknown until
	// a partition makes it matter.
	from   int
	down   net.Conn
	oneWay atomic.Int64 // each direction's delay, in nanoseconds

	mu     sync.Mutex // guards up and closed: a cut may close the link while serve dials
	up     net.Conn
	closed bool
}

func (l *link) delay() time.Duration { return time.Duration(l.oneWay.Load()) }

func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	l.down.Close()
	if l.up != nil {
		l.up.Close()
	}
}

// connect gives the link its connection to the node, and reports false
// (closing up) when the link was closed meanwhile.
func (l *link) connect(up net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		up.Close()
		return false
	}
	l.up = up
	return true
}

func newProxy(c *Cluster, to int, ln net.Listener, target string, peer bool) *proxy {
	p := &proxy{c: c, to: to, peer: peer, ln: ln, target: target, port: ln.Addr().(*net.TCPAddr).Port, links: map[*link]struct{}{}, listening: true}
	p.wg.Go(func() { p.accept(ln) })
	return p
}

// refuse stops listening, so that dialers are refused as by a node that
// is down; listen starts again on the same address.
func (p *proxy) refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listening {
		p.listening = false
		p.ln.Close()
	}
}

func (p *proxy) listen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listening || p.closed {
		return nil
	}
	ln, err := net.Listen("tcp", p.ln.Addr().String())
	if err != nil {
		return err
	}
	p.ln, p.listening = ln, true
	p.wg.Go(func() { p.accept(ln) })
	return nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(conn) })
	}
}

func (p *proxy) serve(conn net.Conn) {
	// Finding the dialer costs a scan of /proc: only while a partition
	// or a latency per link is in force; Isolate and SetLinkLatency find
	// the dialers of the links they find.
	from := unknown
	if p.c.partitioned() || (p.peer && p.c.perLink()) {
		from = p.c.dialer(conn.RemoteAddr().(*net.TCPAddr).Port, p.port)
	}
	l := &link{from: from, down: conn}
	if !p.track(l) {
		return
	}
	defer p.untrack(l)
	up, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		l.close() // the node is down: the dialer sees a refused call
		return
	}
	if !l.connect(up) {
		return // cut while dialing
	}
	p.mu.Lock()
	closed := p.closed || !p.c.allowed(l.from, p.to)
	p.mu.Unlock()
	if closed {
		l.close()
		return
	}
	delayline.Pipe(conn, up, l.delay)
	l.close()
}

// track registers l unless the proxy is closed or the partition forbids
// it, in which case it closes l: the dialer sees its connection reset, as
// on a network that drops it.
func (p *proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.from == unknown && p.c.partitioned() {
		// Cut off since serve looked: attribute it after all.
		l.from = p.c.dialer(l.down.RemoteAddr().(*net.TCPAddr).Port, p.port)
	}
	if p.closed || !p.c.allowed(l.from, p.to) {
		l.close()
		return false
	}
	p.links[l] = struct{}{}
	if p.peer {
		l.oneWay.Store(int64(p.c.oneWay(l.from, p.to)))
	}
	return true
}

func (p *proxy) untrack(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// enforce closes every link the current partition forbids, first
// finding the dialers of those not attributed yet through owners.
func (p *proxy) enforce(owners func(remotePort, proxyPort int) int) {
	p.mu.Lock()
	var cut []*link
	for l := range p.links {
		if l.from == unknown {
			l.from = owners(l.down.RemoteAddr().(*net.TCPAddr).Port, p.port)
		}
		if !p.c.allowed(l.from, p.to) {
			cut = append(cut, l)
		}
	}
	p.mu.Unlock()
	for _, l := range cut {
		l.close()
	}
}

// retune sets every link's delay to what the cluster's settings now ask
// for, first finding the dialers of those not attributed yet through
// owners (which may answer unknown when no per-link setting needs them).
func (p *proxy) retune(owners func(remotePort, proxyPort int) int) {
	if !p.peer {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.from == unknown {
			l.from = owners(l.down.RemoteAddr().(*net.TCPAddr).Port, p.port)
		}
		l.oneWay.Store(int64(p.c.oneWay(l.from, p.to)))
	}
}

// close stops the proxy and waits for its goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	links := p.links
	p.links = map[*link]struct{}{}
	p.ln.Close()
	p.mu.Unlock()
	for l := range links {
		l.close()
	}
	p.wg.Wait()
}
