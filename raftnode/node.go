package raftnode

import (
	"context"
	"crypto/tls"
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
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// Config configures a Node. The zero value of every field but DataDir and
// PeerAddr has a usable default; a node given its stores and transport
// (Stores, Transport) needs neither.
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

	// Transport, when set, carries raft's RPCs instead of a TCP transport
	// bound on PeerAddr, which must then be empty, as must Advertise: the
	// node's address is Transport.LocalAddr(). Tests pass a
	// raft.InmemTransport to run a cluster in one process. The node never
	// closes it, not even through raft's Shutdown (which closes any
	// transport it can): whoever made it closes it, after Close.
	Transport raft.Transport
	// Engine picks the consensus engine: EngineHashicorp (hashicorp/raft,
	// the default) or EngineEtcd (go.etcd.io/raft/v3). A data dir is
	// written by one engine and refused by the other.
	Engine string
	// Network, with EngineEtcd, carries raft's messages instead of a TCP
	// transport, as Transport does for the hashicorp engine: the node's
	// address is its NodeID on the network. The node does not own it.
	Network *MemNetwork
	// Stores, when set, are used instead of the stores the node would open
	// under DataDir. LogStore, WALSegmentSize, MinFreeBytes,
	// DiskCheckInterval, FreeSpace and RepairLog then do not apply, since
	// they describe those files, and DataDir may be empty. As with
	// Transport, the node never closes them.
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
	// CatchUpEntries is how many log entries a snapshot leaves behind it,
	// for followers that trail by less to catch up from the log; one
	// further behind (a node down for long, a new one) is sent the
	// snapshot instead. Zero = raft's 10240.
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
	id       string      // this node's raft server ID
	etcd     *etcdEngine // set when Config.Engine is EngineEtcd; raft and trans are then nil
	raft     *raft.Raft
	fsm      *fsm
	trans    raft.Transport
	space    *spaceCheck
	metrics  *metrics
	log      *slog.Logger
	election time.Duration
	peerTLS  *tls.Config // nil: raft traffic is plain TCP

	// closeTransport and closeStores close what open opened; they do
	// nothing for a transport or stores the caller passed in.
	closeTransport, closeStores func() error

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
// state it forms a one-voter cluster (or cfg.InitialVoters) and soon
// elects a leader; otherwise it rejoins the cluster recorded in its log,
// or waits to be added.
func Open(cfg Config) (*Node, error) {
	return open(cfg, func() state { return statemachine.New() })
}

// open runs the steps of Open in order, undoing what earlier steps opened
// when a later one fails.
func open(cfg Config, newState func() state) (n *Node, err error) {
	if cfg.Engine == EngineEtcd {
		return openEtcdNode(cfg, newState)
	}
	if cfg.Stores.given() == 0 && cfg.DataDir != "" {
		dir := filepath.Join(cfg.DataDir, "raft")
		if engine, err := readEngine(dir); err != nil {
			return nil, err
		} else if engine == engineEtcd {
			return nil, fmt.Errorf("%w: %s holds the etcd engine's state, and this node runs the hashicorp engine", ErrOtherEngine, dir)
		}
	}
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "raft", "node", cfg.NodeID)
	rc, err := raftConfig(cfg, log)
	if err != nil {
		return nil, err
	}
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

	st, err := openStores(cfg, m, log)
	if err != nil {
		return nil, err
	}
	undo = append(undo, st.close)
	trans, err := openTransport(cfg, log)
	if err != nil {
		return nil, err
	}
	undo = append(undo, trans.close)
	newScratchFSM := func() raft.FSM { return &fsm{st: newState(), newState: newState, log: log, metrics: m} }
	if err := bootstrapOrRecover(cfg, rc, st, trans, newScratchFSM, log); err != nil {
		return nil, err
	}
	return start(cfg, rc, newState, st, trans, m, log)
}

