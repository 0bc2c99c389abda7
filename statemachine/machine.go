package statemachine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/btree"
)

// Machine is the whole replicated state. It is not safe for concurrent
// use: the replication layer applies commands one at a time and guards
// reads with a lock.
type Machine struct {
	revision   int64
	epoch      int64
	sessions   map[int64]*sessionState
	identities map[string]int // open sessions per identity
	leases     map[LeaseID]*Lease
	keys       *btree.BTreeG[*KeyValue]

	// now and events belong to the command being applied.
	now    int64
	events []Event
}

// sessionState indexes what a session holds, so that ending it touches
// only its own leases and keys. The sets are rebuilt on Restore.
type sessionState struct {
	Session
	held    map[LeaseID]struct{}
	waiting map[LeaseID]struct{}
	keys    map[string]struct{}
}

func newSessionState(s Session) *sessionState {
	return &sessionState{
		Session: s,
		held:    map[LeaseID]struct{}{},
		waiting: map[LeaseID]struct{}{},
		keys:    map[string]struct{}{},
	}
}

func keyLess(a, b *KeyValue) bool { return a.Key < b.Key }

// New returns an empty machine at revision 0.
func New() *Machine {
	return &Machine{
		sessions:   map[int64]*sessionState{},
		identities: map[string]int{},
		leases:     map[LeaseID]*Lease{},
		keys:       btree.NewG(32, keyLess),
	}
}

// Revision is the revision of the last event.
func (m *Machine) Revision() int64 { return m.revision }

// Epoch is the current leadership epoch.
func (m *Machine) Epoch() int64 { return m.epoch }

// Apply runs one command at the leader-stamped time now (unix ns). A
// command that fails returns Result.Err, changes nothing and emits no
// events.
func (m *Machine) Apply(now int64, cmd Command) Result {
	m.now = now
	m.events = nil
	var res Result
	switch c := cmd.(type) {
	case OpenSession:
		res = m.openSession(c)
	case CloseSession:
		res = m.closeSession(c)
	case ExpireSessions:
		res = m.expireSessions(c)
	case Acquire:
		res = m.acquire(c)
	case Release:
		res = m.release(c)
	case SetValue:
		res = m.setValue(c)
	case Revoke:
		res = m.revoke(c)
	case CancelWait:
		res = m.cancelWait(c)
	case Put:
		res = m.put(c)
	case Delete:
		res = m.delete(c)
	case CompareAndSwap:
		res = m.compareAndSwap(c)
	case ExpireKeys:
		res = m.expireKeys(c)
	case EndLockDelays:
		res = m.endLockDelays(c)
	case NewEpoch:
		m.epoch++
		res.Epoch = m.epoch
	default:
		res.Err = fmt.Errorf("%w: %T", ErrUnknownCommand, cmd)
	}
	if res.Err != nil {
		// Every command checks before it changes anything; an event here
		// would mean a half-applied command.
		if len(m.events) > 0 {
			panic(fmt.Sprintf("statemachine: %T failed after emitting events: %v", cmd, res.Err))
		}
	}
	res.Events = m.events
	res.Revision = m.revision
	m.events = nil
	return res
}

// emit advances the revision and records an event at it.
func (m *Machine) emit(e Event) int64 {
	m.revision++
	e.Revision = m.revision
	e.Time = m.now
	m.events = append(m.events, e)
	return m.revision
}

// --- sessions ---

func (m *Machine) openSession(c OpenSession) Result {
	if c.MaxPerIdentity > 0 && c.Identity != "" && m.identities[c.Identity] >= c.MaxPerIdentity {
		return Result{Err: fmt.Errorf("%w: %q has %d open sessions (limit %d)", ErrTooManySessions, c.Identity, m.identities[c.Identity], c.MaxPerIdentity)}
	}
	id := m.revision + 1
	s := Session{ID: id, Identity: c.Identity, TTL: c.TTL, Labels: cloneLabels(c.Labels), OpenTime: m.now}
	if s.Identity == "" {
		s.Identity = fmt.Sprintf("session-%d", id)
	}
	m.sessions[id] = newSessionState(s)
	m.identities[s.Identity]++
	ev := s
	ev.Labels = cloneLabels(s.Labels)
	m.emit(Event{Type: EventSessionOpened, SessionID: id, Session: &ev})
	out := s
	out.Labels = cloneLabels(s.Labels)
	return Result{Session: &out}
}

