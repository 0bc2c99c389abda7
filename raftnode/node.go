package raftnode

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// Config configures a Node. The zero value of every field but DataDir and
// PeerAddr has a usable default; a node given its stores and network
// (Stores, Network) needs neither.
type Config struct {
	NodeID    string // raft server ID, default "node1"
	DataDir   string // holds the log store, snapshots and stable store under DataDir/raft
	PeerAddr  string // TCP bind address of the raft transport, e.g. "127.0.0.1:7481"
	Advertise string // address other nodes dial; default the bound PeerAddr
	LogStore  string // store opened under DataDir: "wal" (default, hashicorp/raft-wal) or "boltdb" (raft-boltdb/v2)
	// PeerTLS, when set, makes raft traffic TLS both ways: the node's
	// listener presents its certificate and requires one from every node
	// that connects, and the node presents it when it dials. Both sides
	// verify against the config's ClientCAs (incoming) and RootCAs
	// (outgoing), so a process without a certificate from the peer CA can
	// neither send raft RPCs to the cluster nor receive them.
	PeerTLS *tls.Config

	// Network, when set, carries raft's messages instead of a TCP
	// transport bound on PeerAddr, which must then be empty, as must
	// Advertise: the node's address on it is its NodeID. Tests pass one to
	// run a cluster in one process. The node takes its own transport off
	// the network when it closes; whoever made the network owns it.
	Network *MemNetwork
	// Stores, when set, are used instead of the stores the node would open
	// under DataDir. LogStore, WALSegmentSize, MinFreeBytes,
	// DiskCheckInterval, FreeSpace and RepairLog then do not apply, since
	// they describe those files, and DataDir may be empty. The node never
	// closes them.
	Stores Stores

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
	// InitialVoters, with Bootstrap, is the cluster a node without state
	// forms instead of itself alone, as etcd's --initial-cluster: start
	// every listed node with the same list, and whichever times out first
	// is elected by the others. It must list NodeID; this node's own
	// Address may be left empty, since it is the transport's.
	InitialVoters []Peer
	// ForceNewCluster rewrites the configuration stored in DataDir to this
	// node alone, a voter at its own address, before raft starts, keeping
	// every entry's effect on the state (as etcd's --force-new-cluster and
	// Consul's peers.json): the log becomes one snapshot. It is for
	// restoring a backup onto a new node ID or address: on a member of a
	// live cluster it makes a second cluster that diverges from the first.
	// Open fails if DataDir holds no state, and does nothing when the
	// configuration already is this node alone at this address.
	ForceNewCluster bool

	// ElectionTimeout is how long a follower that hears nothing from a
	// leader waits (raft picks between it and twice it, per election)
	// before it stands for election; the leader heartbeats every tenth of
	// it, and steps down once it has gone that long without hearing from
	// a quorum (check-quorum). Zero means 1s.
	ElectionTimeout   time.Duration
	SnapshotThreshold uint64 // entries applied between snapshots; zero = 8192
	// CatchUpEntries is how many log entries a snapshot leaves behind it,
	// for followers that trail by less to catch up from the log; one
	// further behind (a node down for long, a new one) is sent the
	// snapshot instead. Zero = 10240.
	CatchUpEntries uint64

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // may be nil: metrics are then not exported

	// Observer is called after every applied command that produced events,
	// with that command's events, in log order, on the FSM goroutine,
	// while the node's state lock is held for writing. It must not block
	// and must not call back into the Node. It also sees entries replayed
	// from the log at startup. m is the state after the command, to read
	// (never change) while the lock is held.
	Observer func(m *statemachine.Machine, events []statemachine.Event)
	// OnRestore is called (under the write lock) after the state was
	// replaced by a snapshot restore, with the new revision, so the watch
	// hub can reset.
	OnRestore func(revision int64)
}

// Stores are raft's three stores, for a node that is given them rather
// than opening its own under DataDir (Config.Stores). Set all three or
// none: the log and stable stores must agree on the term the log was
// written in, and the snapshots on the index it starts after.
type Stores struct {
	Log       raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore
}

// given counts the stores that are set.
func (s Stores) given() int {
	n := 0
	for _, set := range []bool{s.Log != nil, s.Stable != nil, s.Snapshots != nil} {
		if set {
			n++
		}
	}
	return n
}

// Peer is one voter of a cluster being bootstrapped (Config.InitialVoters).
type Peer struct {
	ID      string // its Config.NodeID
	Address string // its raft address: its Advertise, bound PeerAddr or Transport.LocalAddr()
}

const (
	defaultNodeID          = "node1"
	defaultApplyTimeout    = 10 * time.Second
	defaultElectionTimeout = time.Second
	retainSnapshots        = 2
)

