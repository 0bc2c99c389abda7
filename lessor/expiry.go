package lessor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// batch is what Due collects in one round: due items of each kind, with
// the term they were collected in.
type batch struct {
	term     uint64
	epoch    int64
	ctx      context.Context
	sessions []item
	keys     []item
	delays   []item
	idle     []item
}

// of returns the part of b that holds items of the same kind as it.
func (b *batch) of(it item) *[]item {
	switch it.e.(type) {
	case *session:
		return &b.sessions
	case *keyEntry:
		return &b.keys
	case *delayEntry:
		return &b.delays
	default:
		return &b.idle
	}
}

// Expiry is one proposal the lessor asks for: the due items of one kind,
// with the epoch the command must carry. Exactly one of Sessions, Keys,
// Delays and Leases is set; it names the command (ExpireSessions,
// ExpireKeys, EndLockDelays, CollectLeases). Its outcome goes back to the
// lessor through Proposed.
type Expiry struct {
	Epoch    int64
	Sessions []int64
	Keys     []statemachine.KeyTTL
	Delays   []statemachine.LockDelay
	Leases   []statemachine.IdleLease

	kind  string // for the metrics and the log
	items []item
	term  uint64
	ctx   context.Context // cancelled when its term ends
}

// Due returns what is due at the lessor's now, one Expiry per kind in the
// order sessions, keys, lock-delays, collections, for the caller to
// propose and report with Proposed. Its items stay marked until Observe
// sees them removed or Proposed puts them back. wait is when to call Due
// again if nothing else happens: 0 at once (more was due than one round
// takes), negative never (not leader, or nothing timed); a change that
// makes it sooner calls the wake function. Due proposes nothing itself.
func (l *Lessor) Due() (due []*Expiry, wait time.Duration) {
	var b batch
	wait = l.collect(&b)
	return b.expiries(), wait
}

// run is the expiry loop of New: it sleeps until the earliest deadline
// or a wake, takes what is due and proposes it through p, one Expiry at a
// time. It and the pulse (stall.go) are the goroutines New starts.
func (l *Lessor) run(p Proposer, wakeC <-chan struct{}) {
	defer l.running.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-l.stopC:
			return
		default:
		}
		due, wait := l.Due()
		for _, e := range due {
			l.Proposed(e, l.send(e, p))
		}
		// The proposals took until their apply: look again at once
		// rather than trust a wait measured before them.
		if wait == 0 || len(due) > 0 {
			continue
		}
		var timerC <-chan time.Time
		if wait > 0 {
			timer.Reset(wait)
			timerC = timer.C
		}
		select {
		case <-l.stopC:
			timer.Stop()
			return
		case <-wakeC:
		case <-timerC:
		}
		timer.Stop()
	}
}

// kick asks the driver to call Due again (New's loop, or NewDriven's
// caller). It never blocks.
func (l *Lessor) kick() { l.wake() }

// collect pops due items into b, re-queueing those renewed since they were
// queued (the lazy re-check that keeps Heartbeat off the heap) and marking
// due sessions as expiring. wait is 0 when due items remain beyond this
// round, otherwise the time to the next deadline (never 0), or negative
// when there is none.
func (l *Lessor) collect(b *batch) (wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return -1
	}
	if l.needsCompactLocked() {
		l.compactLocked()
	}
	b.term, b.epoch, b.ctx = l.term, l.epoch, l.ctx
	wall := l.now()
	if hold := l.holdLeft(wall); hold > 0 {
		return hold // see stall.go
	}
	now := l.instant(wall)
	for n := 0; len(l.heap) > 0; n++ {
		it := l.heap[0]
		if now < it.at {
			return time.Duration(it.at - now)
		}
		if n >= maxExamine || len(*b.of(it)) >= maxBatch {
			return 0
		}
		l.heap.pop()
		if it.stale() {
			continue
		}
		if deadline := l.deadlineLocked(it, now); now < deadline {
			it.at = deadline
			l.heap.push(it)
			continue
		}
		part := b.of(it)
		*part = append(*part, it)
	}
	return -1
}

// deadlineLocked returns the current deadline of the entry that it times.
// A session's moves with heartbeats, under its shard's mutex; one due at
// now is marked expiring under the same lock, so that no heartbeat renews
// it while its expiry is proposed.
func (l *Lessor) deadlineLocked(it item, now instant) instant {
	switch e := it.e.(type) {
	case *session:
		sh := l.shard(e.id)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if now >= e.deadline {
			e.expiring = true
		}
		return e.deadline
	case *keyEntry:
		return e.deadline
	case *delayEntry:
		return e.deadline
	case *idleEntry:
		return e.deadline
	}
	panic(fmt.Sprintf("lessor: a heap item of kind %T", it.e))
}