func (m *Machine) closeSession(c CloseSession) Result {
	s, ok := m.sessions[c.SessionID]
	if !ok {
		return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
	}
	m.grantFreed(m.endSession(s, false))
	return Result{}
}

func (m *Machine) expireSessions(c ExpireSessions) Result {
	if c.Epoch != m.epoch {
		return Result{} // proposed by an earlier leader: its clock no longer counts
	}
	// End every session of the batch before granting anything: a waiter
	// that expires in the same batch as the holder is never granted.
	var freed []LeaseID
	for _, id := range c.IDs {
		if s, ok := m.sessions[id]; ok {
			freed = append(freed, m.endSession(s, true)...)
		}
	}
	m.grantFreed(freed)
	return Result{}
}

// endSession releases everything a session holds and returns the leases
// it freed. The caller grants their waiters with grantFreed once every
// session it ends is gone, so an ending session is never granted anything.
func (m *Machine) endSession(s *sessionState, expired bool) []LeaseID {
	reason := "session closed"
	if expired {
		reason = "session expired"
	}
	for _, id := range sortedLeaseIDs(s.waiting) {
		l := m.leases[id]
		l.Waiters = slices.DeleteFunc(l.Waiters, func(w Waiter) bool { return w.SessionID == s.ID })
		l.ModRevision = m.emit(Event{Type: EventLeaseWaitEnded, Lease: id, SessionID: s.ID, Holder: s.Identity, Reason: reason})
	}
	freed := sortedLeaseIDs(s.held)
	for _, id := range freed {
		l := m.leases[id]
		i := slices.IndexFunc(l.Holders, func(g Grant) bool { return g.SessionID == s.ID })
		g := l.Holders[i]
		l.Holders = slices.Delete(l.Holders, i, i+1)
		ev := Event{Type: EventLeaseReleasedBy, Lease: id, SessionID: s.ID, Holder: g.Holder, Token: g.Token, Reason: reason}
		if expired {
			ev.Type = EventLeaseExpired
			ev.LockDelay = l.LockDelay
		}
		l.ModRevision = m.emit(ev)
		if expired && l.LockDelay > 0 {
			l.DelayRevision = l.ModRevision
		}
	}
	for _, key := range slices.Sorted(maps.Keys(s.keys)) {
		kv, _ := m.keys.Get(&KeyValue{Key: key})
		m.deleteKey(kv, EventKeyDeleted)
	}
	delete(m.sessions, s.ID)
	if m.identities[s.Identity]--; m.identities[s.Identity] <= 0 {
		delete(m.identities, s.Identity)
	}
	typ := EventSessionClosed
	if expired {
		typ = EventSessionExpired
	}
	m.emit(Event{Type: typ, SessionID: s.ID, Holder: s.Identity, Reason: reason})
	return freed
}

// grantFreed grants the waiters of leases that ending sessions freed.
func (m *Machine) grantFreed(freed []LeaseID) {
	for _, id := range freed {
		m.grantWaiters(m.leases[id])
	}
}

// --- leases ---

