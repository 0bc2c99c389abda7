package raftnode

// The etcd engine's peer transport. etcd's raft library leaves the network
// to its caller: Ready hands out messages, node.Step takes them in, and
// raft retries whatever is lost. So the transport can be simple, and is
// built for the commit path rather than for delivery guarantees:
//
//   - Framing: a uint32 length and a marshalled raftpb.Message. There is
//     no checksum: TCP's and TLS's (an AEAD tag on every record) already
//     cover the bytes between two processes, and a frame cannot be torn
//     as a file can. Frames are bounded (64 MiB, 1 GiB on a snapshot
//     connection) so that a bad length cannot make a node allocate without
//     limit.
//   - One long-lived connection per peer, fed by a bounded queue whose
//     writer goroutine writes everything queued with one buffered write
//     and flush: under load a leader's appends and heartbeats to a peer
//     share one syscall, and a lone message waits for nothing. Send never
//     blocks raft's loop: a full queue, or a peer that is down, drops the
//     message and reports the peer unreachable, and raft sends again.
//   - A snapshot (MsgSnap) goes on a connection of its own, dialed for it,
//     so that a large one does not hold up the heartbeats that keep the
//     leader in place; its receiver answers once raft has taken it, and
//     only then is the snapshot reported finished.
//   - A hello opens every connection: magic bytes, a version, the kind of
//     connection, the dialer's node ID, the engine tag and the dialer's
//     address. The acceptor refuses a wrong magic, which is what a
//     hashicorp/raft node dialing this port sends, and a different engine
//     tag, so that two raft engines never mistake each other's traffic
//     for their own. (Two clusters of the same engine are kept apart by
//     the peer CA and by their configurations, not by the tag.) With TLS, the listener and dialer are the ones the
//     hashicorp transport uses (tlsstream.go): the peer CA's mutual TLS
//     comes first, and the hello travels inside it.
//   - A node that dials in with an ID this transport has no address for
//     is answered at the address its hello gives. A joining node knows
//     nobody until the log tells it the membership, and it cannot get the
//     log without answering the leader's first append: hashicorp/raft
//     answered on the caller's own connection, and this is the same for
//     one-way streams. SetPeer overrides a learned address; RemovePeer
//     stops the learning for that ID until the next SetPeer.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// messageHandler is the engine side of a transport.
type messageHandler interface {
	// Process hands one received message to raft (node.Step). It may block briefly.
	Process(ctx context.Context, m raftpb.Message) error
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, status etcdraft.SnapshotStatus)
}

// peerTransport carries raft messages between the nodes of a cluster.
type peerTransport interface {
	// Send queues msgs for their peers and never blocks the raft loop: a full queue
	// or an unknown/unreachable peer drops the message and calls ReportUnreachable
	// (raft retries). Messages to one peer are delivered in order.
	// A MsgSnap travels on its own connection/goroutine so that a large snapshot does
	// not hold up heartbeats, and ReportSnapshot(to, SnapshotFinish|SnapshotFailure)
	// follows its delivery.
	Send(msgs []raftpb.Message)
	// SetPeer records or changes a peer's address (closing a connection to the old one);
	// RemovePeer forgets it. Safe to call from any goroutine, at any time.
	// Until SetPeer, a node that sends to this one is answered at its own
	// address (how a joining node reaches its leader); after RemovePeer it
	// is not, until the next SetPeer.
	SetPeer(id uint64, addr string)
	RemovePeer(id uint64)
	// Start begins delivering received messages to h. Messages that arrive
	// before Start wait (or are dropped — raft retries); the lead calls Start right after
	// creating the raft node.
	Start(h messageHandler)
	LocalAddr() string
	// Close stops every goroutine and closes every connection and the listener
	// (for the TCP one); it waits for them.
	Close() error
}

// peerConfig configures listenPeers.
type peerConfig struct {
	// ID is this node's raft ID, sent in the hello of every connection it
	// dials so that the other end's log names who called.
	ID uint64
	// Bind is the address to listen on; Advertise, when set, the one the
	// other nodes dial (else the bound address, which must then be a
	// specific one, not 0.0.0.0).
	Bind, Advertise string
	// TLS, when set, is the peer CA's mutual TLS of tlsstream.go; nil is
	// plain TCP.
	TLS *tls.Config
	// EngineTag names the raft engine and its peer protocol; it must be
	// the same on every node that talks to this one (at most 255 bytes),
	// and a connection with another tag is refused.
	EngineTag string
	Logger    *slog.Logger
	Metrics   *peerMetrics // nil: counted but not exported
}

