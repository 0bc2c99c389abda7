package raftnode

import (
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// # Why a leader keeps a lease
//
// A leader answers a session's heartbeat from its own memory (package
// lessor), with no log entry and no round to the followers. That answer
// is only right while no other leader can have been elected: a client
// trusts it for most of a TTL, and a new leader times the session from
// its own promotion, unaware of the renewal. Raft does not tell a leader
// that it was deposed until a message of the new term reaches it, which a
// partition or a pause can put off for seconds (internal/sim seed 100530:
// a leader stopped for 0.97 s, just under the election timeout its pulse
// guards, was deposed meanwhile by followers that had already gone long
// without its messages, and renewed a session 1.1 s into its successor's
// term).
//
// So the leader keeps a lease, as Chubby's master does: the time until
// which no other leader can be elected, learnt from a quorum. A ReadIndex
// round started at s and confirmed proves that a quorum of voters
// received this leader's heartbeat at or after s, still in its term. With
// check-quorum, each of them then refuses to vote for another candidate
// for an election timeout of its own ticks (etcd raft's "in lease" rule),
// and any new leader needs one of their votes. That timeout counts ticks,
// and a follower's ticker that was held up delivers one tick late and the
// next on time, so the refusal lasts at least electionTicks−2 ticks; the
// lease is three ticks short of the election timeout, leaving a tick for
// the two clocks' rates. A heartbeat is answered only while the lease
// holds, and rounds are started to renew it well before it ends: a tick
// after the last began, once half of it is gone.
//
// A leadership transfer is the one election that ignores the followers'
// leases: the transferee campaigns at once when told to. A leader that
// starts one voids its lease for two election timeouts (raft gives up a
// transfer after one; the other covers a late TimeoutNow message), and no
// round begun in that time counts.
//
// A leader that is its configuration's one voter needs no lease: no
// other node can be elected without its vote, which a leader never gives.
// It holds one as long as it leads, so that a single node whose Ready
// loop a slow disk or a busy machine holds up for longer than the lease
// (the round needs it) does not refuse heartbeats nobody else could take.
//
// The lease is a pure piece, stepped with the caller's clock, so that the
// engine and internal/sim keep it by the same code.

// LeaderLease is a leader's knowledge of how long no other leader can be
// elected. Its methods are safe for concurrent use; Held is lock-free, for
// the heartbeat path.
type LeaderLease struct {
	length time.Duration // how long a confirmed round holds the lease
	tick   time.Duration
	base   time.Time

	until atomic.Int64 // ns after base; the lease holds before it

	mu         sync.Mutex
	term       uint64
	rounds     []leaseRound // begun in this term and not confirmed, in start order
	lastBegin  int64        // ns after base of the last round begun; 0: none this term
	voidBefore int64        // a round begun before this does not count
}

type leaseRound struct {
	id    uint64
	start int64
}

// maxLeaseRounds bounds the unconfirmed rounds kept: a leader that has
// lost its quorum begins one a tick until check-quorum steps it down.
const maxLeaseRounds = 64

// NewLeaderLease returns a lease for a node with raft's election timeout
// of electionTicks ticks of tick, not held; now is the caller's clock.
func NewLeaderLease(tick time.Duration, now time.Time) *LeaderLease {
	return &LeaderLease{length: (electionTicks - 3) * tick, tick: tick, base: now}
}

func (l *LeaderLease) at(t time.Time) int64 { return int64(t.Sub(l.base)) }

// Held reports whether no other leader can have been elected by now.
func (l *LeaderLease) Held(now time.Time) bool { return l.at(now) < l.until.Load() }

// Due reports whether a leader should begin a round now to keep its
// lease: a tick has passed since the last began and less than half of
// the lease is left.
func (l *LeaderLease) Due(now time.Time) bool {
	at := l.at(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastBegin != 0 && at-l.lastBegin < int64(l.tick) {
		return false
	}
	return l.until.Load()-at < int64(l.length/2)
}

// Begin notes that the leader of term started ReadIndex round id at now.
// A round of a later term than the last forgets the earlier term's.
func (l *LeaderLease) Begin(id, term uint64, now time.Time) {
	at := l.at(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if term != l.term {
		l.newTerm(term)
	}
	l.lastBegin = max(at, 1)
	if at < l.voidBefore {
		return
	}
	if len(l.rounds) == maxLeaseRounds {
		l.rounds = append(l.rounds[:0], l.rounds[1:]...)
	}
	l.rounds = append(l.rounds, leaseRound{id, at})
}

// Confirmed is raft's answer to round id (a ReadState) on a node that
// leads in term, or 0 when it does not lead: the lease then holds until
// the round's start plus its length. Raft answers rounds in the order they
// began, so the earlier ones are answered too.
func (l *LeaderLease) Confirmed(id, term uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term == 0 || term != l.term {
		return
	}
	for i, r := range l.rounds {
		if r.id != id {
			continue
		}
		if r.start >= l.voidBefore {
			if u := r.start + int64(l.length); u > l.until.Load() {
				l.until.Store(u)
			}
		}
		l.rounds = append(l.rounds[:0], l.rounds[i+1:]...)
		return
	}
}

// Void ends the lease at now for two election timeouts: the leader has
// started a leadership transfer.
func (l *LeaderLease) Void(now time.Time) {
	at := l.at(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until.Store(0)
	l.voidBefore = max(l.voidBefore, at+2*electionTicks*int64(l.tick))
	l.rounds = l.rounds[:0]
}

// End forgets the lease: the node no longer leads.
func (l *LeaderLease) End() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.newTerm(0)
}

// soleVoter reports whether cs has id as its one voter, outside a joint
// configuration.
func soleVoter(cs raftpb.ConfState, id uint64) bool {
	return len(cs.Voters) == 1 && cs.Voters[0] == id && len(cs.VotersOutgoing) == 0
}

func (l *LeaderLease) newTerm(term uint64) {
	l.term = term
	l.until.Store(0)
	l.rounds = l.rounds[:0]
	l.lastBegin = 0
}