// expiries turns b into one Expiry per kind that has items.
func (b *batch) expiries() []*Expiry {
	var due []*Expiry
	add := func(kind string, items []item, set func(e *Expiry)) {
		if len(items) == 0 {
			return
		}
		e := &Expiry{Epoch: b.epoch, kind: kind, items: items, term: b.term, ctx: b.ctx}
		set(e)
		due = append(due, e)
	}
	add("session", b.sessions, func(e *Expiry) {
		e.Sessions = wire(b.sessions, func(it item) int64 { return it.e.(*session).id })
	})
	add("key", b.keys, func(e *Expiry) {
		e.Keys = wire(b.keys, func(it item) statemachine.KeyTTL { return it.e.(*keyEntry).kt })
	})
	add("lock_delay", b.delays, func(e *Expiry) {
		e.Delays = wire(b.delays, func(it item) statemachine.LockDelay { return it.e.(*delayEntry).ld })
	})
	add("lease_gc", b.idle, func(e *Expiry) {
		e.Leases = wire(b.idle, func(it item) statemachine.IdleLease { return it.e.(*idleEntry).il })
	})
	return due
}

// wire makes each item what the command carries.
func wire[W any](items []item, f func(item) W) []W {
	ws := make([]W, len(items))
	for i, it := range items {
		ws[i] = f(it)
	}
	return ws
}

// send proposes e through p, in its term's context, and returns once the
// command is applied or the proposal failed.
func (l *Lessor) send(e *Expiry, p Proposer) error { return p.Propose(e.ctx, l.Command(e)) }

// Command is the command that expires e, for the log. An ExpireSessions
// carries each session's last heartbeat on this leader (zero when none),
// put in the log once, here, so that the ended grants' records say when
// their holders were last heard from.
func (l *Lessor) Command(e *Expiry) statemachine.Command {
	switch {
	case e.Sessions != nil:
		renewed := make([]int64, len(e.Sessions))
		for i, id := range e.Sessions {
			if t := l.LastHeartbeat(id); !t.IsZero() {
				renewed[i] = t.UnixNano()
			}
		}
		return statemachine.ExpireSessions{Epoch: e.Epoch, IDs: e.Sessions, Renewed: renewed}
	case e.Keys != nil:
		return statemachine.ExpireKeys{Epoch: e.Epoch, Keys: e.Keys}
	case e.Delays != nil:
		return statemachine.EndLockDelays{Epoch: e.Epoch, Delays: e.Delays}
	default:
		return statemachine.CollectLeases{Epoch: e.Epoch, Leases: e.Leases}
	}
}

// Proposed reports the outcome of proposing e: nil once its command has
// been applied, or the error that stopped it (ErrPostponed for one that
// cannot be made yet). It counts and logs the outcome. Items stay marked
// until Observe sees the state machine remove them; a failed proposal puts
// them back on the heap, to be proposed again after the retry interval
// (the postpone interval for ErrPostponed), unless its term has ended. A
// successful one does not: the state machine has applied it, so anything
// it skipped was already gone or renewed by a newer write, and its event
// forgets the item.
func (l *Lessor) Proposed(e *Expiry, err error) {
	n := len(e.items)
	l.metrics.proposed.WithLabelValues(e.kind).Add(float64(n))
	if err == nil {
		l.logger.Debug("lessor: expiry proposed", "kind", e.kind, "n", n, "epoch", e.Epoch)
		return
	}
	retry := l.retry
	if errors.Is(err, ErrPostponed) {
		retry = l.postpone
	} else {
		l.metrics.failed.WithLabelValues(e.kind).Add(float64(n))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term != e.term {
		// Demoted or re-promoted meanwhile: the items belong to a
		// leadership that is over, and the cancelled context is why the
		// proposal failed.
		l.logger.Debug("lessor: expiry abandoned with its term", "kind", e.kind, "n", n, "epoch", e.Epoch, "err", err)
		return
	}
	if retry == l.postpone {
		l.logger.Debug("lessor: expiry postponed", "kind", e.kind, "n", n, "epoch", e.Epoch, "retry_in", retry, "err", err)
	} else {
		l.logger.Warn("lessor: proposing expiry failed; will retry", "kind", e.kind, "n", n,
			"epoch", e.Epoch, "retry_in", retry, "err", err)
	}
	at := l.instant(l.now()).add(retry)
	for _, it := range e.items {
		if !it.stale() {
			it.at = at
			l.pushLocked(it)
		}
	}
}