// The engine's name, as nodes exchange it when one joins another
// (JoinRequest.engine): a node of the other engine (hashicorp/raft, which
// builds before issue 24 ran, and which says nothing) speaks another peer
// protocol and must never join.
const (
	EngineHashicorp = "hashicorp"
	EngineEtcd      = "etcd"
)

// Node is one member of Tenure's replicated log, applying committed
// entries to its statemachine.Machine. All methods are safe for concurrent
// use. The caller should call Close when finished.
type Node struct {
	id       string // this node's raft server ID
	etcd     *etcdEngine
	fsm      *fsm
	space    *spaceCheck
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
		t, err := listenPeers(peerConfig{ID: raftID(cfg.NodeID), Bind: cfg.PeerAddr, Advertise: cfg.Advertise, TLS: cfg.PeerTLS, ClusterTag: engineEtcd, Logger: log, Metrics: m.peers})
		if err != nil {
			return nil, fmt.Errorf("raftnode: transport: %w", err)
		}
		trans = t
	}
	undo = append(undo, trans.Close)
	self := memberInfo{ID: cfg.NodeID, Addr: trans.LocalAddr()}
	if err := prepareEtcd(cfg, st, self, newState, converting, m, log); err != nil {
		return nil, err
	}
	n = &Node{
		id: cfg.NodeID,
		fsm: &fsm{
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
		metrics:        m,
		log:            log,
		// Raft draws each election timeout between one and two of it.
		election:   2 * cfg.ElectionTimeout,
		peerTLS:    cfg.PeerTLS,
		leaderCh:   make(chan bool, 1),
		shutdownCh: make(chan struct{}),
	}
	if n.etcd, err = openEtcd(n, cfg, st, trans); err != nil {
		return nil, err
	}
	if st.dir != "" {
		n.wg.Add(1)
		go n.watchSpace(cfg.DiskCheckInterval)
	}
	log.Info("raft node open", "engine", engineEtcd, "addr", trans.LocalAddr(), "log_store", st.kind, "dir", st.dir)
	return n, nil
}