func (m *Machine) acquire(c Acquire) Result {
	s, ok := m.sessions[c.SessionID]
	if !ok {
		return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
	}
	capacity := max(c.Capacity, 1)
	l, exists := m.leases[c.Lease]
	if exists {
		if i := slices.IndexFunc(l.Holders, func(g Grant) bool { return g.SessionID == s.ID }); i >= 0 {
			g := l.Holders[i]
			return Result{Lease: cloneLease(l), Grant: &g}
		}
		if _, waiting := s.waiting[c.Lease]; waiting {
			return Result{Lease: cloneLease(l), Queued: true}
		}
		busy := len(l.Holders) > 0 || len(l.Waiters) > 0
		if capacity != l.Capacity && busy {
			return Result{Err: fmt.Errorf("%w: %s has capacity %d, the request asks for %d", ErrCapacityMismatch, c.Lease, l.Capacity, capacity)}
		}
	}
	free := !exists || (len(l.Waiters) == 0 && l.DelayRevision == 0 && fits(l.Holders, capacity, c.Exclusive))
	if !free && !c.Wait {
		if l.DelayRevision != 0 {
			return Result{Err: fmt.Errorf("%w: %s is in its lock-delay after an expired holder", ErrLocked, c.Lease)}
		}
		return Result{Err: fmt.Errorf("%w: %s is held by %s", ErrLocked, c.Lease, holderNames(l))}
	}
	if !free && c.MaxWaiters > 0 && len(l.Waiters) >= c.MaxWaiters {
		return Result{Err: fmt.Errorf("%w: %s has %d waiters (limit %d)", ErrTooManyWaiters, c.Lease, len(l.Waiters), c.MaxWaiters)}
	}

	// From here on the command succeeds.
	if !exists {
		l = &Lease{LeaseID: c.Lease, Capacity: capacity, CreateRevision: m.revision + 1}
		m.leases[c.Lease] = l
	}
	if !free {
		if len(l.Holders) == 0 && len(l.Waiters) == 0 {
			// An idle lease in its lock-delay: the first waiter sets the
			// capacity, as a grant would, so later acquires that ask for
			// the same capacity do not fail with ErrCapacityMismatch.
			l.Capacity = capacity
		}
		s.waiting[c.Lease] = struct{}{}
		l.Waiters = append(l.Waiters, Waiter{SessionID: s.ID, Holder: s.Identity, Since: m.now, Value: c.Value, Exclusive: c.Exclusive})
		l.ModRevision = m.emit(Event{Type: EventLeaseWaiting, Lease: c.Lease, SessionID: s.ID, Holder: s.Identity})
		return Result{Lease: cloneLease(l), Queued: true}
	}
	l.Capacity = capacity
	l.LockDelay = c.LockDelay
	if c.Labels != nil {
		l.Labels = cloneLabels(c.Labels)
	}
	g := m.grant(l, s, c.Value, c.Exclusive, exists)
	return Result{Lease: cloneLease(l), Grant: &g}
}

// fits reports whether one more grant fits beside holders: an exclusive
// grant only on an empty lease, a shared one while no exclusive grant is
// held and the capacity allows.
func fits(holders []Grant, capacity int, exclusive bool) bool {
	if exclusive {
		return len(holders) == 0
	}
	return len(holders) < capacity && !slices.ContainsFunc(holders, func(g Grant) bool { return g.Exclusive })
}

// grant makes s a holder of l at a new revision: the fencing token.
func (m *Machine) grant(l *Lease, s *sessionState, value string, exclusive, transition bool) Grant {
	token := m.emit(Event{Type: EventLeaseAcquired, Lease: l.LeaseID, SessionID: s.ID, Holder: s.Identity, Value: value})
	g := Grant{SessionID: s.ID, Holder: s.Identity, Token: token, AcquireTime: m.now, RenewTime: m.now, Value: value, Exclusive: exclusive}
	m.events[len(m.events)-1].Token = token
	l.Holders = append(l.Holders, g)
	l.ModRevision = token
	if transition {
		l.Transitions++
	}
	s.held[l.LeaseID] = struct{}{}
	return g
}

// grantWaiters fills free places from the head of the queue, in the same
// command that freed them: no polling, and only the granted waiter wakes.
// It stops at the first waiter that does not fit, so a waiting writer is
// not overtaken by readers queued behind it.
func (m *Machine) grantWaiters(l *Lease) {
	for len(l.Waiters) > 0 && l.DelayRevision == 0 && fits(l.Holders, l.Capacity, l.Waiters[0].Exclusive) {
		w := l.Waiters[0]
		l.Waiters = slices.Delete(l.Waiters, 0, 1)
		s := m.sessions[w.SessionID]
		delete(s.waiting, l.LeaseID)
		m.grant(l, s, w.Value, w.Exclusive, true)
	}
}

func (m *Machine) findHolder(id LeaseID, token int64) (*Lease, int, error) {
	l, ok := m.leases[id]
	if !ok {
		return nil, 0, fmt.Errorf("%w: %s", ErrLeaseNotFound, id)
	}
	i := slices.IndexFunc(l.Holders, func(g Grant) bool { return g.Token == token })
	if i < 0 {
		return nil, 0, fmt.Errorf("%w: token %d is not a current holder of %s (%s)", ErrNotHolder, token, id, currentTokens(l))
	}
	return l, i, nil
}

func (m *Machine) release(c Release) Result {
	l, i, err := m.findHolder(c.Lease, c.Token)
	if err != nil {
		return Result{Err: err}
	}
	m.removeHolder(l, i, EventLeaseReleased, "released")
	m.grantWaiters(l)
	return Result{Lease: cloneLease(l)}
}