// withDefaults checks that cfg names its stores and transport one way
// each, and fills in the defaults.
func (cfg Config) withDefaults() (Config, error) {
	switch given := cfg.Stores.given(); {
	case given != 0 && given != 3:
		return cfg, errors.New("raftnode: Stores needs all of Log, Stable and Snapshots, or none")
	case given == 0 && cfg.DataDir == "":
		return cfg, errors.New("raftnode: DataDir is required")
	}
	switch {
	case cfg.Engine != "" && cfg.Engine != EngineHashicorp && cfg.Engine != EngineEtcd:
		return cfg, fmt.Errorf("raftnode: unknown Engine %q (want %q or %q)", cfg.Engine, EngineHashicorp, EngineEtcd)
	case cfg.Network != nil && (cfg.Engine != EngineEtcd || cfg.PeerAddr != "" || cfg.Advertise != ""):
		return cfg, errors.New("raftnode: Network is for the etcd engine, with PeerAddr and Advertise empty")
	case cfg.Network != nil:
	case cfg.Transport == nil && cfg.PeerAddr == "":
		return cfg, errors.New("raftnode: PeerAddr is required")
	case cfg.Transport != nil && (cfg.PeerAddr != "" || cfg.Advertise != ""):
		return cfg, errors.New("raftnode: PeerAddr and Advertise must be empty when a Transport is given: its LocalAddr is the node's address")
	}
	if cfg.NodeID == "" {
		cfg.NodeID = defaultNodeID
	}
	if cfg.LogStore == "" {
		cfg.LogStore = "wal"
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

// raftConfig translates cfg into raft's configuration. start sets
// NotifyCh, which only the running node reads.
func raftConfig(cfg Config, log *slog.Logger) (*raft.Config, error) {
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
	if cfg.CatchUpEntries > 0 {
		rc.TrailingLogs = cfg.CatchUpEntries
	}
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}
	return rc, nil
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

// transport is raft's transport, as the node uses it.
type transport struct {
	// raft is what raft is handed, never a wrapper of it: raft finds
	// pre-vote support and Close by asserting interfaces on it.
	raft  raft.Transport
	close func() error // closes what openTransport opened, nothing when given
}

// openTransport binds a TCP transport on PeerAddr, or takes
// cfg.Transport.
func openTransport(cfg Config, log *slog.Logger) (transport, error) {
	if cfg.Transport != nil {
		return transport{raft: borrow(cfg.Transport), close: func() error { return nil }}, nil
	}
	var advertise net.Addr
	if cfg.Advertise != "" {
		var err error
		if advertise, err = net.ResolveTCPAddr("tcp", cfg.Advertise); err != nil {
			return transport{}, fmt.Errorf("raftnode: advertise address: %w", err)
		}
	}
	if cfg.PeerTLS != nil {
		stream, err := listenTLS(cfg.PeerAddr, advertise, cfg.PeerTLS)
		if err != nil {
			return transport{}, fmt.Errorf("raftnode: transport: %w", err)
		}
		t := raft.NewNetworkTransportWithLogger(stream, transportPool, transportTimeout, newHCLogger(log, "transport"))
		return transport{raft: t, close: func() error { t.CloseStreams(); return t.Close() }}, nil
	}
	t, err := raft.NewTCPTransportWithLogger(cfg.PeerAddr, advertise, transportPool, transportTimeout, newHCLogger(log, "transport"))
	if err != nil {
		return transport{}, fmt.Errorf("raftnode: transport: %w", err)
	}
	return transport{raft: t, close: func() error { t.CloseStreams(); return t.Close() }}, nil
}

// borrow hides a given transport's Close from raft, whose Shutdown closes
// any transport that has one: the node did not open it, so closing it is
// its owner's business. Pre-vote support, which raft also detects by
// interface, stays visible.
func borrow(t raft.Transport) raft.Transport {
	if pv, ok := t.(raft.WithPreVote); ok {
		return borrowedPreVoteTransport{t, pv}
	}
	return borrowedTransport{t}
}

type borrowedTransport struct{ raft.Transport }

type borrowedPreVoteTransport struct {
	raft.Transport
	raft.WithPreVote
}

// bootstrapOrRecover prepares the stores before raft starts, while they
// can be read and written without racing it: ForceNewCluster and the
// membership check (reconcileConfiguration), then, with Bootstrap and no
// state yet, the first configuration.
func bootstrapOrRecover(cfg Config, rc *raft.Config, st stores, trans transport, newScratchFSM func() raft.FSM, log *slog.Logger) error {
	if err := reconcileConfiguration(cfg, rc, st.logs, st.stable, st.snaps, trans.raft, newScratchFSM, log); err != nil {
		return err
	}
	if !cfg.Bootstrap {
		return nil
	}
	exists, err := raft.HasExistingState(st.logs, st.stable, st.snaps)
	if err != nil {
		return fmt.Errorf("raftnode: inspect state: %w", err)
	}
	if exists {
		return nil
	}
	conf, err := initialConfiguration(cfg, trans.raft.LocalAddr())
	if err != nil {
		return err
	}
	if err := raft.BootstrapCluster(rc, st.logs, st.stable, st.snaps, trans.raft, conf); err != nil {
		return fmt.Errorf("raftnode: bootstrap: %w", err)
	}
	return nil
}

// initialConfiguration is the configuration a bootstrapping node writes:
// cfg.InitialVoters, or this node alone, with this node at self, the
// transport's address (the bound port when PeerAddr ends in :0).
func initialConfiguration(cfg Config, self raft.ServerAddress) (raft.Configuration, error) {
	if len(cfg.InitialVoters) == 0 {
		return raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: self}}}, nil
	}
	var conf raft.Configuration
	for _, p := range cfg.InitialVoters {
		addr := raft.ServerAddress(p.Address)
		if p.ID == cfg.NodeID {
			if addr != "" && addr != self {
				// Peers would dial an address nobody answers on.
				return conf, fmt.Errorf("raftnode: InitialVoters lists this node %s at %s, but its address is %s", p.ID, p.Address, self)
			}
			addr = self
		}
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: addr})
	}
	return conf, nil
}

