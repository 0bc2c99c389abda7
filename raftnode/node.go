package raftnode

// Node: the package's API for proposing, reading and watching
// leadership, and its lifecycle (Open, Close, calls in flight). It knows
// the engine only through a handful of methods, so the API reads
// without raft's vocabulary.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// Node is one member of Tenure's replicated log, applying committed
// entries to its statemachine.Machine. All methods are safe for concurrent
// use. The caller should call Close when finished.
type Node struct {
	id       string // this node's raft server ID
	engine   *engine
	applier  *applier
	space    *spaceCheck
	walTail  *walTail // nil: stores given, or boltdb
	dataDir  string   // "": stores given
	metrics  *metrics
	log      *slog.Logger
	election time.Duration // the longest a failover's election takes
	peerTLS  *tls.Config   // nil: raft traffic is plain TCP

	// closeTransport and closeStores close what open opened; closeStores
	// does nothing for stores the caller passed in.
	closeTransport, closeStores func() error

	leaderCh chan bool // see LeaderChanges

	mu       sync.RWMutex // guards closed; held for reading while a call registers in inflight
	closed   bool
	inflight sync.WaitGroup // calls in flight

	closeOnce  sync.Once
	closeErr   error
	shutdownCh chan struct{} // closed by Close once the engine has stopped
	wg         sync.WaitGroup
}

// Open starts a node on cfg.DataDir. With cfg.Bootstrap and no existing
// state it forms a one-voter cluster (or cfg.InitialVoters) and soon
// elects a leader; otherwise it rejoins the cluster recorded in its log,
// or waits to be added. A data dir of the hashicorp engine converts
// itself first, once, if it is a single node's (see convertFromHashicorp).
func Open(cfg Config) (*Node, error) {
	return open(cfg, func() state { return statemachine.New() })
}

// open runs the steps of Open in order, undoing what earlier steps opened
// when a later one fails.
func open(cfg Config, newState func() state) (n *Node, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "raft", "node", cfg.NodeID)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("raftnode: register metrics: %w", err)
	}
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			m.unregister()
		}
	}()
	converting := false
	if cfg.Stores.given() == 0 {
		if converting, err = claimDir(filepath.Join(cfg.DataDir, "raft")); err != nil {
			return nil, err
		}
	}
	st, err := openStores(cfg, m, log)
	if err != nil {
		return nil, err
	}
	undo = append(undo, st.close)
	var trans peerTransport
	if cfg.Network != nil {
		trans = cfg.Network.Transport(cfg.NodeID)
	} else {
		t, err := listenPeers(peerConfig{ID: raftID(cfg.NodeID), Bind: cfg.PeerAddr, Advertise: cfg.Advertise, TLS: cfg.PeerTLS, EngineTag: engineEtcdRaft, Logger: log, Metrics: m.peers})
		if err != nil {
			return nil, fmt.Errorf("raftnode: transport: %w", err)
		}
		trans = t
	}
	undo = append(undo, trans.Close)
	self := memberInfo{ID: cfg.NodeID, Addr: trans.LocalAddr()}
	if err := prepareStart(cfg, st, self, newState, converting, m, log); err != nil {
		return nil, err
	}
	n = &Node{
		id: cfg.NodeID,
		applier: &applier{
			st:        newState(),
			newState:  newState,
			observer:  cfg.Observer,
			onRestore: cfg.OnRestore,
			log:       log,
			metrics:   m,
		},
		closeTransport: trans.Close,
		closeStores:    st.close,
		space:          st.space,
		walTail:        st.tail,
		dataDir:        cfg.DataDir,
		metrics:        m,
		log:            log,
		// Raft draws each election timeout between one and two of it.
		election:   2 * cfg.ElectionTimeout,
		peerTLS:    cfg.PeerTLS,
		leaderCh:   make(chan bool, 1),
		shutdownCh: make(chan struct{}),
	}
	if n.engine, err = startEngine(n, cfg, st, trans); err != nil {
		return nil, err
	}
	if st.dir != "" {
		n.wg.Add(1)
		go n.watchSpace(cfg.DiskCheckInterval)
	}
	log.Info("raft node open", "engine", engineEtcdRaft, "addr", trans.LocalAddr(), "log_store", st.kind, "dir", st.dir)
	return n, nil
}

