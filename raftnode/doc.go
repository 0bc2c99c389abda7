// Package raftnode is Tenure's replicated log: hashicorp/raft with a
// raft-wal (or raft-boltdb) log store, file snapshots and a TCP transport,
// applying committed entries to a statemachine.Machine. The transport and
// the stores can instead be given (Config.Transport, Config.Stores): that
// is how a whole cluster runs in one process over raft.InmemTransport,
// and the node then closes neither, since it did not open them.
//
// Why the boundary sits here. The state machine is pure and must stay so:
// it cannot read a clock or know whether it runs on a leader. Everything
// that does know lives in this package and nowhere else: stamping the
// leader's time into a command before it enters the log, ordering and
// durability (an acknowledged Propose is fsynced on a quorum), batching
// (the leader writes every queued proposal with one fsync, and the FSM
// applies a commit batch under one lock), snapshots, and the read-index
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
//     ErrLeadershipLost and context errors after enqueueing as "may have
//     been applied": commands that must not run twice should be made
//     idempotent by the state machine (e.g. naming a token or revision).
//   - Keep Config.Observer and Config.OnRestore short and non-blocking:
//     they run on raft's FSM goroutine with the state write-locked, so
//     they stall every apply and read. Hand events to a buffer and return.
//   - Receive from LeaderChanges and, on true, call Barrier before acting
//     on the state as leader.
//   - Call Close, which waits for calls in flight and stops every
//     goroutine the node started.
package raftnode
