package lessor

import (
	"time"
)

// # Why a stopped leader postpones expiries for a while
//
// A leader that did not run for longer than an election timeout (stopped
// with SIGSTOP, its VM paused, starved of CPU) finds, when it runs again,
// sessions whose deadlines passed while it was stopped, and their
// heartbeats queued behind the stop. Timing them out at once would expire
// sessions whose clients did nothing wrong; and the node may have been
// deposed meanwhile, which raft learns within two election timeouts (at
// once when the new leader can reach it; with check-quorum otherwise, the
// first check counting the quorum's activity from before the stop).
//
// So the lessor keeps a pulse: a goroutine (or a driven lessor's caller,
// through Pulse) notes the time every pulseInterval. When Due or the
// pulse finds the pulse older than the election timeout, the node did not
// run for that long, and the lessor postpones expiries for twice the
// election timeout; a deadline it postponed is only later, never sooner.
//
// Heartbeats are not its business. It once refused them too, after a
// stop, since a deposed leader must not renew a session; the leader lease
// (Config.Leased, doc.go) now refuses them whenever no quorum confirmed
// the leadership lately, stopped or not, which covers a stop and also a
// pause just short of one (internal/sim seed 100530). Refusing them here
// as well only turned a starved pulse goroutine on a busy machine into
// refused heartbeats on a node that still held its lease.

// pulseInterval is how often the pulse notes the time: well under any
// election timeout.
const pulseInterval = 20 * time.Millisecond

// beat is New's pulse: it calls Pulse every pulseInterval until Stop.
func (l *Lessor) beat() {
	defer l.running.Done()
	tick := time.NewTicker(pulseInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.stopC:
			return
		case <-tick.C:
			l.Pulse()
		}
	}
}

// Pulse notes that the node runs at the lessor's now, and starts
// postponing expiries if it did not run for longer than the election
// timeout before. New's goroutine calls it every pulseInterval; a driven lessor's
// caller calls it as often as the node runs, at least several times an
// election timeout, or the gaps between calls read as stops.
func (l *Lessor) Pulse() { l.stalled(l.now()) }

// resetPulse starts the pulse afresh at a promotion, with limit, the
// election timeout, as the longest gap that is not a stop (0: the guard
// is off): the barrier before a promotion proves that a quorum follows
// this node now.
func (l *Lessor) resetPulse(now time.Time, limit time.Duration) {
	l.pulseAt.Store(int64(l.instant(now)))
	l.holdUntil.Store(0)
	l.stallLimit.Store(int64(limit))
}

// stalled notes the pulse at now and reports whether the lessor must
// hold expiries back: the node did not run for longer than the election
// timeout before now, or did less than twice the election timeout ago.
func (l *Lessor) stalled(now time.Time) bool {
	limit := l.stallLimit.Load()
	if limit <= 0 {
		return false
	}
	at := int64(l.instant(now))
	if gap := at - l.pulseAt.Swap(at); gap > limit {
		until := at + 2*limit
		if until > l.holdUntil.Load() {
			l.holdUntil.Store(until)
			l.logger.Warn("lessor: this node did not run for longer than an election timeout; postponing expiries, so that heartbeats queued meanwhile are heard first",
				"stopped_for", time.Duration(gap), "postponing_for", time.Duration(2*limit))
		}
		return true
	}
	return at < l.holdUntil.Load()
}

// holdLeft is how long Due must still wait after a stop,
// zero when it need not.
func (l *Lessor) holdLeft(now time.Time) time.Duration {
	if !l.stalled(now) {
		return 0
	}
	return max(time.Duration(l.holdUntil.Load()-int64(l.instant(now))), time.Millisecond)
}