func (m *Machine) removeHolder(l *Lease, i int, typ EventType, reason string) Grant {
	g := l.Holders[i]
	l.Holders = slices.Delete(l.Holders, i, i+1)
	delete(m.sessions[g.SessionID].held, l.LeaseID)
	l.ModRevision = m.emit(Event{Type: typ, Lease: l.LeaseID, SessionID: g.SessionID, Holder: g.Holder, Token: g.Token, Reason: reason})
	return g
}

func (m *Machine) setValue(c SetValue) Result {
	l, i, err := m.findHolder(c.Lease, c.Token)
	if err != nil {
		return Result{Err: err}
	}
	g := &l.Holders[i]
	g.Value = c.Value
	g.RenewTime = m.now
	l.ModRevision = m.emit(Event{Type: EventLeaseValueSet, Lease: l.LeaseID, SessionID: g.SessionID, Holder: g.Holder, Token: g.Token, Value: c.Value})
	return Result{Lease: cloneLease(l)}
}

func (m *Machine) revoke(c Revoke) Result {
	l, ok := m.leases[c.Lease]
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	}
	if c.Token != 0 {
		if _, _, err := m.findHolder(c.Lease, c.Token); err != nil {
			return Result{Err: err}
		}
	} else if len(l.Holders) == 0 {
		return Result{Err: fmt.Errorf("%w: %s has no holders to revoke", ErrNotHolder, c.Lease)}
	}
	reason := c.Reason
	if reason == "" {
		reason = "revoked"
	}
	var revoked []int64
	for i := 0; i < len(l.Holders); {
		if c.Token != 0 && l.Holders[i].Token != c.Token {
			i++
			continue
		}
		g := m.removeHolder(l, i, EventLeaseRevoked, reason)
		revoked = append(revoked, g.Token)
		// A revoked holder did not stop by itself and may still be
		// working: like an expired one, it gets the lease's lock-delay
		// to notice before anyone else is granted.
		if l.LockDelay > 0 {
			l.DelayRevision = l.ModRevision
			m.events[len(m.events)-1].LockDelay = l.LockDelay
		}
	}
	m.grantWaiters(l)
	return Result{Lease: cloneLease(l), Revoked: revoked}
}

func (m *Machine) cancelWait(c CancelWait) Result {
	l, ok := m.leases[c.Lease]
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	}
	s, ok := m.sessions[c.SessionID]
	if !ok {
		return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
	}
	if _, waiting := s.waiting[c.Lease]; waiting {
		delete(s.waiting, c.Lease)
		l.Waiters = slices.DeleteFunc(l.Waiters, func(w Waiter) bool { return w.SessionID == s.ID })
		l.ModRevision = m.emit(Event{Type: EventLeaseWaitEnded, Lease: c.Lease, SessionID: s.ID, Holder: s.Identity, Reason: "wait cancelled"})
		return Result{Lease: cloneLease(l)}
	}
	i := slices.IndexFunc(l.Holders, func(g Grant) bool { return g.SessionID == s.ID })
	if i < 0 {
		return Result{Err: fmt.Errorf("%w: session %d is not queued for %s", ErrNotWaiting, s.ID, c.Lease)}
	}
	if !c.ReleaseIfHeld {
		g := l.Holders[i]
		return Result{Lease: cloneLease(l), Grant: &g}
	}
	m.removeHolder(l, i, EventLeaseReleased, "wait cancelled")
	m.grantWaiters(l)
	return Result{Lease: cloneLease(l)}
}

func (m *Machine) endLockDelays(c EndLockDelays) Result {
	if c.Epoch != m.epoch {
		return Result{}
	}
	for _, d := range c.Delays {
		l, ok := m.leases[d.Lease]
		if !ok || l.DelayRevision == 0 || l.DelayRevision != d.Revision {
			continue
		}
		l.DelayRevision = 0
		l.ModRevision = m.emit(Event{Type: EventLockDelayEnded, Lease: l.LeaseID})
		m.grantWaiters(l)
	}
	return Result{}
}

// --- keys ---

func (m *Machine) put(c Put) Result {
	if c.SessionID != 0 {
		if _, ok := m.sessions[c.SessionID]; !ok {
			return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
		}
	}
	kv, prev := m.putKey(c.Key, c.Value, c.TTL, c.SessionID)
	return Result{KV: kv, PrevKV: prev}
}