// publishLeader replaces any unread value: the consumer needs the latest
// state, not the history. Only the engine's Ready loop sends, and Close
// once that loop has ended, so after the drain the send cannot block.
func (n *Node) publishLeader(v bool) {
	select {
	case <-n.leaderCh:
	default:
	}
	n.leaderCh <- v
}

// enter registers a call in flight. Close waits for registered calls
// before it stops the engine, so that none is cut off half way.
func (n *Node) enter() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return ErrClosed
	}
	n.inflight.Add(1)
	return nil
}

// Close stops the node: it refuses new calls, waits for calls in flight
// (each is bounded by a commit, a step-down or its context), stops the
// engine and closes the transport and the stores it opened, but not those
// given in Config, whose owner closes them after Close returns. It is
// safe to call twice; the second call returns the first call's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		n.mu.Unlock()
		n.inflight.Wait()

		wasLeader := n.engine.isLeader()
		errs := []error{n.engine.close()}
		if wasLeader {
			n.publishLeader(false)
		}
		n.metrics.isLeader.Set(0)
		close(n.shutdownCh)
		n.wg.Wait()
		errs = append(errs, n.closeTransport(), n.closeStores())
		n.metrics.unregister()
		n.closeErr = errors.Join(errs...)
		n.log.Info("raft node closed")
	})
	return n.closeErr
}

// Propose stamps cmd with this leader's clock, appends it to the log and
// returns the state machine's result once the entry is durable on a
// quorum and applied here. A rejected command is not an error: it comes
// back in Result.Err.
//
// Errors: a *NotLeaderError (errors.Is ErrNotLeader) means the command was
// not appended; so does a *DiskFullError (errors.Is ErrDiskFull), returned
// instead while no node leads because this node's log ran out of space.
// A context error, ErrLeadershipLost or ErrClosed after the entry was
// appended mean the outcome is unknown: the entry may still commit.
func (n *Node) Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	if err := n.enter(); err != nil {
		return statemachine.Result{}, err
	}
	defer n.inflight.Done()
	start := time.Now()
	// A cluster version raised after this read only widens what every
	// member reads: an entry in the older form is still read by all.
	data, err := statemachine.EncodeFor(int(n.applier.version.Load()), start.UnixNano(), cmd)
	if err != nil {
		return statemachine.Result{}, err
	}
	res, err := n.engine.propose(ctx, "propose", data)
	if err == nil {
		n.metrics.propose.Observe(time.Since(start).Seconds())
	}
	return res, err
}

// Read runs fn on the state once it reflects every entry committed before
// Read was called, so fn sees at least any write already acknowledged to
// anyone (a linearizable read). It confirms with a quorum that this node is
// still leader; on a follower it returns a *NotLeaderError.
//
// fn runs under the state read lock, which blocks applies: it must be
// quick, must not retain m or anything reachable from it after it returns,
// and must not call back into the Node.
func (n *Node) Read(ctx context.Context, fn func(m *statemachine.Machine) error) error {
	return n.readState(ctx, func(st state) error { return fn(machine(st)) })
}

// ReadLocal runs fn on this node's state as it is now, which may trail the
// leader's: for display and for callers that only need a recent state.
// fn has the same duties as in Read.
func (n *Node) ReadLocal(fn func(m *statemachine.Machine) error) error {
	return n.readLocalState(func(st state) error { return fn(machine(st)) })
}

func machine(st state) *statemachine.Machine {
	m, _ := st.(*statemachine.Machine)
	return m
}

// readState is the read-index protocol (raft thesis §6.4): the leader
// learns from a quorum that it still leads and what its commit index was
// then, and fn runs once the state has applied that far. Concurrent reads
// share one quorum round.
func (n *Node) readState(ctx context.Context, fn func(state) error) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	if !n.engine.isLeader() {
		return n.notLeader()
	}
	idx, err := n.engine.readIndex(ctx)
	if err != nil {
		return err
	}
	if err := n.waitApplied(ctx, idx); err != nil {
		return err
	}
	return n.readLocked(fn)
}

