package raftnode

// Config and its defaults: what a caller may set and the checks run
// before anything is opened, so that bad input is refused with a clear
// error and nothing on disk changes.

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurehq/tenure/statemachine"
)

// Config configures a Node. The zero value of every field but DataDir and
// PeerAddr has a usable default; a node given its stores and network
// (Stores, Network) needs neither.
type Config struct {
	NodeID    string // raft server ID, default "node1"
	DataDir   string // holds the WAL, its meta store (the hard state) and the snapshot files under DataDir/raft
	PeerAddr  string // TCP bind address of the raft transport, e.g. "127.0.0.1:7481"
	Advertise string // address other nodes dial; default the bound PeerAddr
	LogStore  string // the WAL's kind under DataDir: "wal" (default, hashicorp/raft-wal segments) or "boltdb" (raft-boltdb/v2)
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
	ElectionTimeout time.Duration
	// SnapshotThreshold is how many entries are applied between
	// snapshots; zero = 8192. MaxLogMemoryBytes may snapshot sooner.
	SnapshotThreshold uint64
	// CatchUpEntries is how many log entries a snapshot leaves behind it,
	// for followers that trail by less to catch up from the log; one
	// further behind (a node down for long, a new one) is sent the
	// snapshot instead. Zero = 10240.
	CatchUpEntries uint64
	// MaxLogMemoryBytes bounds in bytes the log entries raft holds in
	// memory (its MemoryStorage, which Node.LogMemoryBytes reports):
	// once they weigh that much, the node snapshots its state and
	// compacts the log behind the snapshot, keeping a catch-up tail of at
	// most half of it. It works beside the counts, whichever binds first:
	// a snapshot every SnapshotThreshold entries or at MaxLogMemoryBytes,
	// a tail of at most CatchUpEntries entries and MaxLogMemoryBytes/2
	// bytes, so that small entries are bounded by the counts and large
	// ones by the bytes. It also bounds what raft keeps on the leader
	// beyond the log: its uncommitted tail (MaxUncommittedEntriesSize;
	// a proposal past it is refused as during a leadership transfer, a
	// *NotLeaderError with no leader named) and what it has in flight to
	// each follower (MaxInflightBytes, a quarter of it). Zero means
	// 64 MiB; less than 1 MiB, raft's largest append message, is
	// refused.
	MaxLogMemoryBytes int64

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // may be nil: metrics are then not exported

	// Observer is called after every applied command that produced events,
	// or changed etcd's auth store (Result.AuthRevision), with that
	// command's events, in log order, on the apply goroutine,
	// while the node's state lock is held for writing. It must not block
	// and must not call back into the Node. It also sees entries replayed
	// from the log at startup. m is the state after the command, to read
	// (never change) while the lock is held.
	Observer func(m *statemachine.Machine, events []statemachine.Event)
	// OnRestore is called (under the write lock) after the state was
	// replaced by a snapshot restore, with its revision and the state
	// to read (never change) while the lock is held, so the watch hub
	// can reset and what the server derives from the state start again.
	// m is nil when the node runs a state of another type (this
	// package's tests do).
	OnRestore func(revision int64, m *statemachine.Machine)
}

// Stores are what a node keeps on disk, for a node that is given them
// rather than opening its own under DataDir (Config.Stores): the WAL
// (Log), its meta store (Stable, which keeps the hard state) and the
// snapshot files (Snapshots), as hashicorp/raft's interfaces, which
// raft-wal implements. Set all three or none: the WAL and the hard state
// must agree on the term the log was written in, and the snapshots on
// the index it starts after.
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
	// The log's bounds in memory: see Config.SnapshotThreshold,
	// CatchUpEntries and MaxLogMemoryBytes.
	defaultSnapshotThreshold = 8192
	defaultCatchUpEntries    = 10240
	defaultMaxLogMemoryBytes = 64 << 20
	// maxSizePerMsg is raft's MaxSizePerMsg: the most bytes of entries
	// one append message carries (one entry always goes, however
	// large), which also bounds the entries one Ready hands to apply.
	maxSizePerMsg   = 1 << 20
	retainSnapshots = 2
)

// The engine's name, as nodes exchange it when one joins another
// (JoinRequest.engine): a node of the other engine (hashicorp/raft, which
// builds before issue 24 ran, and which says nothing) speaks another peer
// protocol and must never join. EngineEtcd names the raft engine (etcd
// raft), not the etcd API; the names and values stay as they are on the
// wire.
const (
	EngineHashicorp = "hashicorp"
	EngineEtcd      = "etcd"
)

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
	switch cfg.MaxLogMemoryBytes = cmp.Or(cfg.MaxLogMemoryBytes, defaultMaxLogMemoryBytes); {
	case cfg.MaxLogMemoryBytes < 0:
		return cfg, fmt.Errorf("raftnode: MaxLogMemoryBytes %d is negative", cfg.MaxLogMemoryBytes)
	case cfg.MaxLogMemoryBytes < maxSizePerMsg:
		return cfg, fmt.Errorf("raftnode: MaxLogMemoryBytes %d is below %d, raft's largest append message: the node would snapshot after nearly every entry", cfg.MaxLogMemoryBytes, maxSizePerMsg)
	}
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