func (m *Machine) putKey(key, value string, ttl, sessionID int64) (kv, prev *KeyValue) {
	rev := m.revision + 1
	next := &KeyValue{Key: key, Value: value, CreateRevision: rev, ModRevision: rev, Version: 1, TTL: ttl, SessionID: sessionID}
	if old, ok := m.keys.Get(&KeyValue{Key: key}); ok {
		p := *old
		prev = &p
		next.CreateRevision = old.CreateRevision
		next.Version = old.Version + 1
		if old.SessionID != 0 && old.SessionID != sessionID {
			delete(m.sessions[old.SessionID].keys, key)
		}
	}
	if sessionID != 0 {
		m.sessions[sessionID].keys[key] = struct{}{}
	}
	m.keys.ReplaceOrInsert(next)
	out := *next
	m.emit(Event{Type: EventKeyPut, SessionID: sessionID, KV: &out, PrevKV: prev})
	return &out, prev
}

func (m *Machine) deleteKey(kv *KeyValue, typ EventType) {
	m.keys.Delete(kv)
	if kv.SessionID != 0 {
		if s, ok := m.sessions[kv.SessionID]; ok {
			delete(s.keys, kv.Key)
		}
	}
	prev := *kv
	m.emit(Event{Type: typ, SessionID: kv.SessionID, KV: &KeyValue{Key: kv.Key, ModRevision: m.revision + 1}, PrevKV: &prev})
}

func (m *Machine) delete(c Delete) Result {
	var doomed []*KeyValue
	if c.Prefix {
		m.keys.AscendGreaterOrEqual(&KeyValue{Key: c.Key}, func(kv *KeyValue) bool {
			if !strings.HasPrefix(kv.Key, c.Key) {
				return false
			}
			doomed = append(doomed, kv)
			return true
		})
	} else if kv, ok := m.keys.Get(&KeyValue{Key: c.Key}); ok {
		doomed = append(doomed, kv)
	}
	for _, kv := range doomed {
		m.deleteKey(kv, EventKeyDeleted)
	}
	var prev *KeyValue
	if len(doomed) == 1 && !c.Prefix {
		p := *doomed[0]
		prev = &p
	}
	return Result{Deleted: int64(len(doomed)), PrevKV: prev}
}

func (m *Machine) compareAndSwap(c CompareAndSwap) Result {
	cur, exists := m.keys.Get(&KeyValue{Key: c.Key})
	var current *KeyValue
	if exists {
		cp := *cur
		current = &cp
	}
	if err := compare(c, current); err != nil {
		return Result{Err: err, KV: current}
	}
	if c.Delete {
		if exists {
			m.deleteKey(cur, EventKeyDeleted)
			return Result{Deleted: 1, PrevKV: current}
		}
		return Result{}
	}
	if c.SessionID != 0 {
		if _, ok := m.sessions[c.SessionID]; !ok {
			return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
		}
	}
	kv, prev := m.putKey(c.Key, c.NewValue, c.TTL, c.SessionID)
	return Result{KV: kv, PrevKV: prev}
}

// compare checks a compare-and-swap's condition against the key as it is
// (nil when absent). The error names expected and actual.
func compare(c CompareAndSwap, cur *KeyValue) error {
	switch c.Target {
	case CompareAbsent:
		if cur != nil {
			return fmt.Errorf("%w: key %q exists (mod_revision %d), expected absent", ErrCompareFailed, c.Key, cur.ModRevision)
		}
	case CompareValue:
		if cur == nil {
			return fmt.Errorf("%w: key %q is absent, expected value %q", ErrCompareFailed, c.Key, c.Value)
		}
		if cur.Value != c.Value {
			return fmt.Errorf("%w: value %q != %q for key %q", ErrCompareFailed, c.Value, cur.Value, c.Key)
		}
	case CompareModRevision:
		var actual int64
		if cur != nil {
			actual = cur.ModRevision
		}
		if actual != c.ModRevision {
			return fmt.Errorf("%w: mod_revision %d != %d for key %q", ErrCompareFailed, c.ModRevision, actual, c.Key)
		}
	default:
		return fmt.Errorf("%w: compare target %d", ErrCompareFailed, c.Target)
	}
	return nil
}

func (m *Machine) expireKeys(c ExpireKeys) Result {
	if c.Epoch != m.epoch {
		return Result{}
	}
	for _, k := range c.Keys {
		kv, ok := m.keys.Get(&KeyValue{Key: k.Key})
		if ok && kv.ModRevision == k.ModRevision && kv.TTL > 0 {
			m.deleteKey(kv, EventKeyExpired)
		}
	}
	return Result{}
}

// --- reads ---