// peerMetrics are the transport's figures. hashicorp/raft's transport
// exported none under Tenure's names, so there is no old name to keep;
// dropped messages are the one figure an operator needs, because they
// show a peer that is down or cannot keep up.
type peerMetrics struct {
	dropped prometheus.Counter
}

// newPeerMetrics builds the collectors; the caller registers them.
func newPeerMetrics() *peerMetrics {
	return &peerMetrics{
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tenure_raft_peer_messages_dropped_total",
			Help: "Raft messages the peer transport dropped (queue full, peer unknown or unreachable, send failed); raft sends again.",
		}),
	}
}

const (
	// peerMagic opens every connection. hashicorp/raft's first byte on the
	// wire is an RPC type (0 to 3), so its traffic never matches.
	peerMagic   = "TENURE\x00R"
	peerVersion = 1

	connStream   byte = 0 // ordinary messages, long-lived
	connSnapshot byte = 1 // one MsgSnap, answered with a status byte

	// Answers to a hello, and the status after a snapshot.
	helloOK          byte = 0
	helloBadVersion  byte = 1
	helloBadTag      byte = 2
	helloBadKind     byte = 3
	helloBadID       byte = 4
	snapshotTaken    byte = 0
	snapshotRejected byte = 1

	maxEngineTag = 255
	// maxFrame bounds an ordinary message: an append is bounded by the
	// engine's MaxSizePerMsg, far below this.
	maxFrame = 64 << 20
	// maxSnapshotFrame bounds a MsgSnap, which carries the whole state.
	maxSnapshotFrame = 1 << 30

	peerQueue = 4096
	// peerWriteTimeout bounds one batch's write and a snapshot's progress
	// by a chunk: a peer that stops reading gets its connection cut and
	// redialed rather than holding the writer forever.
	peerWriteTimeout = 10 * time.Second
	snapshotChunk    = 1 << 20
	peerDialTimeout  = 5 * time.Second
	redialMin        = 50 * time.Millisecond
	redialMax        = time.Second
)

var (
	// errPeerRefused is returned when the other end refuses a hello.
	errPeerRefused = errors.New("peer refused the connection")
	// errUnsendable is returned by writeFrame for a message it cannot
	// frame; nothing was written, and the connection is still good.
	errUnsendable = errors.New("message cannot be sent")
)

// tcpPeers is the TCP (or TLS) peerTransport. The caller must call Close
// when finished.
type tcpPeers struct {
	cfg     peerConfig
	log     *slog.Logger
	metrics *peerMetrics
	ln      net.Listener
	addr    string

	ctx    context.Context // cancelled by Close: ends dials, writes and Process
	cancel context.CancelFunc
	wg     sync.WaitGroup

	started   chan struct{} // closed by Start once h is set
	startOnce sync.Once
	h         messageHandler

	mu      sync.Mutex // guards peers, removed, inbound, streams and closed
	peers   map[uint64]*tcpPeer
	removed map[uint64]bool // by RemovePeer, not to be learned again from a hello
	inbound map[net.Conn]struct{}
	// streams is the message connection each node dialed last. A node
	// has one at a time: a new one means it redialed, and the old one,
	// perhaps half dead after a partition, is closed so that its reader
	// does not linger or deliver beside the new one.
	streams map[uint64]net.Conn
	closed  bool
}

var _ peerTransport = (*tcpPeers)(nil)

