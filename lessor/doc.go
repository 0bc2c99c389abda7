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
//   - It acknowledges a heartbeat only while it holds a leader lease
//     (Config.Leased; raftnode/lease.go): a quorum confirmed its
//     leadership in a round begun at most a little less than an election
//     timeout ago, and each voter of that quorum refuses to vote for
//     another candidate for an election timeout after it heard the round.
//     No successor can be elected, let alone promoted, while the lease
//     holds, so every heartbeat it acknowledges precedes the promotion p
//     of the next leader, which allows the session until p + TTL + the
//     election timeout, later than the send time + TTL the client counts
//     on. Raft may not tell the old leader for seconds that it was
//     deposed (a partition, a pause); the lease runs out by itself. (It
//     replaced an argument from the old leader's own step-down, which
//     assumed it ran and heard from its followers; internal/sim seed
//     100530 broke it.) A node that did not run for longer than an
//     election timeout postpones expiries for two more (stall.go), so
//     that heartbeats queued while it was stopped are not outrun by
//     expiries timed in the gap.
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
// # Two ways to run it
//
// New starts two goroutines: the expiry loop sleeps until the earliest
// deadline, takes what is due and proposes it through the Proposer,
// blocking until it applies; the pulse of stall.go notes the time. A
// caller that must run everything itself (internal/sim, one goroutine on
// a simulated clock) uses NewDriven instead, which starts neither, and
// drives the same methods the goroutines call: Due for what is due at
// Config.Now and how long until more is, Proposed for each outcome,
// Pulse for the pulse. The goroutines are only a driver over those
// methods, so the rules above hold in both forms.
//
// # Caller's duties
//
//   - Call Promote after a barrier and a NewEpoch entry, with deadlines read
//     from the state with no apply in between.
//   - Call Demote as soon as leadership is lost; until then Config.Leased
//     must report the lease as raft's quorum last confirmed it.
//   - Pass every applied command's events to Observe, in log order.
//   - Return from Proposer.Propose (or, driving it, call Proposed) only
//     once the command is applied, or with an error: the lessor
//     re-proposes only after an error.
//   - Driving it: call Due when the wait it last returned has passed and
//     soon after the wake function is called, propose the Command of
//     each Expiry, and report every one with Proposed (one left unreported
//     is lost until the next promotion, unless its term has ended); call
//     Pulse several times an election timeout while the node runs.
//   - Call Stop when finished.
package lessor