// start runs raft on the prepared stores and transport, and the node's own
// goroutines.
func start(cfg Config, rc *raft.Config, newState func() state, st stores, trans transport, m *metrics, log *slog.Logger) (*Node, error) {
	notifyCh := make(chan bool, 1)
	rc.NotifyCh = notifyCh
	f := &fsm{
		st:        newState(),
		newState:  newState,
		observer:  cfg.Observer,
		onRestore: cfg.OnRestore,
		log:       log,
		metrics:   m,
	}
	r, err := raft.NewRaft(rc, f, st.logs, st.stable, st.snaps, trans.raft)
	if err != nil {
		return nil, fmt.Errorf("raftnode: start raft: %w", err)
	}
	n := &Node{
		id:             cfg.NodeID,
		raft:           r,
		fsm:            f,
		trans:          trans.raft,
		closeTransport: trans.close,
		closeStores:    st.close,
		space:          st.space,
		metrics:        m,
		log:            log,
		election:       rc.ElectionTimeout,
		peerTLS:        cfg.PeerTLS,
		notifyCh:       notifyCh,
		leaderCh:       make(chan bool, 1),
		shutdownCh:     make(chan struct{}),
	}
	n.wg.Add(1)
	go n.watchLeader()
	if st.dir != "" {
		n.wg.Add(1)
		go n.watchSpace(cfg.DiskCheckInterval)
	}
	log.Info("raft node open", "addr", string(trans.raft.LocalAddr()), "log_store", st.kind, "dir", st.dir)
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
// down and closes the transport and stores it opened, but not those given
// in Config, whose owner closes them after Close returns. It is safe to
// call twice; the second call returns the first call's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		n.mu.Unlock()
		n.inflight.Wait()

		var errs []error
		if n.etcd != nil {
			wasLeader := n.etcd.isLeader()
			errs = append(errs, n.etcd.close())
			if wasLeader {
				n.publishLeader(false)
			}
			n.metrics.isLeader.Set(0)
		} else {
			errs = append(errs, n.raft.Shutdown().Error())
		}
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
// instead while no node leads because this node's log ran out of space. A context error, ErrLeadershipLost or ErrClosed after the
// entry was enqueued mean the outcome is unknown: the entry may still
// commit.
func (n *Node) Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	if err := n.enter(); err != nil {
		return statemachine.Result{}, err
	}
	defer n.inflight.Done()
	if n.etcd != nil {
		start := time.Now()
		data, err := statemachine.Encode(start.UnixNano(), cmd)
		if err != nil {
			return statemachine.Result{}, err
		}
		res, err := n.etcd.propose(ctx, "propose", data)
		if err == nil {
			n.metrics.propose.Observe(time.Since(start).Seconds())
		}
		return res, err
	}
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

	if n.etcd != nil {
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
	if n.etcd != nil {
		_, err := n.etcd.propose(ctx, "barrier", nil)
		return err
	}
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

// AddVoter adds a node to the cluster as a voter, promotes a non-voter,
// or updates a voter's address. It must be called on the leader.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	if n.etcd != nil {
		return n.etcdMembership(ctx, "add voter", raftpb.ConfChangeAddNode, id, addr)
	}
	return n.changeMembership(ctx, "add voter", func(timeout time.Duration) raft.Future {
		return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout)
	})
}

