package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurehq/tenure/statemachine"
)

// Config configures a Node. The zero value of every field but DataDir and
// PeerAddr has a usable default.
type Config struct {
	NodeID    string // raft server ID, default "node1"
	DataDir   string // holds the log store, snapshots and stable store under DataDir/raft
	PeerAddr  string // TCP bind address of the raft transport, e.g. "127.0.0.1:7481"
	Advertise string // address other nodes dial; default the bound PeerAddr
	LogStore  string // "wal" (default, hashicorp/raft-wal) or "boltdb" (raft-boltdb/v2)
	// WALSegmentSize is the size of each raft-wal segment file, which is
	// preallocated when created; zero means raft-wal's 64 MiB.
	WALSegmentSize int
	// MinFreeBytes is the free space the node keeps in DataDir's file
	// system: below it, DiskFull reports a *DiskFullError and the server
	// refuses writes that grow the state, so the log never fails an
	// append halfway. Zero means twice the segment size; negative turns
	// the reserve off.
	MinFreeBytes int64
	// DiskCheckInterval is how often free space is measured; zero means
	// every second.
	DiskCheckInterval time.Duration
	// FreeSpace measures the free bytes in dir's file system; nil uses
	// statfs. Tests set it to play a full disk.
	FreeSpace func(dir string) (uint64, error)
	// RepairLog opens a log whose checksums fail by cutting off the
	// damaged entries: only those before the damage when a snapshot covers
	// them (nothing is lost), else the damaged entries and everything after
	// them (lost on this node unless another member still has them).
	// Without it Open refuses a damaged log with a *CorruptLogError.
	RepairLog bool
	// Bootstrap makes this node a one-voter cluster when DataDir holds no
	// raft state yet. Ignored when state exists, so it is safe to pass on
	// every start of a single node; then Open fails with a
	// *MembershipError if the stored configuration lists servers but not
	// NodeID, since such a node could never be elected.
	Bootstrap bool
	// ForceNewCluster rewrites the configuration stored in DataDir to this
	// node alone, a voter at its own address, before raft starts, keeping
	// every entry's effect on the state (hashicorp/raft RecoverCluster, as
	// etcd's --force-new-cluster and Consul's peers.json). It is for
	// restoring a backup onto a new node ID or address: on a member of a
	// live cluster it makes a second cluster that diverges from the first.
	// Open fails if DataDir holds no state, and does nothing when the
	// configuration already is this node alone at this address.
	ForceNewCluster bool

	// Zero means raft's defaults (1s, 1s, 500ms), adjusted so that a
	// heartbeat timeout below them alone still validates.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64        // entries between snapshots; zero = raft's 8192
	SnapshotInterval   time.Duration // how often to check the threshold; zero = raft's 120s

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // may be nil: metrics are then not exported

	// Observer is called after every applied command that produced events,
	// with that command's events, in log order, on the FSM goroutine,
	// while the node's state lock is held for writing. It must not block
	// and must not call back into the Node. It also sees entries replayed
	// from the log at startup.
	Observer func(events []statemachine.Event)
	// OnRestore is called (under the write lock) after the state was
	// replaced by a snapshot restore, with the new revision, so the watch
	// hub can reset.
	OnRestore func(revision int64)
}

const (
	defaultNodeID       = "node1"
	defaultApplyTimeout = 10 * time.Second
	// maxAppendEntries bounds both a replication RPC and, with
	// BatchApplyCh, how many queued proposals the leader writes with one
	// fsync. 512 of raft's allowed 1024 keeps the worst-case batch fsync
	// short while amortising it across many concurrent callers.
	maxAppendEntries = 512
	retainSnapshots  = 2
	transportPool    = 3
	transportTimeout = 10 * time.Second
)

// Node is one member of Tenure's replicated log, applying committed
// entries to its statemachine.Machine. All methods are safe for concurrent
// use. The caller should call Close when finished.
type Node struct {
	id        string // this node's raft server ID
	raft      *raft.Raft
	fsm       *fsm
	trans     *raft.NetworkTransport
	closeLogs func() error
	space     *spaceCheck
	metrics   *metrics
	log       *slog.Logger
	election  time.Duration

	// readyTerm is the term in which this node, as leader, has seen a
	// barrier complete. Until then its commit index may trail entries
	// committed by the previous leader, so a read index taken from it
	// would not be linearizable.
	readyTerm atomic.Uint64

	notifyCh chan bool // raft's NotifyCh, drained by watchLeader
	leaderCh chan bool // see LeaderChanges

	mu       sync.RWMutex // guards closed; held for reading while a call registers in inflight
	closed   bool
	inflight sync.WaitGroup // calls and waiters that may hold a raft future

	closeOnce  sync.Once
	closeErr   error
	shutdownCh chan struct{} // closed by Close after raft has shut down
	wg         sync.WaitGroup
}

