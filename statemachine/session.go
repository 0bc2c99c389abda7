package statemachine

import (
	"fmt"
	"maps"
	"slices"
)

// sessionState is a session and the sets of what it holds, waits for and
// has keys bound to, so that ending it touches only its own leases and
// keys; they are rebuilt on Restore. The sets live behind one pointer,
// nil until the session first needs one, and each set is nil until
// first used: most sessions never hold anything (an idle session is 64
// bytes here, not 80), most of the rest use one kind, and an empty map
// still costs some 70 bytes. held is keyed by the machine's own lease
// record, whose 8 bytes are a quarter of a LeaseID's; a held lease is
// never deleted, so the record stays the one in Machine.leases.
type sessionState struct {
	Session
	sets *sessionSets
}

type sessionSets struct {
	held    map[*lease]struct{}
	waiting map[LeaseID]struct{}
	keys    map[string]struct{}
}

func newSessionState(s Session) *sessionState { return &sessionState{Session: s} }

// used returns s's sets, made on first use.
func (s *sessionState) used() *sessionSets {
	if s.sets == nil {
		s.sets = &sessionSets{}
	}
	return s.sets
}

func (s *sessionState) hold(l *lease) {
	u := s.used()
	if u.held == nil {
		u.held = map[*lease]struct{}{}
	}
	u.held[l] = struct{}{}
}

func (s *sessionState) wait(id LeaseID) {
	u := s.used()
	if u.waiting == nil {
		u.waiting = map[LeaseID]struct{}{}
	}
	u.waiting[id] = struct{}{}
}

func (s *sessionState) bind(key string) {
	u := s.used()
	if u.keys == nil {
		u.keys = map[string]struct{}{}
	}
	u.keys[key] = struct{}{}
}

// The sets as they are, nil when never used; read them only.
func (s *sessionState) heldSet() map[*lease]struct{} {
	if s.sets == nil {
		return nil
	}
	return s.sets.held
}

func (s *sessionState) waitingSet() map[LeaseID]struct{} {
	if s.sets == nil {
		return nil
	}
	return s.sets.waiting
}

func (s *sessionState) keySet() map[string]struct{} {
	if s.sets == nil {
		return nil
	}
	return s.sets.keys
}

func (s *sessionState) isWaiting(id LeaseID) bool {
	_, ok := s.waitingSet()[id]
	return ok
}

func (s *sessionState) unhold(l *lease) {
	if s.sets != nil {
		delete(s.sets.held, l)
	}
}

func (s *sessionState) unwait(id LeaseID) {
	if s.sets != nil {
		delete(s.sets.waiting, id)
	}
}

func (s *sessionState) unbind(key string) {
	if s.sets != nil {
		delete(s.sets.keys, key)
	}
}

// heldIDs is what s holds, sorted.
func (s *sessionState) heldIDs() []LeaseID {
	var ids []LeaseID
	for l := range s.heldSet() {
		ids = append(ids, l.LeaseID)
	}
	slices.SortFunc(ids, compareLeaseID)
	return ids
}

func (m *Machine) openSession(c OpenSession) Result {
	if c.MaxPerIdentity > 0 && c.Identity != "" && m.identities[c.Identity] >= c.MaxPerIdentity {
		return Result{Err: fmt.Errorf("%w: %q has %d open sessions (limit %d)", ErrTooManySessions, c.Identity, m.identities[c.Identity], c.MaxPerIdentity)}
	}
	if c.LeaseID != 0 {
		if !m.usesKVRevision() {
			return Result{Err: fmt.Errorf("%w: a chosen lease ID needs cluster version 5", ErrNotSupported)}
		}
		if c.LeaseID < 0 {
			return Result{Err: fmt.Errorf("%w: lease ID %d is negative", ErrLeaseNotFound, c.LeaseID)}
		}
		if _, taken := m.sessionByLease(c.LeaseID); taken {
			return Result{Err: fmt.Errorf("%w: %d", ErrLeaseExists, c.LeaseID)}
		}
	}
	id := m.revision + 1
	s := Session{ID: id, Identity: c.Identity, TTL: c.TTL, Labels: cloneLabels(c.Labels), OpenTime: m.now, LeaseID: c.LeaseID}
	if s.LeaseID == 0 {
		// A client chose this session's own ID for an earlier one: the
		// etcd API names this one by the first free ID above 2^62,
		// where revisions never reach.
		for alias := id | 1<<62; ; alias++ {
			if _, taken := m.leaseIDs[id]; !taken {
				break
			}
			if _, taken := m.sessionByLease(alias); !taken {
				s.LeaseID = alias
				break
			}
		}
	}
	if s.LeaseID != 0 {
		m.leaseIDs[s.LeaseID] = id
	}
	if s.Identity == "" {
		s.Identity = fmt.Sprintf("session-%d", id)
	}
	m.sessions[id] = newSessionState(s)
	m.usage.Sessions += sessionCost(&s)
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
	if err := m.actAs(c.Actor, s, "close", true); err != nil {
		return Result{Err: err}
	}
	m.grantFreed(m.endSession(s, false, 0))
	return Result{}
}