// Session returns a copy of a session.
func (m *Machine) Session(id int64) (Session, bool) {
	s, ok := m.sessions[id]
	if !ok {
		return Session{}, false
	}
	out := s.Session
	out.Labels = cloneLabels(s.Labels)
	return out, true
}

// SessionHoldings returns what a session holds and waits for, sorted, and
// how many keys are bound to it.
func (m *Machine) SessionHoldings(id int64) (held, waiting []LeaseID, keys int) {
	s, ok := m.sessions[id]
	if !ok {
		return nil, nil, 0
	}
	return sortedLeaseIDs(s.held), sortedLeaseIDs(s.waiting), len(s.keys)
}

// Sessions returns copies of all sessions, by ID.
func (m *Machine) Sessions() []Session {
	out := make([]Session, 0, len(m.sessions))
	for _, id := range slices.Sorted(maps.Keys(m.sessions)) {
		s, _ := m.Session(id)
		out = append(out, s)
	}
	return out
}

// Lease returns a copy of a lease.
func (m *Machine) Lease(id LeaseID) (Lease, bool) {
	l, ok := m.leases[id]
	if !ok {
		return Lease{}, false
	}
	return *cloneLease(l), true
}

// Leases returns copies of the leases in a namespace ("" for all), sorted
// by namespace and name.
func (m *Machine) Leases(namespace string) []Lease {
	var out []Lease
	for id, l := range m.leases {
		if namespace == "" || id.Namespace == namespace {
			out = append(out, *cloneLease(l))
		}
	}
	slices.SortFunc(out, func(a, b Lease) int { return compareLeaseID(a.LeaseID, b.LeaseID) })
	return out
}

// Key returns a copy of a key.
func (m *Machine) Key(key string) (KeyValue, bool) {
	kv, ok := m.keys.Get(&KeyValue{Key: key})
	if !ok {
		return KeyValue{}, false
	}
	return *kv, true
}

// Range returns up to limit keys (0 = all) with the prefix, sorted, and
// whether more were left out.
func (m *Machine) Range(prefix string, limit int) ([]KeyValue, bool) {
	var out []KeyValue
	more := false
	m.keys.AscendGreaterOrEqual(&KeyValue{Key: prefix}, func(kv *KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		if limit > 0 && len(out) == limit {
			more = true
			return false
		}
		out = append(out, *kv)
		return true
	})
	return out, more
}

// KeyCount is the number of keys.
func (m *Machine) KeyCount() int { return m.keys.Len() }

// Deadlines lists what a new leader's lessor must time.
func (m *Machine) Deadlines() Deadlines {
	var d Deadlines
	for _, id := range slices.Sorted(maps.Keys(m.sessions)) {
		d.Sessions = append(d.Sessions, SessionTTL{ID: id, TTL: m.sessions[id].TTL})
	}
	m.keys.Ascend(func(kv *KeyValue) bool {
		if kv.TTL > 0 {
			d.Keys = append(d.Keys, KeyTTL{Key: kv.Key, ModRevision: kv.ModRevision, TTL: kv.TTL})
		}
		return true
	})
	for _, l := range m.Leases("") {
		if l.DelayRevision != 0 {
			d.Delays = append(d.Delays, LockDelay{Lease: l.LeaseID, Revision: l.DelayRevision, Delay: l.LockDelay})
		}
	}
	return d
}

// --- helpers ---

func cloneLabels(l map[string]string) map[string]string {
	if len(l) == 0 {
		return nil
	}
	return maps.Clone(l)
}

func cloneLease(l *Lease) *Lease {
	out := *l
	out.Holders = slices.Clone(l.Holders)
	out.Waiters = slices.Clone(l.Waiters)
	out.Labels = cloneLabels(l.Labels)
	return &out
}

func compareLeaseID(a, b LeaseID) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

func sortedLeaseIDs(set map[LeaseID]struct{}) []LeaseID {
	return slices.SortedFunc(maps.Keys(set), compareLeaseID)
}

func holderNames(l *Lease) string {
	names := make([]string, len(l.Holders))
	for i, g := range l.Holders {
		names[i] = g.Holder
	}
	return strings.Join(names, ", ")
}

func currentTokens(l *Lease) string {
	if len(l.Holders) == 0 {
		return "it has no holder"
	}
	toks := make([]string, len(l.Holders))
	for i, g := range l.Holders {
		toks[i] = fmt.Sprint(g.Token)
	}
	return "current token " + strings.Join(toks, ", ")
}