// Open starts a node on cfg.DataDir. With cfg.Bootstrap and no existing
// state it forms a one-voter cluster and soon elects itself; otherwise it
// rejoins the cluster recorded in its log, or waits to be added.
func Open(cfg Config) (*Node, error) {
	return open(cfg, func() state { return statemachine.New() })
}

func open(cfg Config, newState func() state) (n *Node, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("raftnode: DataDir is required")
	}
	if cfg.PeerAddr == "" {
		return nil, errors.New("raftnode: PeerAddr is required")
	}
	if cfg.NodeID == "" {
		cfg.NodeID = defaultNodeID
	}
	if cfg.LogStore == "" {
		cfg.LogStore = "wal"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "raft", "node", cfg.NodeID)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = newHCLogger(log, "raft")
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = maxAppendEntries
	// Raft must only stop when Close says so: a raft that shuts itself
	// down abandons queued futures, and their callers would wait forever.
	rc.ShutdownOnRemove = false
	if cfg.HeartbeatTimeout > 0 {
		rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	}
	if cfg.ElectionTimeout > 0 {
		rc.ElectionTimeout = cfg.ElectionTimeout
	} else {
		rc.ElectionTimeout = max(rc.ElectionTimeout, rc.HeartbeatTimeout)
	}
	if cfg.LeaderLeaseTimeout > 0 {
		rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	} else {
		rc.LeaderLeaseTimeout = min(rc.LeaderLeaseTimeout, rc.HeartbeatTimeout)
	}
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.SnapshotInterval > 0 {
		rc.SnapshotInterval = cfg.SnapshotInterval
	}
	notifyCh := make(chan bool, 1)
	rc.NotifyCh = notifyCh
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}

	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("raftnode: register metrics: %w", err)
	}
	// Undo whatever was opened if a later step fails.
	var cleanup []func() error
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
			m.unregister()
		}
	}()

	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}
	space := newSpaceCheck(dir, cfg, m)
	if err := space.check(); err != nil {
		log.Warn("low on disk space at start; writes are refused until space is freed", "err", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, retainSnapshots, newHCLogger(log, "snapshot"))
	if err != nil {
		return nil, fmt.Errorf("raftnode: snapshot store: %w", err)
	}
	logs, stable, closeLogs, err := openLogStore(dir, cfg, snaps, space, log)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, closeLogs)
	logs = timedLogStore{LogStore: logs, hist: m.storeLogs}

	var advertise net.Addr
	if cfg.Advertise != "" {
		if advertise, err = net.ResolveTCPAddr("tcp", cfg.Advertise); err != nil {
			return nil, fmt.Errorf("raftnode: advertise address: %w", err)
		}
	}
	trans, err := raft.NewTCPTransportWithLogger(cfg.PeerAddr, advertise, transportPool, transportTimeout, newHCLogger(log, "transport"))
	if err != nil {
		return nil, fmt.Errorf("raftnode: transport: %w", err)
	}
	cleanup = append(cleanup, trans.Close)

	newScratchFSM := func() raft.FSM { return &fsm{st: newState(), newState: newState, log: log, metrics: m} }
	if err := reconcileConfiguration(cfg, rc, logs, stable, snaps, trans, newScratchFSM, log); err != nil {
		return nil, err
	}
	if cfg.Bootstrap {
		exists, err := raft.HasExistingState(logs, stable, snaps)
		if err != nil {
			return nil, fmt.Errorf("raftnode: inspect state: %w", err)
		}
		if !exists {
			conf := raft.Configuration{Servers: []raft.Server{{
				Suffrage: raft.Voter,
				ID:       rc.LocalID,
				Address:  trans.LocalAddr(), // the bound port when PeerAddr ends in :0
			}}}
			if err := raft.BootstrapCluster(rc, logs, stable, snaps, trans, conf); err != nil {
				return nil, fmt.Errorf("raftnode: bootstrap: %w", err)
			}
		}
	}

	f := &fsm{
		st:        newState(),
		newState:  newState,
		observer:  cfg.Observer,
		onRestore: cfg.OnRestore,
		log:       log,
		metrics:   m,
	}
	r, err := raft.NewRaft(rc, f, logs, stable, snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("raftnode: start raft: %w", err)
	}

	n = &Node{
		id:         cfg.NodeID,
		raft:       r,
		fsm:        f,
		trans:      trans,
		closeLogs:  closeLogs,
		space:      space,
		metrics:    m,
		log:        log,
		election:   rc.ElectionTimeout,
		notifyCh:   notifyCh,
		leaderCh:   make(chan bool, 1),
		shutdownCh: make(chan struct{}),
	}
	n.wg.Add(2)
	go n.watchLeader()
	go n.watchSpace(cfg.DiskCheckInterval)
	log.Info("raft node open", "addr", string(trans.LocalAddr()), "log_store", cfg.LogStore, "dir", dir)
	return n, nil
}

