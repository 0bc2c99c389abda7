// Package raftnode is Tenure's replicated log: go.etcd.io/raft/v3 (the
// raft library etcd runs, and CockroachDB a fork of) applying committed
// entries to a statemachine.Machine, with its log in hashicorp/raft-wal
// segments (or raft-boltdb), snapshots in hashicorp/raft's file snapshot
// store, and a peer transport of its own over TCP or the peer CA's mutual
// TLS. The stores and the network can instead be given (Config.Stores,
// Config.Network): that is how a whole cluster runs in one process over a
// MemNetwork.
//
// Why this engine. A commit costs one disk write and a round trip: the
// leader sends new entries to the followers before it writes its own
// copy, and counts itself only once that write is durable (raft thesis
// §10.2.1); hashicorp/raft, which Tenure ran before, wrote and synced the
// leader's log before sending, so a commit cost two writes and a round
// trip in series (docs/benchmarks.md has the A/B: 1.6x one client's Lock
// +Unlock at a 1 ms disk and a 0.3 ms round trip). etcd raft also brings
// what a demanding operator expects of the protocol: pre-vote and
// check-quorum, ReadIndex reads that cost a heartbeat round shared by
// every concurrent reader, learners for joining nodes, ConfChangeV2 and
// leadership transfer. It leaves storage, transport and the apply loop to
// the caller; engine.go is that loop.
//
// Why raft-wal rather than etcd's own wal package. The log store already
// had what the issue asks of one: a CRC on every batch checked on every
// open by a verifying segment filer (walcheck.go: a torn tail is dropped,
// damage is refused naming the file and offset, RepairLog cuts it off),
// and reopening in place after a full disk (walstore.go). etcd's wal
// would have meant writing all of that again, and pulling etcd's server
// module into the core's graph. Entries are stored as raft-wal records
// whose data is the marshalled raftpb.Entry; the hard state (term and
// vote) is raft-wal's stable store; and an ENGINE file tells this format
// from the hashicorp engine's, whose single-node data dirs convert
// themselves at start (prepare.go).
//
// Why the boundary sits here. The state machine is pure and must stay so:
// it cannot read a clock or know whether it runs on a leader. Everything
// that does know lives in this package and nowhere else: stamping the
// leader's time into a command before it enters the log, ordering and
// durability (an acknowledged Propose is fsynced on a quorum), batching
// (the leader writes every proposal queued during a write with the next
// one fsync, and a commit batch is applied under one lock), snapshots, and the read-index
// protocol that makes Read linearizable. Above it, the lessor decides what
// to propose and when (it owns the leader-only timers), and the watch hub
// fans events out; both talk to the log only through Node, so neither
// needs to import raft, and this package imports neither of them.
//
// The Machine is never handed out: Read and ReadLocal lend it to a
// callback under the state read lock, because it is not safe for
// concurrent use and every apply mutates it in place.
//
// Caller's duties:
//   - Hold LockDataDir on DataDir from before Open until after Close
//     when another process might open it: the log store waits forever
//     for its own file lock, without a word.
//   - Propose only on the leader; forward on *NotLeaderError; a
//     *DiskFullError means no node leads because this one's log is out
//     of space, and is for the client to see, not to retry. Treat
//     ErrLeadershipLost and context errors after proposing as "may have
//     been applied": commands that must not run twice should be made
//     idempotent by the state machine (e.g. naming a token or revision).
//   - Keep Config.Observer and Config.OnRestore short and non-blocking:
//     they run on the engine's apply goroutine with the state
//     write-locked, so
//     they stall every apply and read. Hand events to a buffer and return.
//   - Receive from LeaderChanges and, on true, call Barrier before acting
//     on the state as leader.
//   - Call Close, which waits for calls in flight and stops every
//     goroutine the node started.
package raftnode
