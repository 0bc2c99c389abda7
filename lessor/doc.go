// Package lessor is the leader's keeper of deadlines: sessions renewed by
// heartbeats, keys with a TTL of their own, lock-delays, and idle lease
// records waiting to be garbage-collected. It decides that
// something has expired and proposes the expiry; the state machine removes
// it, and the events that removal emits make the lessor forget it.
//
// # Why the boundary sits here
//
// Deciding that a TTL has passed needs a clock, and the state machine has
// none: every replica must reach the same state from the same log, so an
// expiry enters the log as a command from the one node that timed it.
// Heartbeats stay out of the log: 100,000 sessions beating every TTL/3
// would be tens of thousands of fsynced entries a second that change
// nothing. Renewals therefore live only in the leader's memory, which is why
// the lessor runs only on the leader and starts afresh at each promotion. A
// new leader cannot know when the old one last heard from a session, so it
// gives every session a full TTL plus an election timeout from the moment
// it takes over: a failover may lengthen a lease, never shorten it.
//
// # Why a short overlap of two leaders is still safe
//
// A deposed leader may not know yet; until it is demoted it acknowledges
// heartbeats and proposes expiries. Neither can cut a TTL short:
//
//   - Its expiries carry its epoch. The new leader commits a NewEpoch entry
//     before it times anything, and the state machine ignores expiries of
//     older epochs. One committed before NewEpoch was decided while the old
//     leader was the only place a heartbeat could land (the new one refuses
//     them until promoted), so it rested on the latest renewals, and its
//     effect is in the state the new leader reads at promotion.
//   - A heartbeat it acknowledges after the new leader's promotion p is
//     unknown to the new leader. The client trusts that heartbeat only until
//     its send time s + 0.75 TTL (safety rule 5 in DESIGN.md); the new
//     leader allows until p + TTL + the election timeout. The old leader
//     steps down within its leader lease timeout of losing its quorum, well
//     before a successor is elected and promoted, so s − p stays under the
//     election timeout and the client gives up first. That needs the node
//     to run: one that did not (stopped, paused, starved) for longer than
//     an election timeout refuses heartbeats for two more, until raft has
//     ended or confirmed its leadership (stall.go).
//
// TTL is thus a lower bound on the server: an expiry may come late, never
// early.
//
// # Why collections are timed differently
//
// Deleting an idle lease record is no safety matter: nobody holds it or
// waits for it, the deletion names the revision at which it went idle (any
// change since makes it a no-op), and fencing tokens are global revisions,
// so a record made again gets higher ones. A new leader therefore dates a
// collection from the idle time logged in the record, not from its own
// promotion: hour-long gc_after values would otherwise restart at every
// failover, and a cluster that fails over often would keep records
// forever. A proposer that cannot collect yet (the cluster runs a version
// without it) returns ErrPostponed, and the lessor asks again later.
//
// # Caller's duties
//
//   - Call Promote after a barrier and a NewEpoch entry, with deadlines read
//     from the state with no apply in between.
//   - Call Demote as soon as leadership is lost; the overlap argument above
//     assumes the lag is well under an election timeout.
//   - Pass every applied command's events to Observe, in log order.
//   - Return from a Proposer method only once the command is applied (or
//     with an error): the lessor re-proposes only after an error.
//   - Call Stop when finished.
package lessor