// withDefaults checks that cfg names its stores and network one way
// each, and fills in the defaults.
func (cfg Config) withDefaults() (Config, error) {
	switch given := cfg.Stores.given(); {
	case given != 0 && given != 3:
		return cfg, errors.New("raftnode: Stores needs all of Log, Stable and Snapshots, or none")
	case given == 0 && cfg.DataDir == "":
		return cfg, errors.New("raftnode: DataDir is required")
	}
	switch {
	case cfg.Network == nil && cfg.PeerAddr == "":
		return cfg, errors.New("raftnode: PeerAddr is required")
	case cfg.Network != nil && (cfg.PeerAddr != "" || cfg.Advertise != ""):
		return cfg, errors.New("raftnode: PeerAddr and Advertise must be empty when a Network is given: the node's address on it is its NodeID")
	}
	cfg.NodeID = cmp.Or(cfg.NodeID, defaultNodeID)
	cfg.LogStore = cmp.Or(cfg.LogStore, "wal")
	cfg.ElectionTimeout = cmp.Or(cfg.ElectionTimeout, defaultElectionTimeout)
	if cfg.ElectionTimeout < 10*time.Millisecond {
		return cfg, fmt.Errorf("raftnode: ElectionTimeout %v is below 10ms: a tick of a tenth of it would be shorter than a scheduler's slice", cfg.ElectionTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.InitialVoters) > 0 {
		if !cfg.Bootstrap {
			return cfg, errors.New("raftnode: InitialVoters is only used with Bootstrap")
		}
		seen := map[string]bool{}
		for _, p := range cfg.InitialVoters {
			switch {
			case p.ID == "":
				return cfg, errors.New("raftnode: InitialVoters lists a voter without an ID")
			case seen[p.ID]:
				return cfg, fmt.Errorf("raftnode: InitialVoters lists %s twice", p.ID)
			case p.Address == "" && p.ID != cfg.NodeID:
				return cfg, fmt.Errorf("raftnode: InitialVoters lists %s without an address", p.ID)
			}
			seen[p.ID] = true
		}
		if !seen[cfg.NodeID] {
			return cfg, fmt.Errorf("raftnode: InitialVoters does not list this node, %s: it could never be elected", cfg.NodeID)
		}
	}
	return cfg, nil
}

// stores are raft's log, stable and snapshot stores, as the node uses
// them.
type stores struct {
	logs   raft.LogStore // wrapped to time StoreLogs
	stable raft.StableStore
	snaps  raft.SnapshotStore
	space  *spaceCheck
	kind   string       // for the log: Config.LogStore, or "given"
	dir    string       // the directory they live in; empty when given
	close  func() error // closes what openStores opened, nothing when given
}

// openStores opens the stores under DataDir/raft, or takes cfg.Stores.
func openStores(cfg Config, m *metrics, log *slog.Logger) (stores, error) {
	if cfg.Stores.given() > 0 {
		return stores{
			logs:   timedLogStore{LogStore: cfg.Stores.Log, hist: m.storeLogs},
			stable: cfg.Stores.Stable,
			snaps:  cfg.Stores.Snapshots,
			space:  unmeasuredSpace(m, log), // not the node's files to watch
			kind:   "given",
			close:  func() error { return nil },
		}, nil
	}
	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return stores{}, fmt.Errorf("raftnode: %w", err)
	}
	space := newSpaceCheck(dir, cfg, m, log)
	space.measure()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, retainSnapshots, newHCLogger(log, "snapshot"))
	if err != nil {
		return stores{}, fmt.Errorf("raftnode: snapshot store: %w", err)
	}
	logs, stable, closeLogs, err := openLogStore(dir, cfg, snaps, space, log)
	if err != nil {
		return stores{}, err
	}
	return stores{
		logs:   timedLogStore{LogStore: logs, hist: m.storeLogs},
		stable: stable,
		snaps:  snaps,
		space:  space,
		kind:   cfg.LogStore,
		dir:    dir,
		close:  closeLogs,
	}, nil
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
		o := walOptions{segmentSize: cfg.WALSegmentSize, repair: cfg.RepairLog, logger: log, space: space}
		w, damage, err := openWAL(walDir, o)
		// Each repair cuts at the earliest damage; open again until the
		// log verifies, in case a cut left later damage in place.
		for tries := 0; err == nil && damage != nil; tries++ {
			var cut func() error
			if cut, err = repairWAL(w, damage, snaps, log); err == nil {
				if err = w.Close(); err == nil && cut != nil {
					err = cut()
				}
				if err == nil {
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
	var full *DiskFullError
	if errors.As(err, &ce) || errors.As(err, &full) {
		return err
	}
	if isNoSpace(err) {
		free, _, _ := freeBytes(dir)
		return &DiskFullError{Dir: dir, Free: free, Err: fmt.Errorf("the log preallocates segments of %s (WALSegmentSize) and %s is free: %w", bytesString(uint64(cfg.walSegmentSize())), bytesString(free), err)}
	}
	return fmt.Errorf("raftnode: open wal: %w", err)
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

		wasLeader := n.etcd.isLeader()
		errs := []error{n.etcd.close()}
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
	data, err := statemachine.EncodeFor(int(n.fsm.version.Load()), start.UnixNano(), cmd)
	if err != nil {
		return statemachine.Result{}, err
	}
	res, err := n.etcd.propose(ctx, "propose", data)
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
	if !n.etcd.isLeader() {
		return n.notLeader()
	}
	idx, err := n.etcd.readIndex(ctx)
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
	_, err := n.etcd.propose(ctx, "barrier", nil)
	return err
}

// AddVoter adds a node to the cluster as a voter, promotes a non-voter,
// or updates a voter's address. It must be called on the leader.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	return n.changeMembership(ctx, "add voter", raftpb.ConfChangeAddNode, id, addr)
}

// RemoveServer removes a node from the cluster. It must be called on the
// leader.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	return n.changeMembership(ctx, "remove server", raftpb.ConfChangeRemoveNode, id, "")
}

func (n *Node) changeMembership(ctx context.Context, op string, typ raftpb.ConfChangeType, id, addr string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.etcd.changeMembership(ctx, op, typ, memberInfo{ID: id, Addr: addr})
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
func (n *Node) IsLeader() bool { return n.etcd.isLeader() }

// Leader returns the leader's raft transport address and ID, empty when no
// leader is known.
func (n *Node) Leader() (addr string, id string) { return n.etcd.leaderInfo() }

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

// Stats returns raft's figures plus this node's applied index, for
// display and debugging.
func (n *Node) Stats() map[string]string {
	s := n.etcd.stats()
	s["fsm_applied_index"] = strconv.FormatUint(n.AppliedIndex(), 10)
	return s
}

// ID is this node's raft server ID.
func (n *Node) ID() string { return n.id }

// Addr is this node's raft address, where other nodes reach it: the
// advertised or bound TCP address, or its NodeID on a given Network.
func (n *Node) Addr() string { return n.etcd.self.Addr }

// Member is one server in the raft configuration.
type Member struct {
	ID      string
	Address string // raft peer address
	Voter   bool
	Leader  bool
}

// Members lists the servers in the latest applied configuration, with
// which of them leads as far as this node knows.
func (n *Node) Members() ([]Member, error) {
	if err := n.enter(); err != nil {
		return nil, err
	}
	defer n.inflight.Done()
	return n.etcd.membersList(), nil
}

// Engine names the consensus engine this node runs, what a joining node
// must run too.
func (n *Node) Engine() string { return EngineEtcd }