// openLogStore opens the log store, which is also the stable store (term,
// vote): both kinds implement the two interfaces in one durable file set.
func openLogStore(dir string, cfg Config, snaps raft.SnapshotStore, space *spaceCheck, log *slog.Logger) (raft.LogStore, raft.StableStore, func() error, error) {
	walDir := filepath.Join(dir, "wal")
	boltPath := filepath.Join(dir, "raft.db")
	kind := cfg.LogStore
	// Opening the other kind on an existing directory would look like an
	// empty log and, with Bootstrap, silently start a new cluster.
	switch kind {
	case "wal":
		if _, err := os.Stat(boltPath); err == nil {
			return nil, nil, nil, fmt.Errorf("raftnode: %s holds a boltdb log store, but LogStore is %q", dir, kind)
		}
		if err := os.MkdirAll(walDir, 0o750); err != nil {
			return nil, nil, nil, fmt.Errorf("raftnode: %w", err)
		}
		o := walOptions{segmentSize: cfg.WALSegmentSize, repair: cfg.RepairLog, logger: log}
		w, damage, err := openWAL(walDir, o)
		// Each repair cuts at the earliest damage; open again until the
		// log verifies, in case a cut left later damage in place.
		for tries := 0; err == nil && damage != nil; tries++ {
			if err = repairWAL(w, damage, snaps, log); err == nil {
				if err = w.Close(); err == nil {
					w, damage, err = openWAL(walDir, o)
				}
			}
			if err == nil && damage != nil && tries == 10 {
				err = fmt.Errorf("raftnode: repair log: still damaged after %d cuts: %w", tries, damage)
			}
		}
		if err != nil {
			if w != nil {
				w.Close()
			}
			return nil, nil, nil, walOpenError(walDir, cfg, err)
		}
		o.repair = false // what is left must verify
		s := &walStore{
			dir:   walDir,
			w:     w,
			open:  func() (*raftwal.WAL, error) { w, _, err := openWAL(walDir, o); return w, err },
			space: space,
			log:   log,

			segmentSize: uint64(cfg.walSegmentSize()),
		}
		return s, s, s.Close, nil
	case "boltdb":
		if _, err := os.Stat(walDir); err == nil {
			return nil, nil, nil, fmt.Errorf("raftnode: %s holds a wal log store, but LogStore is %q", dir, kind)
		}
		b, err := raftboltdb.NewBoltStore(boltPath)
		if err != nil {
			if isNoSpace(err) {
				return nil, nil, nil, &DiskFullError{Dir: dir, Err: err}
			}
			return nil, nil, nil, fmt.Errorf("raftnode: open boltdb: %w", err)
		}
		return b, b, b.Close, nil
	default:
		return nil, nil, nil, fmt.Errorf("raftnode: unknown LogStore %q (want \"wal\" or \"boltdb\")", kind)
	}
}

// walOpenError explains a failure to open the WAL: a full disk names the
// segment size, since each segment is preallocated whole.
func walOpenError(dir string, cfg Config, err error) error {
	var ce *CorruptLogError
	if errors.As(err, &ce) {
		return err
	}
	if isNoSpace(err) {
		free, _, _ := freeBytes(dir)
		return &DiskFullError{Dir: dir, Free: free, Err: fmt.Errorf("the log preallocates segments of %s (WALSegmentSize) and %s is free: %w", bytesString(uint64(cfg.walSegmentSize())), bytesString(free), err)}
	}
	return fmt.Errorf("raftnode: open wal: %w", err)
}

// watchLeader drains raft's NotifyCh, which raft sends to blockingly, and
// republishes it on leaderCh where a slow consumer cannot stall raft.
func (n *Node) watchLeader() {
	defer n.wg.Done()
	last := false
	for {
		select {
		case v := <-n.notifyCh:
			last = v
			if v {
				n.metrics.isLeader.Set(1)
			} else {
				n.metrics.isLeader.Set(0)
			}
			n.publishLeader(v)
		case <-n.shutdownCh:
			n.metrics.isLeader.Set(0)
			if last {
				n.publishLeader(false)
			}
			return
		}
	}
}

