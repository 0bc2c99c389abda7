package lessor

import (
	"context"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

func (l *Lessor) kick() {
	select {
	case l.kickC <- struct{}{}:
	default:
	}
}

// batch is what the loop proposes in one round: due items of each kind,
// with the term they were collected in.
type batch struct {
	term     uint64
	epoch    int64
	ctx      context.Context
	sessions []*session
	keys     []*keyEntry
	delays   []*delayEntry
}

func (b *batch) len() int { return len(b.sessions) + len(b.keys) + len(b.delays) }

func (b *batch) full(it item) bool {
	switch {
	case it.s != nil:
		return len(b.sessions) >= maxBatch
	case it.k != nil:
		return len(b.keys) >= maxBatch
	default:
		return len(b.delays) >= maxBatch
	}
}

// run is the expiry loop: it sleeps until the earliest deadline, collects
// what is due and proposes it. It is the only goroutine the Lessor starts.
func (l *Lessor) run() {
	defer close(l.doneC)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-l.stopC:
			return
		default:
		}
		var b batch
		more, wait := l.collect(&b)
		if b.len() > 0 {
			l.propose(&b)
		}
		if more || b.len() > 0 {
			continue
		}
		var timerC <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			timerC = timer.C
		}
		select {
		case <-l.stopC:
			timer.Stop()
			return
		case <-l.kickC:
		case <-timerC:
		}
		timer.Stop()
	}
}

// collect pops due items into b, re-queueing those renewed since they were
// queued (the lazy re-check that keeps Heartbeat off the heap) and marking
// due sessions as expiring. more reports that due items remain; otherwise
// wait is the time to the next deadline, or negative when there is none.
func (l *Lessor) collect(b *batch) (more bool, wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return false, -1
	}
	if l.needsCompactLocked() {
		l.compactLocked()
	}
	b.term, b.epoch, b.ctx = l.term, l.epoch, l.ctx
	now := l.now()
	for n := 0; len(l.heap) > 0; n++ {
		it := l.heap[0]
		if now.Before(it.at) {
			return false, it.at.Sub(now)
		}
		if n >= maxExamine || b.full(it) {
			return true, 0
		}
		l.heap.pop()
		if it.stale() {
			continue
		}
		switch {
		case it.s != nil:
			s := it.s
			sh := l.shard(s.id)
			sh.mu.Lock()
			deadline := s.deadline
			due := !now.Before(deadline)
			if due {
				s.expiring = true
			}
			sh.mu.Unlock()
			if due {
				b.sessions = append(b.sessions, s)
			} else {
				l.heap.push(item{at: deadline, s: s})
			}
		case it.k != nil:
			if now.Before(it.k.deadline) {
				l.heap.push(item{at: it.k.deadline, k: it.k})
			} else {
				b.keys = append(b.keys, it.k)
			}
		default:
			if now.Before(it.d.deadline) {
				l.heap.push(item{at: it.d.deadline, d: it.d})
			} else {
				b.delays = append(b.delays, it.d)
			}
		}
	}
	return false, -1
}

// propose sends one command per kind. Items stay marked until Observe sees
// the state machine remove them; a failed proposal puts them back on the
// heap to be proposed again after the retry interval. A successful one
// does not: the state machine has applied it, so anything it skipped was
// already gone or renewed by a newer write, and its event forgets the item.
func (l *Lessor) propose(b *batch) {
	if n := len(b.sessions); n > 0 {
		ids := make([]int64, n)
		for i, s := range b.sessions {
			ids[i] = s.id
		}
		err := l.proposer.ExpireSessions(b.ctx, b.epoch, ids)
		l.proposed(b, "session", n, err, func(at time.Time) {
			for _, s := range b.sessions {
				if !s.removed {
					l.heap.push(item{at: at, s: s})
				}
			}
		})
	}
	if n := len(b.keys); n > 0 {
		keys := make([]statemachine.KeyTTL, n)
		for i, k := range b.keys {
			keys[i] = k.kt
		}
		err := l.proposer.ExpireKeys(b.ctx, b.epoch, keys)
		l.proposed(b, "key", n, err, func(at time.Time) {
			for _, k := range b.keys {
				if !k.removed {
					l.heap.push(item{at: at, k: k})
				}
			}
		})
	}
	if n := len(b.delays); n > 0 {
		delays := make([]statemachine.LockDelay, n)
		for i, e := range b.delays {
			delays[i] = e.ld
		}
		err := l.proposer.EndLockDelays(b.ctx, b.epoch, delays)
		l.proposed(b, "lock_delay", n, err, func(at time.Time) {
			for _, e := range b.delays {
				if !e.removed {
					l.heap.push(item{at: at, d: e})
				}
			}
		})
	}
}

func (l *Lessor) proposed(b *batch, kind string, n int, err error, requeue func(at time.Time)) {
	l.metrics.proposed.WithLabelValues(kind).Add(float64(n))
	if err == nil {
		l.logger.Debug("lessor: expiry proposed", "kind", kind, "n", n, "epoch", b.epoch)
		return
	}
	l.metrics.failed.WithLabelValues(kind).Add(float64(n))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term != b.term {
		// Demoted or re-promoted meanwhile: the items belong to a
		// leadership that is over, and the cancelled context is why the
		// proposal failed.
		l.logger.Debug("lessor: expiry abandoned with its term", "kind", kind, "n", n, "epoch", b.epoch, "err", err)
		return
	}
	l.logger.Warn("lessor: proposing expiry failed; will retry", "kind", kind, "n", n,
		"epoch", b.epoch, "retry_in", l.retry, "err", err)
	requeue(l.now().Add(l.retry))
}
