package lessor

import (
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

type keyEntry struct {
	kt       statemachine.KeyTTL
	deadline instant
	removed  bool // guarded by Lessor.mu
}

type delayEntry struct {
	ld       statemachine.LockDelay
	deadline instant
	removed  bool // guarded by Lessor.mu
}

type idleEntry struct {
	il       statemachine.IdleLease
	deadline instant
	removed  bool // guarded by Lessor.mu
}

// Observe is called with each applied command's events, in log order, on
// the state machine's goroutine under the state write lock. It only
// updates maps and the heap under locks held briefly by others, and never
// proposes: a proposal from here would wait for the very apply that is
// calling it. Ignored when not leader.
func (l *Lessor) Observe(events []statemachine.Event) {
	if len(events) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return
	}
	// One reading for the whole command: its events happened together, and
	// sessions opened together then expire in one batch.
	now := l.instant(l.now())
	sessions := l.sessions
	for i := range events {
		ev := &events[i]
		switch ev.Type {
		case statemachine.EventSessionOpened:
			if ev.Session == nil {
				continue
			}
			ttl := time.Duration(ev.Session.TTL)
			l.addSessionLocked(&session{id: ev.Session.ID, ttl: ttl, deadline: now.add(ttl), renewed: now, heard: true})
		case statemachine.EventSessionClosed, statemachine.EventSessionExpired:
			id := ev.SessionID
			if id == 0 && ev.Session != nil {
				id = ev.Session.ID
			}
			l.forgetSessionLocked(id)
		case statemachine.EventKeyPut:
			if ev.KV == nil {
				continue
			}
			l.forgetKeyLocked(ev.KV.Key)
			if ev.KV.TTL > 0 {
				kt := statemachine.KeyTTL{Key: ev.KV.Key, ModRevision: ev.KV.ModRevision, TTL: ev.KV.TTL}
				l.pushLocked(l.trackKeyLocked(kt, now.add(time.Duration(kt.TTL))))
			}
		case statemachine.EventKeyDeleted, statemachine.EventKeyExpired:
			if kv := eventKey(ev); kv != nil {
				l.forgetKeyLocked(kv.Key)
			}
		case statemachine.EventLeaseExpired, statemachine.EventLeaseRevoked:
			// No continue without a lock-delay: the idle timing below
			// must still see the event that leaves the lease idle.
			if ev.LockDelay > 0 {
				l.forgetDelayLocked(ev.Lease)
				ld := statemachine.LockDelay{Lease: ev.Lease, Revision: ev.Revision, Delay: ev.LockDelay}
				l.pushLocked(l.trackDelayLocked(ld, now.add(time.Duration(ld.Delay))))
			}
		case statemachine.EventLockDelayEnded:
			l.forgetDelayLocked(ev.Lease)
		}
		// Every lease event ends the lease's idle timing; the one that
		// leaves it idle and collectable carries GCAfter and starts it.
		if ev.Type.IsLease() {
			l.forgetIdleLocked(ev.Lease)
			if ev.GCAfter > 0 {
				il := statemachine.IdleLease{Lease: ev.Lease, Revision: ev.Revision}
				l.pushLocked(l.trackIdleLocked(il, now.add(time.Duration(ev.GCAfter))))
			}
		}
	}
	if l.sessions != sessions {
		l.metrics.sessions.Set(float64(l.sessions))
	}
	if l.needsCompactLocked() {
		l.kick()
	}
}

func eventKey(ev *statemachine.Event) *statemachine.KeyValue {
	if ev.KV != nil {
		return ev.KV
	}
	return ev.PrevKV
}

func (l *Lessor) addSessionLocked(s *session) {
	sh := l.shard(s.id)
	sh.mu.Lock()
	it := l.trackSessionLocked(sh.m, s)
	sh.mu.Unlock()
	l.pushLocked(it)
}

// trackSessionLocked puts s in m, a shard's map or one Promote is filling,
// in place of any session of the same ID, whose item it makes stale. It
// returns s's item for the caller to queue: Observe pushes each, Promote
// heaps them all at once.
func (l *Lessor) trackSessionLocked(m map[int64]*session, s *session) item {
	if old := m[s.id]; old != nil {
		old.removed = true
	} else {
		l.sessions++
	}
	m[s.id] = s
	return item{at: s.deadline, e: s}
}

// trackKeyLocked times kt until deadline and returns its item to queue.
// The caller forgets the key's previous entry first, if it may have one.
func (l *Lessor) trackKeyLocked(kt statemachine.KeyTTL, deadline instant) item {
	k := &keyEntry{kt: kt, deadline: deadline}
	l.keys[kt.Key] = k
	return item{at: deadline, e: k}
}

// trackDelayLocked times ld until deadline and returns its item to queue.
// The caller forgets the lease's previous entry first, if it may have one.
func (l *Lessor) trackDelayLocked(ld statemachine.LockDelay, deadline instant) item {
	e := &delayEntry{ld: ld, deadline: deadline}
	l.delays[ld.Lease] = e
	return item{at: deadline, e: e}
}

// trackIdleLocked times il's collection until deadline and returns its
// item to queue. The caller forgets the lease's previous entry first.
func (l *Lessor) trackIdleLocked(il statemachine.IdleLease, deadline instant) item {
	e := &idleEntry{il: il, deadline: deadline}
	l.idle[il.Lease] = e
	return item{at: deadline, e: e}
}

func (l *Lessor) forgetIdleLocked(id statemachine.LeaseID) {
	if e := l.idle[id]; e != nil {
		e.removed = true
		delete(l.idle, id)
	}
}

func (l *Lessor) forgetSessionLocked(id int64) {
	sh := l.shard(id)
	sh.mu.Lock()
	s := sh.m[id]
	delete(sh.m, id)
	sh.mu.Unlock()
	if s != nil {
		s.removed = true
		l.sessions--
	}
}

func (l *Lessor) forgetKeyLocked(key string) {
	if k := l.keys[key]; k != nil {
		k.removed = true
		delete(l.keys, key)
	}
}

func (l *Lessor) forgetDelayLocked(id statemachine.LeaseID) {
	if e := l.delays[id]; e != nil {
		e.removed = true
		delete(l.delays, id)
	}
}