func (m *Machine) expireSessions(c ExpireSessions) Result {
	if c.Epoch != m.epoch {
		return Result{} // proposed by an earlier leader: its clock no longer counts
	}
	// End every session of the batch before granting anything: a waiter
	// that expires in the same batch as the holder is never granted.
	var freed []LeaseID
	for i, id := range c.IDs {
		if s, ok := m.sessions[id]; ok {
			var renewed int64
			if i < len(c.Renewed) {
				renewed = c.Renewed[i]
			}
			freed = append(freed, m.endSession(s, true, renewed)...)
		}
	}
	m.grantFreed(freed)
	return Result{}
}

// endSession releases everything a session holds and returns the leases
// it freed. The caller grants their waiters with grantFreed once every
// session it ends is gone, so an ending session is never granted anything.
// renewed is when the leader last heard from an expired session.
func (m *Machine) endSession(s *sessionState, expired bool, renewed int64) []LeaseID {
	reason := "session closed"
	if expired {
		reason = "session expired"
	}
	var freed []LeaseID
	for _, id := range sortedLeaseIDs(s.waitingSet()) {
		l, _ := m.leases.get(id)
		l.dropWaiter(s.ID)
		l.modRev = m.emit(Event{Type: EventLeaseWaitEnded, Lease: id, SessionID: s.ID, Holder: s.Identity, Reason: reason})
		if m.atLeast(2) {
			freed = append(freed, id) // it may have been the head
		}
	}
	for _, id := range s.heldIDs() {
		freed = append(freed, id)
		l, _ := m.leases.get(id)
		i := l.holderOf(s.ID)
		h := l.holders[i]
		l.removeHolderAt(i)
		ev := Event{Type: EventLeaseReleasedBy, Lease: id, SessionID: s.ID, Holder: h.identity, Token: h.token, Reason: reason}
		l.last = ended(&h, EndReleased, reason, m.now, m.now)
		if expired {
			ev.Type = EventLeaseExpired
			ev.LockDelay = l.lockDelay()
			// The expiry was timed from the session's last renewal on
			// the leader, not from the grant: renewed, when known, is
			// the truth even if the grant came later.
			renew := h.renewTime
			if renewed != 0 {
				renew = renewed
			}
			l.last = ended(&h, EndExpired, reason, renew, m.now)
		}
		l.modRev = m.emit(ev)
		if expired && l.lockDelay() > 0 {
			l.setDelayRevision(l.modRev)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(s.keySet())) {
		kv, _ := m.keys.Get(&KeyValue{Key: key})
		m.deleteKey(kv, EventKeyDeleted)
	}
	delete(m.sessions, s.ID)
	m.usage.Sessions -= sessionCost(&s.Session)
	if s.LeaseID != 0 {
		delete(m.leaseIDs, s.LeaseID)
	}
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
		l, _ := m.leases.get(id)
		m.grantWaiters(l)
	}
}

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

// SessionByLease returns a copy of the session that answers to etcd lease
// ID lease.
func (m *Machine) SessionByLease(lease int64) (Session, bool) {
	s, ok := m.sessionByLease(lease)
	if !ok {
		return Session{}, false
	}
	return m.Session(s.ID)
}

func (m *Machine) sessionByLease(lease int64) (*sessionState, bool) {
	if id, ok := m.leaseIDs[lease]; ok {
		return m.sessions[id], true
	}
	s, ok := m.sessions[lease]
	if !ok || s.LeaseID != 0 {
		return nil, false
	}
	return s, true
}

// SessionKeys returns the keys bound to a session, sorted.
func (m *Machine) SessionKeys(id int64) []string {
	s, ok := m.sessions[id]
	if !ok {
		return nil
	}
	return slices.Sorted(maps.Keys(s.keySet()))
}

// SessionHoldings returns what a session holds and waits for, sorted, and
// how many keys are bound to it.
func (m *Machine) SessionHoldings(id int64) (held, waiting []LeaseID, keys int) {
	s, ok := m.sessions[id]
	if !ok {
		return nil, nil, 0
	}
	return s.heldIDs(), sortedLeaseIDs(s.waitingSet()), len(s.keySet())
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
