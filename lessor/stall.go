package lessor

import (
	"time"
)

// # Why a stopped leader refuses heartbeats for a while
//
// A leader that did not run for longer than an election timeout (stopped
// with SIGSTOP, its VM paused, starved of CPU) may have been deposed
// without knowing: its followers elected and promoted another, which
// now times every session. When it runs again, the heartbeats queued for
// it while it was stopped arrive at once, and its lessor, active until
// raft hears of the new leader, would renew sessions on a leadership
// that is over, and tell their clients so: a client that trusts such an
// answer for its TTL may hold a grant the new leader expires meanwhile.
// The argument in doc.go (a deposed leader steps down within its leader
// lease timeout) assumes the node runs; a stop breaks it.
//
// So the lessor keeps a pulse: a goroutine notes the time every
// pulseInterval. When a heartbeat, the expiry loop or the pulse itself
// finds the pulse older than the election timeout, the node did not run
// for that long, and the lessor refuses heartbeats (ErrNotLeader) and
// postpones expiries for twice the election timeout: long enough for
// raft to hear of a newer leader (at once, when one exists and can reach
// it) or, with check-quorum, to step down for want of a quorum (within
// two election timeouts of ticks, the first check counting the quorum's
// activity from before the stop). If it still leads after that, nobody
// else was elected, and it answers again; a deadline it postponed is
// only later, never sooner. A false alarm (the pulse goroutine starved
// on a busy machine) costs the holders a refused heartbeat, not a lease.

// pulseInterval is how often the pulse notes the time: well under any
// election timeout.
const pulseInterval = 20 * time.Millisecond

// beat runs the pulse until Stop. It is started by New.
func (l *Lessor) beat() {
	defer close(l.beatDone)
	tick := time.NewTicker(pulseInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.stopC:
			return
		case <-tick.C:
			l.stalled(l.now())
		}
	}
}

// resetPulse starts the pulse afresh at a promotion, with limit, the
// election timeout, as the longest gap that is not a stop (0: the guard
// is off): the barrier before a promotion proves that a quorum follows
// this node now.
func (l *Lessor) resetPulse(now time.Time, limit time.Duration) {
	l.pulseAt.Store(int64(now.Sub(l.base)))
	l.refuseUntil.Store(0)
	l.stallLimit.Store(int64(limit))
}

// stalled notes the pulse at now and reports whether the lessor must
// refuse heartbeats: the node did not run for longer than the election
// timeout before now, or did less than twice the election timeout ago.
func (l *Lessor) stalled(now time.Time) bool {
	limit := l.stallLimit.Load()
	if limit <= 0 {
		return false
	}
	at := int64(now.Sub(l.base))
	if gap := at - l.pulseAt.Swap(at); gap > limit {
		until := at + 2*limit
		if until > l.refuseUntil.Load() {
			l.refuseUntil.Store(until)
			l.logger.Warn("lessor: this node did not run for longer than an election timeout; refusing heartbeats until raft confirms or ends its leadership",
				"stopped_for", time.Duration(gap), "refusing_for", time.Duration(2*limit))
		}
		return true
	}
	return at < l.refuseUntil.Load()
}

// holdLeft is how long the expiry loop must still wait after a stop,
// zero when it need not.
func (l *Lessor) holdLeft(now time.Time) time.Duration {
	if !l.stalled(now) {
		return 0
	}
	return max(time.Duration(l.refuseUntil.Load()-int64(now.Sub(l.base))), time.Millisecond)
}