// listenPeers binds cfg.Bind and starts accepting connections; messages
// reach a handler once Start is called.
func listenPeers(cfg peerConfig) (*tcpPeers, error) {
	if cfg.ID == 0 {
		// etcd raft's "no node"; and the acceptor keys a node's stream by
		// it, so nodes sharing one would cut each other's connections.
		return nil, errors.New("raftnode: peer transport: the node's raft ID is 0; set peerConfig.ID")
	}
	if len(cfg.EngineTag) > maxEngineTag {
		return nil, fmt.Errorf("raftnode: peer transport: engine tag is %d bytes, the limit is %d", len(cfg.EngineTag), maxEngineTag)
	}
	var advertise net.Addr
	if cfg.Advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", cfg.Advertise)
		if err != nil {
			return nil, fmt.Errorf("raftnode: peer transport: advertise address: %w", err)
		}
		advertise = a
	}
	var ln net.Listener
	if cfg.TLS != nil {
		s, err := listenTLS(cfg.Bind, advertise, cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("raftnode: peer transport: %w", err)
		}
		ln = s
		advertise = s.Addr()
	} else {
		l, err := net.Listen("tcp", cfg.Bind)
		if err != nil {
			return nil, fmt.Errorf("raftnode: peer transport: %w", err)
		}
		if advertise == nil {
			advertise = l.Addr()
		}
		if tcp, ok := advertise.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
			l.Close()
			return nil, fmt.Errorf("raftnode: peer transport: %s is not an address other nodes can dial: set an advertise address", advertise)
		}
		ln = l
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m := cfg.Metrics
	if m == nil {
		m = newPeerMetrics()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &tcpPeers{
		cfg: cfg, log: log.With("component", "peers"), metrics: m, ln: ln, addr: advertise.String(),
		ctx: ctx, cancel: cancel, started: make(chan struct{}),
		peers: map[uint64]*tcpPeer{}, removed: map[uint64]bool{}, inbound: map[net.Conn]struct{}{}, streams: map[uint64]net.Conn{},
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

func (t *tcpPeers) LocalAddr() string { return t.addr }

func (t *tcpPeers) Start(h messageHandler) {
	t.startOnce.Do(func() {
		t.h = h
		close(t.started)
	})
}

// handler is the handler once Start has been called, else nil: reports
// made before there is a raft node to take them are dropped.
func (t *tcpPeers) handler() messageHandler {
	select {
	case <-t.started:
		return t.h
	default:
		return nil
	}
}

func (t *tcpPeers) reportUnreachable(id uint64) {
	if h := t.handler(); h != nil {
		h.ReportUnreachable(id)
	}
}

func (t *tcpPeers) reportSnapshot(id uint64, s etcdraft.SnapshotStatus) {
	if h := t.handler(); h != nil {
		h.ReportSnapshot(id, s)
	}
}

// goLocked starts f counted in wg, unless the transport is closed; the
// caller holds mu, so that no goroutine starts after Close began waiting.
func (t *tcpPeers) goLocked(f func()) bool {
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

func (t *tcpPeers) SetPeer(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.removed, id)
	t.setPeerLocked(id, addr, false)
}

// learn records the address a node's hello gave, unless the node has one
// from SetPeer or was removed.
func (t *tcpPeers) learn(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[id]; addr == "" || t.removed[id] || (p != nil && !p.learned) {
		return
	}
	t.setPeerLocked(id, addr, true)
}

func (t *tcpPeers) setPeerLocked(id uint64, addr string, learned bool) {
	if old, ok := t.peers[id]; ok {
		if old.addr == addr {
			old.learned = learned
			return
		}
		old.cancel() // its writer exits and its connection closes
		delete(t.peers, id)
	}
	if t.closed {
		return
	}
	ctx, cancel := context.WithCancel(t.ctx)
	p := &tcpPeer{t: t, id: id, addr: addr, learned: learned, queue: make(chan raftpb.Message, peerQueue), ctx: ctx, cancel: cancel}
	t.peers[id] = p
	t.goLocked(p.run)
}

func (t *tcpPeers) RemovePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removed[id] = true
	if p, ok := t.peers[id]; ok {
		p.cancel()
		delete(t.peers, id)
	}
}

func (t *tcpPeers) Send(msgs []raftpb.Message) {
	for _, m := range msgs {
		t.mu.Lock()
		p := t.peers[m.To]
		snapshotOff := p != nil && m.Type == raftpb.MsgSnap && t.goLocked(func() { p.sendSnapshot(m) })
		t.mu.Unlock()
		switch {
		case snapshotOff:
		case p == nil || m.Type == raftpb.MsgSnap:
			t.drop(m, "peer unknown")
		default:
			select {
			case p.queue <- m:
			default:
				p.dropped(m, "queue full")
			}
		}
	}
}

// drop counts a message to an unknown peer, and tells raft.
func (t *tcpPeers) drop(m raftpb.Message, why string) {
	t.metrics.dropped.Inc()
	t.log.Debug("raft message dropped", "to", m.To, "type", m.Type, "reason", why)
	t.reportUnreachable(m.To)
	if m.Type == raftpb.MsgSnap {
		t.reportSnapshot(m.To, etcdraft.SnapshotFailure)
	}
}

func (t *tcpPeers) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.cancel()
	for c := range t.inbound {
		c.Close()
	}
	t.mu.Unlock()
	err := t.ln.Close()
	t.wg.Wait()
	return err
}
