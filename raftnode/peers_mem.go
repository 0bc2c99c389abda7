package raftnode

import (
	"context"
	"fmt"
	"sync"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// MemNetwork joins in-memory peer transports, for a whole cluster in one
// process: the raft engine's counterpart of hashicorp/raft's InmemTransport. Every
// transport reaches every other by its address unless a link is cut, and
// a cut link drops what it carries, as a partition does. Safe for
// concurrent use.
type MemNetwork struct {
	mu    sync.Mutex // guards nodes and cut
	nodes map[string]*memPeers
	cut   map[[2]string]bool // from, to: a link that drops
}

// NewMemNetwork returns a network with no transport on it.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{nodes: map[string]*memPeers{}, cut: map[[2]string]bool{}}
}

// Transport puts a transport on the network at addr; its links keep any
// cut made before, so a node restarted at the same address stays
// partitioned. The caller must Close it when finished. Two open
// transports at one address are a bug in the caller: Transport panics.
func (n *MemNetwork) Transport(addr string) peerTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.nodes[addr]; ok {
		panic(fmt.Sprintf("raftnode: MemNetwork: a transport at %q is already open", addr))
	}
	t := &memPeers{
		net: n, addr: addr, peers: map[uint64]string{}, removed: map[uint64]bool{},
		inbox: make(chan memMessage, peerQueue), started: make(chan struct{}), done: make(chan struct{}),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	n.nodes[addr] = t
	return t
}

// Disconnect cuts the link between a and b, both ways: messages between
// them, including those already queued, are dropped until Connect.
func (n *MemNetwork) Disconnect(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]string{a, b}] = true
	n.cut[[2]string{b, a}] = true
}

// Connect restores the link between a and b, both ways.
func (n *MemNetwork) Connect(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.cut, [2]string{a, b})
	delete(n.cut, [2]string{b, a})
}

// Isolate cuts addr from every transport now on the network; Connect
// restores each link.
func (n *MemNetwork) Isolate(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for other := range n.nodes {
		if other != addr {
			n.cut[[2]string{addr, other}] = true
			n.cut[[2]string{other, addr}] = true
		}
	}
}

// route is the open transport at to when the link from from reaches it.
func (n *MemNetwork) route(from, to string) *memPeers {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[[2]string{from, to}] {
		return nil
	}
	return n.nodes[to]
}

// memMessage is a message in a transport's inbox; snapshot, for a
// MsgSnap, tells its sender how delivery went.
type memMessage struct {
	from     string
	m        raftpb.Message
	snapshot func(etcdraft.SnapshotStatus)
}

// memPeers is one node's transport on a MemNetwork. Its inbox is the
// per-destination queue: Send puts messages in the receiver's, and the
// receiver's goroutine hands them to its raft in order.
type memPeers struct {
	net   *MemNetwork
	addr  string
	inbox chan memMessage

	ctx    context.Context // cancelled by Close, for Process
	cancel context.CancelFunc

	startOnce sync.Once
	started   chan struct{} // closed by Start once h is set
	h         messageHandler
	done      chan struct{} // closed when the delivery goroutine ends

	mu      sync.Mutex // guards peers, removed and closed
	peers   map[uint64]string
	removed map[uint64]bool // by RemovePeer, not to be learned again
	closed  bool
}

var _ peerTransport = (*memPeers)(nil)

func (t *memPeers) LocalAddr() string { return t.addr }

func (t *memPeers) SetPeer(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.removed, id)
	t.peers[id] = addr
}

func (t *memPeers) RemovePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removed[id] = true
	delete(t.peers, id)
}

// learn answers a node that has no address here at the one it sent
// from, as the TCP transport learns it from a hello (see peers.go).
func (t *memPeers) learn(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.peers[id]; !ok && !t.removed[id] {
		t.peers[id] = addr
	}
}

func (t *memPeers) Start(h messageHandler) {
	t.startOnce.Do(func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.h = h
		close(t.started)
		if t.closed {
			close(t.done)
			return
		}
		go t.deliver()
	})
}

func (t *memPeers) handler() messageHandler {
	select {
	case <-t.started:
		return t.h
	default:
		return nil
	}
}

func (t *memPeers) Send(msgs []raftpb.Message) {
	for _, m := range msgs {
		t.mu.Lock()
		addr, known := t.peers[m.To]
		closed := t.closed
		t.mu.Unlock()
		var dst *memPeers
		if known && !closed {
			dst = t.net.route(t.addr, addr)
		}
		mm := memMessage{from: t.addr, m: m}
		if m.Type == raftpb.MsgSnap {
			to := m.To
			mm.snapshot = func(s etcdraft.SnapshotStatus) {
				if h := t.handler(); h != nil && t.ctx.Err() == nil {
					h.ReportSnapshot(to, s)
				}
			}
		}
		if dst != nil && dst.put(mm) {
			continue
		}
		if h := t.handler(); h != nil {
			h.ReportUnreachable(m.To)
		}
		if mm.snapshot != nil {
			mm.snapshot(etcdraft.SnapshotFailure)
		}
	}
}

// put queues mm unless the inbox is full or the transport closed.
func (t *memPeers) put(mm memMessage) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	select {
	case t.inbox <- mm:
		return true
	default:
		return false
	}
}

// deliver hands the inbox to raft in order, dropping what arrives over a
// link cut since it was sent.
func (t *memPeers) deliver() {
	defer close(t.done)
	for {
		var mm memMessage
		select {
		case mm = <-t.inbox:
		case <-t.ctx.Done():
			return
		}
		if t.net.route(mm.from, t.addr) == nil {
			if mm.snapshot != nil {
				mm.snapshot(etcdraft.SnapshotFailure)
			}
			continue
		}
		t.learn(mm.m.From, mm.from)
		err := t.h.Process(t.ctx, mm.m)
		if mm.snapshot != nil {
			if err != nil {
				mm.snapshot(etcdraft.SnapshotFailure)
			} else {
				mm.snapshot(etcdraft.SnapshotFinish)
			}
		}
	}
}

// Close takes the transport off the network and waits for its delivery
// goroutine; what its inbox still holds is dropped, snapshots reported
// failed.
func (t *memPeers) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.cancel()
	t.mu.Unlock()
	t.net.mu.Lock()
	if t.net.nodes[t.addr] == t {
		delete(t.net.nodes, t.addr)
	}
	t.net.mu.Unlock()
	t.startOnce.Do(func() { close(t.started); close(t.done) })
	<-t.done
	// A snapshot never reported would leave its sender's raft waiting
	// for it; the rest raft sends again by itself.
	for {
		select {
		case mm := <-t.inbox:
			if mm.snapshot != nil {
				mm.snapshot(etcdraft.SnapshotFailure)
			}
		default:
			return nil
		}
	}
}