func (n *Node) readLocalState(fn func(state) error) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.readLocked(fn)
}

func (n *Node) readLocked(fn func(state) error) error {
	return n.applier.read(fn)
}

// WaitApplied returns once this node has applied the log up to idx, or
// when ctx ends: a follower that forwarded a write waits so for the
// index the leader applied it at, so that its own reads see it next.
func (n *Node) WaitApplied(ctx context.Context, idx uint64) error { return n.waitApplied(ctx, idx) }

func (n *Node) waitApplied(ctx context.Context, idx uint64) error {
	for {
		changed := n.applier.appliedChanged()
		if n.applier.applied.Load() >= idx {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("raftnode: wait for index %d: %w", idx, ctx.Err())
		}
	}
}

// Barrier returns once every entry appended before it has been applied on
// this node, the leader. A new leader calls it before trusting its state,
// e.g. before resetting session deadlines.
func (n *Node) Barrier(ctx context.Context) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	_, err := n.engine.propose(ctx, "barrier", nil)
	return err
}

// notLeader is the error for a call that needs the leader: a
// *NotLeaderError, or the *DiskFullError that keeps this node from
// leading while no other leads.
func (n *Node) notLeader() error {
	addr, id := n.Leader()
	if id == "" || id == n.id {
		if err := n.LogFull(); err != nil {
			return err
		}
	}
	return &NotLeaderError{Leader: addr, LeaderID: id}
}

// IsLeader reports whether this node believes it is the leader. The
// belief can be stale by up to an election timeout; Read and Propose
// confirm it with a quorum.
func (n *Node) IsLeader() bool { return n.engine.isLeader() }

// LeaseHeld reports whether this node leads under a lease a quorum
// confirmed, or leads as its configuration's one voter (lease.go): no
// other leader can have been elected by now. The lessor answers
// heartbeats only while it holds.
func (n *Node) LeaseHeld(now time.Time) bool {
	e := n.engine
	return e.lease.Held(now) || e.soleVoter.Load() && e.isLeader()
}

// Leader returns the leader's raft transport address and ID, empty when no
// leader is known.
func (n *Node) Leader() (addr string, id string) { return n.engine.leaderInfo() }

// LeaderChanges delivers true when this node becomes leader and false when
// it stops being leader, including a final false on Close if it was
// leader. The channel holds one value and a new value replaces an unread
// one, so a slow receiver sees the latest state, not every transition (two
// trues in a row mean leadership was lost and regained in between). It is
// meant for one receiver, the lessor, and is never closed.
func (n *Node) LeaderChanges() <-chan bool { return n.leaderCh }

// LogMemoryBytes is the size of the log entries raft holds in memory
// now: those since the last compaction, committed or not. It is bounded
// by about Config.MaxLogMemoryBytes (see there). It costs an atomic load
// and is safe from any goroutine; the server counts it in the storage
// quota.
func (n *Node) LogMemoryBytes() int64 { return n.engine.ms.Bytes() }

// AppliedIndex is the index of the last log entry reflected in the state.
func (n *Node) AppliedIndex() uint64 { return n.applier.applied.Load() }

// ElectionTimeout is the longest a new leader can take to be elected after
// the old one stopped heartbeating. A new leader adds it to every session
// deadline, so that a session is never expired for heartbeats it could
// not deliver during the failover.
func (n *Node) ElectionTimeout() time.Duration { return n.election }

// Stats returns raft's figures plus this node's applied index, for
// display and debugging.
func (n *Node) Stats() map[string]string {
	s := n.engine.stats()
	s["fsm_applied_index"] = strconv.FormatUint(n.AppliedIndex(), 10)
	return s
}

// ID is this node's raft server ID.
func (n *Node) ID() string { return n.id }

// Addr is this node's raft address, where other nodes reach it: the
// advertised or bound TCP address, or its NodeID on a given Network.
func (n *Node) Addr() string { return n.engine.self.Addr }

// Engine names the consensus engine this node runs, what a joining node
// must run too.
func (n *Node) Engine() string { return EngineEtcd }
