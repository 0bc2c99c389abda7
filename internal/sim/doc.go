// Package sim is a deterministic simulation of a whole Tenure cluster:
// N nodes built on the project's raft configuration and Ready order, its
// state machine and codec, and its lessor (driven by the scheduler), on a
// simulated clock, network and disk, all driven by one seeded scheduler,
// with the invariants of the safety rules checked as the run goes. docs/testing.md says how to run it, what it
// found and what it does not cover yet.
//
// # Why the boundary sits here
//
// A real cluster test (internal/cluster, internal/proccluster) runs the
// real binary, but what it explores is chosen by the Go scheduler and
// the kernel: a failure found once may never come back, and a fault at
// the one instant that matters (a crash between a write and its sync, a
// vote request that arrives after the voter restarted) is luck. Here
// nothing runs on its own: no goroutine (raft-wal's segment rotation
// runs on one of its own only while raftnode.Disk.Append waits for it),
// no timer, no real clock, no real file. One random source, seeded by the run's seed, decides every delay,
// loss, fault and client action, and one queue of events ordered by
// simulated time runs them, so a seed is a trace and a failing seed is a
// replay. That is bought by driving etcd raft's RawNode directly: the
// Ready loop in raftnode/ready.go is a goroutine around etcdraft.Node,
// which the simulation cannot step, so node.go drives RawNode itself.
// What it drives it with is raftnode's own code: each Ready's work is
// done by raftnode.ReadyCore, the order the engine's Ready loop steps
// (node.go calls its steps from the scheduler, and a Ready's write waits
// in the simulated disk's page cache until a later event syncs it),
// each batch of committed entries is applied by raftnode.ApplyEntries,
// and raftnode's pure decisions (its raft configuration, proposal
// framing, the split of a Ready's messages around the write, the
// apply-time decode, the catch-up rule and the lost-log proof) are
// called as they are. The log store is raftnode's own disk storage
// (raftnode.OpenDisk and Disk: raft-wal, the verifying reader, the
// repair) over files in the simulator's memory (disk.go), so that
// what is modelled is only the disk: its page cache, what a crash
// keeps, and the damage it does. When to snapshot and the server's
// paths are still written again here. What is the real code and what
// is a mirror is listed in docs/testing.md, with what is left to make
// real.
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
// its client saw acknowledged; each watch client receives each KV
// revision's events once, in order, none missing, as committed (on the
// real watch.Hub and keyfeed.Feed, watch.go); and after every step, at
// most one client trusts a grant of a lock by its own rule (DESIGN.md
// safety rule 5). At
// the end, after a heal phase: the leader still holds every committed
// entry, acknowledged writes survive, and the client histories are
// linearizable (porcupine, with internal/linearizability's models).
//
// A violation stops the run with the seed, the invariant, a readable
// tail of the trace, and the command that replays it.
package sim
