package lessor

import (
	"context"
	"errors"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// batch is what the loop proposes in one round: due items of each kind,
// with the term they were collected in.
type batch struct {
	term     uint64
	epoch    int64
	ctx      context.Context
	sessions []item
	keys     []item
	delays   []item
	idle     []item
}

func (b *batch) len() int { return len(b.sessions) + len(b.keys) + len(b.delays) + len(b.idle) }

// of returns the part of b that holds items of the same kind as it.
func (b *batch) of(it item) *[]item {
	switch {
	case it.s != nil:
		return &b.sessions
	case it.k != nil:
		return &b.keys
	case it.d != nil:
		return &b.delays
	default:
		return &b.idle
	}
}

// run is the expiry loop: it sleeps until the earliest deadline, collects
// what is due and proposes it. It and the pulse (stall.go) are the
// goroutines the Lessor starts.
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

// kick wakes the loop. It never blocks: one pending wake is enough, as
// the loop looks at the whole heap when it wakes.
func (l *Lessor) kick() {
	select {
	case l.kickC <- struct{}{}:
	default:
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
	if hold := l.holdLeft(now); hold > 0 {
		return false, hold // see stall.go
	}
	for n := 0; len(l.heap) > 0; n++ {
		it := l.heap[0]
		if now.Before(it.at) {
			return false, it.at.Sub(now)
		}
		if n >= maxExamine || len(*b.of(it)) >= maxBatch {
			return true, 0
		}
		l.heap.pop()
		if it.stale() {
			continue
		}
		if deadline := l.deadlineLocked(it, now); now.Before(deadline) {
			it.at = deadline
			l.heap.push(it)
			continue
		}
		part := b.of(it)
		*part = append(*part, it)
	}
	return false, -1
}

// deadlineLocked returns the current deadline of the entry that it times.
// A session's moves with heartbeats, under its shard's mutex; one due at
// now is marked expiring under the same lock, so that no heartbeat renews
// it while its expiry is proposed.
func (l *Lessor) deadlineLocked(it item, now time.Time) time.Time {
	switch {
	case it.s != nil:
		sh := l.shard(it.s.id)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if !now.Before(it.s.deadline) {
			it.s.expiring = true
		}
		return it.s.deadline
	case it.k != nil:
		return it.k.deadline
	case it.d != nil:
		return it.d.deadline
	default:
		return it.g.deadline
	}
}

// propose sends one command per kind. Items stay marked until Observe sees
// the state machine remove them; a failed proposal puts them back on the
// heap to be proposed again after the retry interval. A successful one
// does not: the state machine has applied it, so anything it skipped was
// already gone or renewed by a newer write, and its event forgets the item.
func (l *Lessor) propose(b *batch) {
	proposeKind(l, b, "session", b.sessions, l.proposer.ExpireSessions,
		func(it item) int64 { return it.s.id })
	proposeKind(l, b, "key", b.keys, l.proposer.ExpireKeys,
		func(it item) statemachine.KeyTTL { return it.k.kt })
	proposeKind(l, b, "lock_delay", b.delays, l.proposer.EndLockDelays,
		func(it item) statemachine.LockDelay { return it.d.ld })
	proposeKind(l, b, "lease_gc", b.idle, l.proposer.CollectLeases,
		func(it item) statemachine.IdleLease { return it.g.il })
}

// proposeKind proposes items, all of one kind, through send, each as
// wire makes it, and counts and logs the outcome under kind.
func proposeKind[W any](l *Lessor, b *batch, kind string, items []item,
	send func(ctx context.Context, epoch int64, ws []W) error, wire func(item) W) {
	n := len(items)
	if n == 0 {
		return
	}
	ws := make([]W, n)
	for i, it := range items {
		ws[i] = wire(it)
	}
	err := send(b.ctx, b.epoch, ws)
	l.metrics.proposed.WithLabelValues(kind).Add(float64(n))
	if err == nil {
		l.logger.Debug("lessor: expiry proposed", "kind", kind, "n", n, "epoch", b.epoch)
		return
	}
	retry := l.retry
	if errors.Is(err, ErrPostponed) {
		retry = l.postpone
	} else {
		l.metrics.failed.WithLabelValues(kind).Add(float64(n))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term != b.term {
		// Demoted or re-promoted meanwhile: the items belong to a
		// leadership that is over, and the cancelled context is why the
		// proposal failed.
		l.logger.Debug("lessor: expiry abandoned with its term", "kind", kind, "n", n, "epoch", b.epoch, "err", err)
		return
	}
	if retry == l.postpone {
		l.logger.Debug("lessor: expiry postponed", "kind", kind, "n", n, "epoch", b.epoch, "retry_in", retry, "err", err)
	} else {
		l.logger.Warn("lessor: proposing expiry failed; will retry", "kind", kind, "n", n,
			"epoch", b.epoch, "retry_in", retry, "err", err)
	}
	at := l.now().Add(retry)
	for _, it := range items {
		if !it.stale() {
			it.at = at
			l.heap.push(it)
		}
	}
}