// publishLeader replaces any unread value: the consumer needs the latest
// state, not the history. Only watchLeader sends, so after the drain the
// send cannot block.
func (n *Node) publishLeader(v bool) {
	select {
	case <-n.leaderCh:
	default:
	}
	n.leaderCh <- v
}

// enter registers a call that may wait on a raft future. Close waits for
// registered calls before shutting raft down, because raft abandons
// futures still queued when it stops and their waiters would hang.
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
// (each is bounded by a commit, a step-down or its context), shuts raft
// down and closes the transport and stores. It is safe to call twice; the
// second call returns the first call's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		n.mu.Unlock()
		n.inflight.Wait()

		errs := []error{n.raft.Shutdown().Error()}
		close(n.shutdownCh)
		n.wg.Wait()
		n.trans.CloseStreams()
		errs = append(errs, n.trans.Close(), n.closeLogs())
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
// not appended. A context error, ErrLeadershipLost or ErrClosed after the
// entry was enqueued mean the outcome is unknown: the entry may still
// commit.
func (n *Node) Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	if err := n.enter(); err != nil {
		return statemachine.Result{}, err
	}
	defer n.inflight.Done()
	if n.raft.State() != raft.Leader {
		return statemachine.Result{}, n.notLeader()
	}
	timeout, err := enqueueTimeout(ctx)
	if err != nil {
		return statemachine.Result{}, fmt.Errorf("raftnode: propose: %w", err)
	}
	start := time.Now()
	data, err := statemachine.Encode(start.UnixNano(), cmd)
	if err != nil {
		return statemachine.Result{}, err
	}
	f := n.raft.Apply(data, timeout)
	if err := n.await(ctx, f); err != nil {
		return statemachine.Result{}, n.raftError("propose", err)
	}
	res, ok := f.Response().(statemachine.Result)
	if !ok {
		return statemachine.Result{}, fmt.Errorf("raftnode: propose: entry produced %T, not a statemachine.Result", f.Response())
	}
	n.metrics.propose.Observe(time.Since(start).Seconds())
	return res, nil
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

// readState is the read-index protocol from the raft thesis (§6.4), as in
// rqlite's waitForLinearizableRead: record the commit index, confirm
// leadership, wait for the FSM to reach the recorded index.
func (n *Node) readState(ctx context.Context, fn func(state) error) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()

	term := n.raft.CurrentTerm()
	if n.raft.State() != raft.Leader {
		return n.notLeader()
	}
	if n.readyTerm.Load() != term {
		// A new leader only knows the true commit index once an entry of
		// its own term commits; the barrier does that and also moves
		// applied past the leader's no-op, which the FSM never sees.
		if err := n.barrier(ctx); err != nil {
			return err
		}
		if n.raft.CurrentTerm() == term {
			n.readyTerm.Store(term)
		}
	}
	idx := n.raft.CommitIndex()
	if err := n.await(ctx, n.raft.VerifyLeader()); err != nil {
		return n.raftError("read", err)
	}
	// A term change means another leader may have committed entries our
	// recorded index does not cover.
	if n.raft.CurrentTerm() != term {
		return n.notLeader()
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
	n.fsm.mu.RLock()
	defer n.fsm.mu.RUnlock()
	return fn(n.fsm.st)
}

func (n *Node) waitApplied(ctx context.Context, idx uint64) error {
	for {
		changed := n.fsm.appliedChanged()
		if n.fsm.applied.Load() >= idx {
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
	return n.barrier(ctx)
}

func (n *Node) barrier(ctx context.Context) error {
	timeout, err := enqueueTimeout(ctx)
	if err != nil {
		return fmt.Errorf("raftnode: barrier: %w", err)
	}
	f := n.raft.Barrier(timeout)
	if err := n.await(ctx, f); err != nil {
		return n.raftError("barrier", err)
	}
	// Raft responds to a barrier on the FSM goroutine after applying all
	// before it, so the state does reach the barrier's index; the FSM is
	// not told, since barriers carry no command.
	if idx, ok := f.(raft.IndexFuture); ok {
		n.fsm.advance(idx.Index())
	}
	return nil
}

// AddVoter adds a node to the cluster as a voter, or updates its address.
// It must be called on the leader.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	timeout, err := enqueueTimeout(ctx)
	if err != nil {
		return fmt.Errorf("raftnode: add voter: %w", err)
	}
	f := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout)
	if err := n.await(ctx, f); err != nil {
		return n.raftError("add voter", err)
	}
	return nil
}

