// Package statemachine is Tenure's replicated state: sessions, leases with
// fencing tokens, and keys, advanced by commands and observed as events.
//
// The package is pure. It imports no raft, no network and no clock: every
// timestamp it stores arrives inside the command (Apply's now argument),
// and every limit that depends on state (waiters per lease, sessions per
// identity) arrives inside the command too, so that every replica applying
// the same log reaches the same state byte for byte.
//
// Caller's duties:
//   - Apply commands in log order, one at a time. A Machine is not safe for
//     concurrent use; the replication layer guards it with a lock and lets
//     readers in between applies.
//   - Stamp now on the leader before the command enters the log.
//   - Deliver the events of each Result to watchers in order. Every event
//     carries its own revision; revisions are contiguous.
//   - Decide expiry outside: the leader's lessor proposes ExpireSessions,
//     ExpireKeys and EndLockDelays with the epoch of its leadership. The
//     machine ignores proposals from an older epoch, so a deposed leader's
//     late expiry can never shorten a TTL.
//   - Attach the proposer's Actor to every command that acts on a session
//     or a grant (CloseSession, Acquire, Release, SetValue, CancelWait,
//     and Put or CompareAndSwap with a session). The machine, not the API
//     edge, decides ownership: it refuses the command with ErrNotOwner
//     when the session's or grant's identity is not one the actor may
//     use, at the moment the command is applied, so that a command aimed
//     at an ID that did not exist when the edge checked it meets the
//     session it will really act on. A nil Actor (a node acting for
//     itself) is not checked.
package statemachine