// RemoveServer removes a node from the cluster. It must be called on the
// leader.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if n.etcd != nil {
		return n.etcdMembership(ctx, "remove server", raftpb.ConfChangeRemoveNode, id, "")
	}
	return n.changeMembership(ctx, "remove server", func(timeout time.Duration) raft.Future {
		return n.raft.RemoveServer(raft.ServerID(id), 0, timeout)
	})
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
	case errors.Is(err, raft.ErrLeadershipTransferInProgress):
		// Refused at enqueue, so never appended: as good as not leader,
		// which is what this node is about to be.
		return &NotLeaderError{}
	case errors.Is(err, raft.ErrLeadershipLost):
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

// notLeader is the error for a call that needs the leader: a
// *NotLeaderError, or the *DiskFullError that keeps this node from
// leading while no other leads.
func (n *Node) notLeader() error {
	addr, id := n.Leader()
	if id == "" || string(id) == n.id {
		if err := n.LogFull(); err != nil {
			return err
		}
	}
	return &NotLeaderError{Leader: string(addr), LeaderID: string(id)}
}

// IsLeader reports whether this node believes it is the leader. The
// belief can be stale by up to the leader lease; Read and Propose confirm
// it with a quorum.
func (n *Node) IsLeader() bool {
	if n.etcd != nil {
		return n.etcd.isLeader()
	}
	return n.raft.State() == raft.Leader
}

// Leader returns the leader's raft transport address and ID, empty when no
// leader is known.
func (n *Node) Leader() (addr string, id string) {
	if n.etcd != nil {
		return n.etcd.leaderInfo()
	}
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
	var s map[string]string
	if n.etcd != nil {
		s = n.etcd.stats()
	} else {
		s = n.raft.Stats()
	}
	s["fsm_applied_index"] = strconv.FormatUint(n.AppliedIndex(), 10)
	return s
}

// ID is this node's raft server ID.
func (n *Node) ID() string { return n.id }

// Addr is this node's raft address, where other nodes reach it: the
// advertised or bound TCP address, or the given transport's LocalAddr.
func (n *Node) Addr() string {
	if n.etcd != nil {
		return n.etcd.self.Addr
	}
	return string(n.trans.LocalAddr())
}

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
	if n.etcd != nil {
		return n.etcd.membersList(), nil
	}
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