// RemoveServer removes a node from the cluster. It must be called on the
// leader.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	timeout, err := enqueueTimeout(ctx)
	if err != nil {
		return fmt.Errorf("raftnode: remove server: %w", err)
	}
	f := n.raft.RemoveServer(raft.ServerID(id), 0, timeout)
	if err := n.await(ctx, f); err != nil {
		return n.raftError("remove server", err)
	}
	return nil
}

// await waits for f or ctx. Raft futures cannot be selected on, so a
// cancellable wait needs a goroutine; it is registered in inflight so that
// Close keeps raft alive until the future resolves.
func (n *Node) await(ctx context.Context, f raft.Future) error {
	if ctx.Done() == nil {
		return f.Error()
	}
	done := make(chan error, 1)
	n.inflight.Add(1) // the caller holds an inflight slot, so Close is still waiting
	go func() {
		defer n.inflight.Done()
		done <- f.Error()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enqueueTimeout turns the context's deadline into raft's enqueue timeout.
func enqueueTimeout(ctx context.Context) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if d, ok := ctx.Deadline(); ok {
		t := time.Until(d)
		if t <= 0 {
			return 0, context.DeadlineExceeded
		}
		return t, nil
	}
	return defaultApplyTimeout, nil
}

// raftError maps raft's errors to this package's, so that callers need not
// import raft.
func (n *Node) raftError(op string, err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("raftnode: %s: %w", op, err)
	case errors.Is(err, raft.ErrNotLeader):
		return n.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("raftnode: %s: %w", op, ErrLeadershipLost)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	case errors.Is(err, raft.ErrEnqueueTimeout):
		// Not enqueued, so not applied: the deadline passed while raft's
		// queue was full.
		return fmt.Errorf("raftnode: %s: not enqueued before the deadline: %w", op, context.DeadlineExceeded)
	default:
		return fmt.Errorf("raftnode: %s: %w", op, err)
	}
}

func (n *Node) notLeader() error {
	addr, id := n.raft.LeaderWithID()
	return &NotLeaderError{Leader: string(addr), LeaderID: string(id)}
}

// IsLeader reports whether this node believes it is the leader. The
// belief can be stale by up to the leader lease; Read and Propose confirm
// it with a quorum.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the leader's raft transport address and ID, empty when no
// leader is known.
func (n *Node) Leader() (addr string, id string) {
	a, i := n.raft.LeaderWithID()
	return string(a), string(i)
}

// LeaderChanges delivers true when this node becomes leader and false when
// it stops being leader, including a final false on Close if it was
// leader. The channel holds one value and a new value replaces an unread
// one, so a slow receiver sees the latest state, not every transition (two
// trues in a row mean leadership was lost and regained in between). It is
// meant for one receiver, the lessor, and is never closed.
func (n *Node) LeaderChanges() <-chan bool { return n.leaderCh }

// AppliedIndex is the index of the last log entry reflected in the state.
func (n *Node) AppliedIndex() uint64 { return n.fsm.applied.Load() }

// ElectionTimeout is the longest a new leader can take to be elected after
// the old one stopped heartbeating. A new leader adds it to every session
// deadline, so that a session is never expired for heartbeats it could
// not deliver during the failover.
func (n *Node) ElectionTimeout() time.Duration { return n.election }

// Stats returns raft's own statistics plus this node's applied index, for
// display and debugging.
func (n *Node) Stats() map[string]string {
	s := n.raft.Stats()
	s["fsm_applied_index"] = strconv.FormatUint(n.AppliedIndex(), 10)
	return s
}

// ID is this node's raft server ID.
func (n *Node) ID() string { return n.id }

// Member is one server in the raft configuration.
type Member struct {
	ID      string
	Address string // raft peer address
	Voter   bool
	Leader  bool
}

// Members lists the servers in the latest raft configuration, with which
// of them leads as far as this node knows.
func (n *Node) Members() ([]Member, error) {
	if err := n.enter(); err != nil {
		return nil, err
	}
	defer n.inflight.Done()
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("raftnode: configuration: %w", err)
	}
	_, leaderID := n.raft.LeaderWithID()
	var out []Member
	for _, s := range f.Configuration().Servers {
		out = append(out, Member{
			ID:      string(s.ID),
			Address: string(s.Address),
			Voter:   s.Suffrage == raft.Voter,
			Leader:  s.ID == leaderID,
		})
	}
	return out, nil
}
