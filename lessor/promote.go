package lessor

import (
	"context"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// Promote is called when this node has become leader, after a barrier and
// a NewEpoch entry, with the epoch that entry set and the deadlines read
// from the state with no command applied in between (hold the state lock
// across reading d and calling Promote, or events in the gap are lost).
//
// Every deadline is reset to now + its TTL or delay + extra, where extra
// is the election timeout: the old leader may have renewed a session just
// before it lost touch, so a failover may lengthen a lease but never
// shorten it. Promote replaces whatever was tracked and starts expiring.
func (l *Lessor) Promote(epoch int64, d statemachine.Deadlines, extra time.Duration) {
	wallNow := l.now()
	now := l.instant(wallNow)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		l.logger.Warn("lessor: promote after stop ignored", "epoch", epoch)
		return
	}
	l.resetLocked()
	l.leader = true
	l.epoch = epoch
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.resetPulse(wallNow, extra)

	// Sessions fill maps of their own, so that each shard is locked once
	// rather than once a session, and items are heaped once at the end
	// rather than pushed one by one: a new leader may inherit 100,000.
	l.heap = make(deadlineHeap, 0, len(d.Sessions)+len(d.Keys)+len(d.Delays)+len(d.Idle))
	var maps [shardCount]map[int64]*session
	for i := range maps {
		maps[i] = make(map[int64]*session, len(d.Sessions)/shardCount+1)
	}
	for _, st := range d.Sessions {
		ttl := time.Duration(st.TTL)
		s := &session{id: st.ID, ttl: ttl, deadline: now.add(ttl + extra)}
		l.heap = append(l.heap, l.trackSessionLocked(maps[shardOf(st.ID)], s))
	}
	l.setShards(maps, true)
	l.keys = make(map[string]*keyEntry, len(d.Keys))
	for _, kt := range d.Keys {
		l.heap = append(l.heap, l.trackKeyLocked(kt, now.add(time.Duration(kt.TTL)+extra)))
	}
	l.delays = make(map[statemachine.LeaseID]*delayEntry, len(d.Delays))
	for _, ld := range d.Delays {
		l.heap = append(l.heap, l.trackDelayLocked(ld, now.add(time.Duration(ld.Delay)+extra)))
	}
	// A collection is no safety matter: it deletes a record nobody holds
	// or waits for. Its deadline comes from the logged idle time, so that
	// leader changes do not put it off, and a clock that jumped makes it
	// early or late, never wrong.
	l.idle = make(map[statemachine.LeaseID]*idleEntry, len(d.Idle))
	wall := wallNow.UnixNano()
	for _, il := range d.Idle {
		left := time.Duration(max(il.IdleSince+il.GCAfter-wall, 0))
		l.heap = append(l.heap, l.trackIdleLocked(statemachine.IdleLease{Lease: il.Lease, Revision: il.Revision}, now.add(left)))
	}
	l.heap.init()
	l.metrics.sessions.Set(float64(l.sessions))
	l.logger.Info("lessor: promoted", "epoch", epoch, "sessions", l.sessions,
		"keys", len(l.keys), "lock_delays", len(l.delays), "idle_leases", len(l.idle), "extra", extra)
	l.kick()
}

// Demote is called when leadership is lost. It cancels any proposal in
// flight, stops expiring and forgets everything; heartbeats then get
// ErrNotLeader. The next leader re-reads the deadlines from the state.
func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leader {
		l.logger.Info("lessor: demoted", "epoch", l.epoch)
	}
	l.resetLocked()
}

// resetLocked ends the current term, if any. The heap and maps are
// dropped, not emptied, so that the loop's in-flight batch of the old term
// cannot reach the new one's items.
func (l *Lessor) resetLocked() {
	l.term++
	if l.cancel != nil {
		l.cancel()
	}
	l.ctx, l.cancel = nil, nil
	l.leader = false
	l.epoch = 0
	l.stallLimit.Store(0)
	l.setShards([shardCount]map[int64]*session{}, false)
	l.sessions = 0
	l.keys, l.delays, l.idle, l.heap = nil, nil, nil, nil
	l.metrics.sessions.Set(0)
	l.kick()
}
