// Package sim is a deterministic simulation of a whole Tenure cluster:
// N nodes built on the project's raft configuration and Ready order, its
// state machine and codec, on a simulated clock, network and disk, all
// driven by one seeded scheduler, with the invariants of the safety rules
// checked as the run goes. docs/testing.md says how to run it, what it
// found and what it does not cover yet.
//
// # Why the boundary sits here
//
// A real cluster test (internal/cluster, internal/proccluster) runs the
// real binary, but what it explores is chosen by the Go scheduler and
// the kernel: a failure found once may never come back, and a fault at
// the one instant that matters (a crash between a write and its sync, a
// vote request that arrives after the voter restarted) is luck. Here
// nothing runs on its own: no goroutine, no timer, no real clock, no
// file. One random source, seeded by the run's seed, decides every delay,
// loss, fault and client action, and one queue of events ordered by
// simulated time runs them, so a seed is a trace and a failing seed is a
// replay. That is bought by driving etcd raft's RawNode directly: the
// Ready loop in raftnode/ready.go is a goroutine around etcdraft.Node,
// which the simulation cannot step, so node.go mirrors it, naming for
// each piece the file it mirrors. What is the real code and what is a
// mirror is listed in docs/testing.md; the next step is the raftnode
// refactor described there, which would let this package run raftnode's
// own Ready handling.
//
// etcd raft draws its randomized election timeouts from crypto/rand.
// Run swaps crypto/rand.Reader for a seeded stream while it runs
// (rand.go), so Run must not be called concurrently with itself or with
// anything else that reads crypto/rand.
//
// # What a run checks
//
// At every step that could break them: at most one leader per term; a
// new leader's log holds every entry applied anywhere (leader
// completeness); each node applies in index order, and an index holds
// the same entry, and leaves the same revision, on every node for the
// whole run; grant tokens rise in log order and clients are told the
// token the log granted; no session expires before TTL after a heartbeat
// its client saw acknowledged; and after every step, at most one client
// trusts a grant of a lock by its own rule (DESIGN.md safety rule 5). At
// the end, after a heal phase: the leader still holds every committed
// entry, acknowledged writes survive, and the client histories are
// linearizable (porcupine, with internal/linearizability's models).
//
// A violation stops the run with the seed, the invariant, a readable
// tail of the trace, and the command that replays it.
package sim
