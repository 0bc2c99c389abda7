// Package raftnode is Tenure's replicated log: the raft engine
// (go.etcd.io/raft/v3, the library etcd runs, and CockroachDB a fork
// of) applying committed entries to a statemachine.Machine, with its WAL
// in hashicorp/raft-wal segments (or raft-boltdb), its snapshots in
// CRC-checked snapshot files, and a peer transport of its own over TCP
// or the peer CA's mutual TLS. The files and the network can instead be
// given (Config.Stores, Config.Network): that is how a whole cluster
// runs in one process over a MemNetwork.
//
// Why this engine. A commit costs one disk write and a round trip: the
// leader sends new entries to the followers before it writes its own
// copy, and counts itself only once that write is durable (raft thesis
// §10.2.1); hashicorp/raft, which Tenure ran before, wrote and synced the
// leader's log before sending, so a commit cost two writes and a round
// trip in series (docs/benchmarks.md has the A/B: 1.6x one client's Lock
// +Unlock at a 1 ms disk and a 0.3 ms round trip). The raft engine also
// brings what a demanding operator expects of the protocol: pre-vote and
// check-quorum, ReadIndex reads that cost a heartbeat round shared by
// every concurrent reader, learners for joining nodes, ConfChangeV2 and
// leadership transfer. It leaves storage, transport and the apply loop
// to the caller; the engine type (engine.go and the files it names) is
// that loop.
//
// Why raft-wal rather than etcd's own wal package. raft-wal already had
// what a WAL here must have: a CRC on every batch checked on every open
// by a verifying segment filer (walcheck.go: a torn tail is dropped,
// damage is refused naming the file and offset, RepairLog cuts it off),
// and reopening in place after a full disk (walstore.go). etcd's wal
// would have meant writing all of that again, and pulling etcd's server
// module into the core's graph.
//
// # A torn write, or damage
//
// A crash can leave the newest batch half written: its sync never
// returned, so nothing in it was acknowledged, and the node drops it on
// its own. Any other failed check is damage to bytes that were synced,
// perhaps acknowledged, and the node refuses to start on it, naming the
// file, the offset and the entries at stake, until RepairLog accepts the
// loss (its log line lists the entries lost). The two are told apart by
// shape, since nothing durable records which batch was synced last: a
// segment is preallocated as zeros and a disk writes a 512-byte sector
// whole or not at all, so a torn batch is the last one, followed only by
// zeros, and either stops at a frame header of zeros or holds a whole
// sector of zeros that its checksum fails on. A frame header that is
// neither valid nor zero, a complete batch with a bad checksum and no
// sector of zeros, and a zeroed header with data after it are damage.
// So is a batch read back as zeros with whole batches after it (raft-wal
// writes a batch only once the one before it is synced: that one was
// synced, then lost) and a whole batch at another's place (each entry
// frame's own index must be its place's; raft-wal itself finds entries
// by place and never reads the index back). A batch whose first sectors
// never reached the disk, with nothing whole after it, is torn. The case
// told wrong needs two faults at once: a batch holding a sector of zeros
// of its own (a value of zeros) and then damaged would pass for torn.
// The case not seen at all is the newest synced batch lost with nothing
// after it: the log reads as whole and shorter (a member is caught by
// the leader's next heartbeat, loglost.go). walcheck.go has the rules.
//
// Entries are stored as raft-wal records
// whose data is the marshalled raftpb.Entry; the hard state is kept in
// the WAL's meta store; and an ENGINE file tells this format from the
// hashicorp engine's, whose single-node data dirs convert themselves at
// start (convert.go). raft-wal and the snapshot files implement
// hashicorp/raft's LogStore, StableStore and SnapshotStore interfaces,
// so those types appear where the files are opened and read
// (stores.go, storage.go); the words below are this package's. The
// files themselves are reached through DiskFiles (walfs.go): raft-wal's
// segments through a WALFS, raft-wal's VFS with the size and the cut
// that the verifying reader and the repair need beyond it, the meta
// store through raft-wal's MetaStore, the snapshots through a
// SnapshotStore; the zero value is the real files under DataDir/raft.
//
// # Words
//
// One word per idea, in names and comments alike:
//
//   - raft engine: go.etcd.io/raft/v3 and the loop this package runs
//     around it (type engine). In prose "etcd raft" when the library
//     itself is meant, never bare "etcd", which in Tenure names the etcd
//     v3 API the server serves; this package knows nothing of that API.
//   - hashicorp engine: hashicorp/raft, which Tenure ran before. Only the
//     conversion of its data dirs (convert.go) reads its formats as its
//     own.
//   - node: one Node, one process's member of the log; node ID its
//     Config.NodeID; raft ID the uint64 hash of it that raft uses.
//   - cluster: the set of nodes that replicate one log. Nothing else.
//   - member: a node the configuration lists, voter or learner. The API
//     says non-voter (AddNonvoter) for a learner; both mean a member that
//     receives the log and does not vote.
//   - configuration: raft's ConfState (voters, learners) with each
//     member's node ID and peer address (memberInfo), which raft has no
//     room for; what a configuration change (ConfChangeV2) changes and
//     membership.go keeps.
//   - peer: another member as the transport sees it; peer address where
//     it is dialed.
//   - Ready: one batch of raft's work; ReadyCore (readycore.go) holds the
//     order it is done in, and the Ready loop (ready.go) steps it.
//   - entry: a raftpb.Entry. Proposal: an entry this node appends and
//     waits for (propose.go); barrier: a proposal without a command.
//   - WAL: the entries on disk, in raft-wal segments, or in one boltdb
//     file when Config.LogStore is "boltdb". Its meta store keeps the
//     hard state.
//   - hard state: raft's HardState, term, vote and commit index.
//   - MemoryStorage, or the log in memory: raft's MemoryStorage, the
//     entries since the last compaction, which raft reads (memlog.go
//     counts their bytes).
//   - snapshot: the state at an index, with the configuration then;
//     snapshot files: the CRC-checked files they are written to on disk.
//   - compaction: dropping the entries a snapshot covers from the
//     MemoryStorage and the WAL; catch-up tail: the entries a compaction
//     keeps behind the snapshot, for followers that trail a little.
//   - state: the statemachine.Machine; applier: the code that owns it
//     and its lock (applier.go); apply: running committed entries on it.
//   - read index: raft's ReadIndex round, which a linearizable read
//     waits on (readindex.go).
//   - engine tag: the name of the raft engine and its peer protocol, sent
//     in every connection's hello. EngineEtcd, the name a joining node
//     gives, is the raft engine's too: "etcd" there is a wire value kept
//     as it was, not the etcd API.
//
// Why the boundary sits here. The state machine is pure and must stay so:
// it cannot read a clock or know whether it runs on a leader. Everything
// that does know lives in this package and nowhere else: stamping the
// leader's time into a command before it enters the log, ordering and
// durability (an acknowledged Propose is fsynced on a quorum), batching
// (the leader writes every proposal queued during a write with the next
// one fsync, and a commit batch is applied under one lock), snapshots,
// the bound on the log in memory, and the read-index protocol that makes
// Read linearizable. Above it, the lessor decides what
// to propose and when (it owns the leader-only timers), and the watch hub
// fans events out; both talk to the log only through Node, so neither
// needs to import raft, and this package imports neither of them.
//
// The engine's decisions that internal/sim must make as it does are
// exported as pure pieces, with no goroutine, clock or file of their
// own, which the engine calls too: RaftConfig (engine.go), FrameProposal
// and ParseProposal (propose.go), SplitMessages (readycore.go),
// DecodeCommand (applier.go), the catch-up rule after a damaged log
// (CatchUp, Members, CutDamage, CatchUpAfterCut, HandOverRequest,
// HandOvers and HandOverTarget in catchup.go) and LogLost (loglost.go).
// So is the order of the work around them: ReadyCore (readycore.go) does
// a Ready's work, stepped by its caller with its effects injected, and
// ApplyEntries (apply.go) is apply's rule for a batch of entries. The
// engine's goroutines are a thin driver over them (ready.go, apply.go);
// internal/sim is a second driver, on its own clock, network and disk,
// so that what it checks is this package's code and not a copy of it.
// Its log store is this package's too: OpenDisk and Disk (rawdisk.go)
// are the disk storage Open uses (raft-wal, the verifying reader, the
// repair and the catch-up point it records), over the DiskFiles the
// simulator keeps in memory (docs/testing.md, which lists what is not
// shared yet: ticks and received messages, when to snapshot, read-index
// rounds, and the disk under the files, which the simulator models).
//
// The Machine is never handed out: Read and ReadLocal lend it to a
// callback under the state read lock, because it is not safe for
// concurrent use and every apply mutates it in place.
//
// Caller's duties:
//   - Hold LockDataDir on DataDir from before Open until after Close
//     when another process might open it: the WAL waits forever for its
//     own file lock, without a word.
//   - Propose only on the leader; forward on *NotLeaderError; a
//     *DiskFullError means no node leads because this one's log is out
//     of space, and is for the client to see, not to retry. Treat
//     ErrLeadershipLost and context errors after proposing as "may have
//     been applied": commands that must not run twice should be made
//     idempotent by the state machine (e.g. naming a token or revision).
//   - Keep Config.Observer and Config.OnRestore short and non-blocking:
//     they run on the engine's apply goroutine with the state
//     write-locked, so they stall every apply and read. Hand events to a
//     buffer and return.
//   - Receive from LeaderChanges and, on true, call Barrier before acting
//     on the state as leader.
//   - Count LogMemoryBytes with the state's own bytes when bounding
//     memory: it is what the log holds in memory, up to about
//     Config.MaxLogMemoryBytes.
//   - Call Close, which waits for calls in flight and stops every
//     goroutine the node started.
package raftnode
