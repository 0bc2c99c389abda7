package statemachine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

func (m *Machine) acquire(c Acquire) Result {
	s, ok := m.sessions[c.SessionID]
	if !ok {
		return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
	}
	if err := m.actAs(c.Actor, s, "acquire for", false); err != nil {
		return Result{Err: err}
	}
	capacity := max(c.Capacity, 1)
	l, exists := m.leases.get(c.Lease)
	if exists {
		if i := l.holderOf(s.ID); i >= 0 {
			g := l.holders[i].grant()
			return Result{Lease: l.public(), Grant: &g}
		}
		if s.isWaiting(c.Lease) {
			return Result{Lease: l.public(), Queued: true}
		}
		busy := len(l.holders) > 0 || len(l.waiters()) > 0
		if capacity != l.capacity && busy {
			return Result{Err: fmt.Errorf("%w: %s has capacity %d, the request asks for %d", ErrCapacityMismatch, c.Lease, l.capacity, capacity)}
		}
	}
	free := !exists || (len(l.waiters()) == 0 && l.delayRevision() == 0 && fits(l.holders, capacity, c.Exclusive))
	if !free && !c.Wait {
		if l.delayRevision() != 0 {
			return Result{Err: fmt.Errorf("%w: %s is in its lock-delay after an expired holder", ErrLocked, c.Lease)}
		}
		return Result{Err: fmt.Errorf("%w: %s is held by %s", ErrLocked, c.Lease, holderNames(l))}
	}
	if !free && c.MaxWaiters > 0 && len(l.waiters()) >= c.MaxWaiters {
		return Result{Err: fmt.Errorf("%w: %s has %d waiters (limit %d)", ErrTooManyWaiters, c.Lease, len(l.waiters()), c.MaxWaiters)}
	}

	// From here on the command succeeds.
	if !exists {
		l = &lease{LeaseID: c.Lease, capacity: capacity, createRev: m.revision + 1}
		m.leases.put(l)
	}
	if !free {
		if len(l.holders) == 0 && len(l.waiters()) == 0 {
			// An idle lease in its lock-delay: the first waiter sets the
			// capacity, as a grant would, so later acquires that ask for
			// the same capacity do not fail with ErrCapacityMismatch.
			l.capacity = capacity
		}
		s.wait(l.LeaseID)
		l.gcAfter = c.GCAfter
		l.setWaiters(append(l.waiters(), Waiter{SessionID: s.ID, Holder: s.Identity, Since: m.now, Value: c.Value, Exclusive: c.Exclusive, MaxHold: c.MaxHold}))
		l.modRev = m.emit(Event{Type: EventLeaseWaiting, Lease: l.LeaseID, SessionID: s.ID, Holder: s.Identity})
		m.askStepDown(l)
		return Result{Lease: l.public(), Queued: true}
	}
	l.capacity = capacity
	l.setLockDelay(c.LockDelay)
	l.gcAfter = c.GCAfter
	if c.Labels != nil {
		l.setLabels(cloneLabels(c.Labels))
	}
	g := m.grant(l, s, c.Value, c.Exclusive, c.MaxHold, exists)
	return Result{Lease: l.public(), Grant: &g}
}

// fits reports whether one more grant fits beside holders: an exclusive
// grant only on an empty lease, a shared one while no exclusive grant is
// held and the capacity allows.
func fits(holders []holder, capacity int, exclusive bool) bool {
	if exclusive {
		return len(holders) == 0
	}
	return len(holders) < capacity && !slices.ContainsFunc(holders, func(h holder) bool { return h.exclusive() })
}

// grant makes s a holder of l at a new revision: the fencing token.
func (m *Machine) grant(l *lease, s *sessionState, value string, exclusive bool, maxHold int64, transition bool) Grant {
	token := m.emit(Event{Type: EventLeaseAcquired, Lease: l.LeaseID, SessionID: s.ID, Holder: s.Identity, Value: value})
	g := Grant{SessionID: s.ID, Holder: s.Identity, Token: token, AcquireTime: m.now, RenewTime: m.now, Value: value, Exclusive: exclusive, MaxHold: maxHold}
	m.events[len(m.events)-1].Token = token
	l.holders = append(l.holders, holderOfGrant(g))
	l.modRev = token
	if transition {
		l.transitions++
	}
	s.hold(l)
	return g
}

// grantWaiters fills free places from the head of the queue, in the same
// command that freed them: no polling, and only the granted waiter wakes.
// It stops at the first waiter that does not fit, so a waiting writer is
// not overtaken by readers queued behind it. A waiter with the lease's
// preferred identity is the head, wherever it queued.
func (m *Machine) grantWaiters(l *lease) {
	for len(l.waiters()) > 0 && l.delayRevision() == 0 {
		i := max(l.preferredWaiter(), 0)
		w := l.waiters()[i]
		if !fits(l.holders, l.capacity, w.Exclusive) {
			return
		}
		l.setWaiters(slices.Delete(l.waiters(), i, i+1))
		s := m.sessions[w.SessionID]
		s.unwait(l.LeaseID)
		m.grant(l, s, w.Value, w.Exclusive, w.MaxHold, true)
	}
}

// preferredWaiter is the index of the first waiter with the preferred
// identity, or -1.
func (l *lease) preferredWaiter() int {
	preferred := l.preferredHolder()
	if preferred == "" {
		return -1
	}
	return slices.IndexFunc(l.waiters(), func(w Waiter) bool { return w.Holder == preferred })
}

// askStepDown asks the holders in the preferred waiter's way to step
// down, once each: the oldest grants, as many as must go for it to fit.
// Nothing is taken from them. A holder that has the preferred identity
// itself (another session of it) is never asked.
func (m *Machine) askStepDown(l *lease) {
	i := l.preferredWaiter()
	preferred := l.preferredHolder()
	if i < 0 || slices.ContainsFunc(l.holders, func(h holder) bool { return h.identity == preferred }) {
		return
	}
	in := len(l.holders) // in the way
	if !l.waiters()[i].Exclusive && !slices.ContainsFunc(l.holders, func(h holder) bool { return h.exclusive() }) {
		in = len(l.holders) - l.capacity + 1
	}
	reason := "preferred holder " + preferred + " is waiting"
	for j := range min(in, len(l.holders)) {
		h := &l.holders[j]
		if h.stepDown() != "" {
			continue
		}
		h.setStepDown(reason)
		l.modRev = m.emit(Event{Type: EventLeaseStepDown, Lease: l.LeaseID, SessionID: h.sessionID, Holder: h.identity, Token: h.token, Reason: reason})
	}
}

func (m *Machine) askStepDownCmd(c AskStepDown) Result {
	if !m.atLeast(3) {
		return Result{Err: fmt.Errorf("%w: max hold needs cluster version 3, the cluster runs %d: upgrade every member", ErrNotSupported, m.ClusterVersion())}
	}
	l, i, err := m.findHolder(c.Lease, c.Token)
	if err != nil {
		return Result{Err: err}
	}
	h := &l.holders[i]
	if h.stepDown() == "" {
		h.setStepDown(c.Reason)
		l.modRev = m.emit(Event{Type: EventLeaseStepDown, Lease: l.LeaseID, SessionID: h.sessionID, Holder: h.identity, Token: h.token, Reason: c.Reason})
	}
	return Result{Lease: l.public()}
}

func (m *Machine) setPreferred(c SetPreferred) Result {
	if !m.atLeast(2) {
		return Result{Err: fmt.Errorf("%w: preferred holders need cluster version 2, the cluster runs %d: upgrade every member", ErrNotSupported, m.ClusterVersion())}
	}
	l, ok := m.leases.get(c.Lease)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	}
	if l.preferredHolder() == c.Identity {
		return Result{Lease: l.public()}
	}
	l.setPreferredHolder(c.Identity)
	reason := "preferred holder cleared"
	if c.Identity != "" {
		reason = "preferred holder set"
	}
	l.modRev = m.emit(Event{Type: EventLeasePreferred, Lease: l.LeaseID, Holder: c.Identity, Reason: reason})
	// Another head of the queue may fit where the old one did not.
	m.grantWaiters(l)
	m.askStepDown(l)
	return Result{Lease: l.public()}
}

func (m *Machine) collectLeases(c CollectLeases) Result {
	if c.Epoch != m.epoch || !m.atLeast(2) {
		return Result{} // proposed by an earlier leader, or too early to run
	}
	for _, il := range c.Leases {
		l, ok := m.leases.get(il.Lease)
		if !ok || !l.Idle() || l.gcAfter <= 0 || l.modRev != il.Revision {
			continue // gone, busy again, or changed since it was timed
		}
		m.leases.delete(il.Lease)
		m.usage.Leases -= l.cost
		ev := Event{Type: EventLeaseDeleted, Lease: il.Lease, Reason: "idle for " + time.Duration(l.gcAfter).String()}
		if l.last != nil {
			ev.Holder, ev.Token = l.last.Holder, l.last.Token
		}
		m.emit(ev)
	}
	return Result{}
}

func (m *Machine) findHolder(id LeaseID, token int64) (*lease, int, error) {
	l, ok := m.leases.get(id)
	if !ok {
		return nil, 0, fmt.Errorf("%w: %s", ErrLeaseNotFound, id)
	}
	i := slices.IndexFunc(l.holders, func(h holder) bool { return h.token == token })
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
	if err := m.actOnGrant(c.Actor, l.LeaseID, &l.holders[i], "release", true); err != nil {
		return Result{Err: err}
	}
	m.removeHolder(l, i, EventLeaseReleased, "released")
	m.grantWaiters(l)
	return Result{Lease: l.public()}
}

func (m *Machine) removeHolder(l *lease, i int, typ EventType, reason string) holder {
	h := l.holders[i]
	l.removeHolderAt(i)
	m.sessions[h.sessionID].unhold(l)
	how := EndReleased
	if typ == EventLeaseRevoked {
		how = EndRevoked
	}
	l.last = ended(&h, how, reason, m.now, m.now)
	l.modRev = m.emit(Event{Type: typ, Lease: l.LeaseID, SessionID: h.sessionID, Holder: h.identity, Token: h.token, Reason: reason})
	return h
}

func (m *Machine) setValue(c SetValue) Result {
	l, i, err := m.findHolder(c.Lease, c.Token)
	if err != nil {
		return Result{Err: err}
	}
	h := &l.holders[i]
	if err := m.actOnGrant(c.Actor, l.LeaseID, h, "set the value of", false); err != nil {
		return Result{Err: err}
	}
	h.value = c.Value
	h.renewTime = m.now
	l.modRev = m.emit(Event{Type: EventLeaseValueSet, Lease: l.LeaseID, SessionID: h.sessionID, Holder: h.identity, Token: h.token, Value: c.Value})
	return Result{Lease: l.public()}
}

func (m *Machine) revoke(c Revoke) Result {
	l, ok := m.leases.get(c.Lease)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	}
	if c.Token != 0 {
		if _, _, err := m.findHolder(c.Lease, c.Token); err != nil {
			return Result{Err: err}
		}
	} else if len(l.holders) == 0 {
		return Result{Err: fmt.Errorf("%w: %s has no holders to revoke", ErrNotHolder, c.Lease)}
	}
	reason := c.Reason
	if reason == "" {
		reason = "revoked"
	}
	var revoked []int64
	for i := 0; i < len(l.holders); {
		if c.Token != 0 && l.holders[i].token != c.Token {
			i++
			continue
		}
		h := m.removeHolder(l, i, EventLeaseRevoked, reason)
		revoked = append(revoked, h.token)
		// A revoked holder did not stop by itself and may still be
		// working: like an expired one, it gets the lease's lock-delay
		// to notice before anyone else is granted.
		if d := l.lockDelay(); d > 0 {
			l.setDelayRevision(l.modRev)
			m.events[len(m.events)-1].LockDelay = d
		}
	}
	m.grantWaiters(l)
	return Result{Lease: l.public(), Revoked: revoked}
}

func (m *Machine) cancelWait(c CancelWait) Result {
	l, ok := m.leases.get(c.Lease)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	}
	s, ok := m.sessions[c.SessionID]
	if !ok {
		return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
	}
	if err := m.actAs(c.Actor, s, "cancel the wait of", false); err != nil {
		return Result{Err: err}
	}
	if s.isWaiting(c.Lease) {
		s.unwait(c.Lease)
		l.dropWaiter(s.ID)
		l.modRev = m.emit(Event{Type: EventLeaseWaitEnded, Lease: c.Lease, SessionID: s.ID, Holder: s.Identity, Reason: "wait cancelled"})
		if m.atLeast(2) {
			m.grantWaiters(l) // the waiter may have been the head
		}
		return Result{Lease: l.public()}
	}
	i := l.holderOf(s.ID)
	if i < 0 {
		return Result{Err: fmt.Errorf("%w: session %d is not queued for %s", ErrNotWaiting, s.ID, c.Lease)}
	}
	if !c.ReleaseIfHeld {
		g := l.holders[i].grant()
		return Result{Lease: l.public(), Grant: &g}
	}
	m.removeHolder(l, i, EventLeaseReleased, "wait cancelled")
	m.grantWaiters(l)
	return Result{Lease: l.public()}
}

func (m *Machine) endLockDelays(c EndLockDelays) Result {
	if c.Epoch != m.epoch {
		return Result{}
	}
	for _, d := range c.Delays {
		l, ok := m.leases.get(d.Lease)
		if !ok || l.delayRevision() == 0 || l.delayRevision() != d.Revision {
			continue
		}
		l.setDelayRevision(0)
		l.modRev = m.emit(Event{Type: EventLockDelayEnded, Lease: l.LeaseID})
		m.grantWaiters(l)
	}
	return Result{}
}

// Lease returns a copy of a lease.
func (m *Machine) Lease(id LeaseID) (Lease, bool) {
	l, ok := m.leases.get(id)
	if !ok {
		return Lease{}, false
	}
	return *l.public(), true
}

// Leases returns copies of the leases in a namespace ("" for all), sorted
// by namespace and name.
func (m *Machine) Leases(namespace string) []Lease {
	var out []Lease
	for l := range m.leases.in(namespace) {
		out = append(out, *l.public())
	}
	slices.SortFunc(out, func(a, b Lease) int { return compareLeaseID(a.LeaseID, b.LeaseID) })
	return out
}

// ended records how grant h ended.
func ended(h *holder, how Ending, reason string, renew, end int64) *EndedGrant {
	return &EndedGrant{
		SessionID:   h.sessionID,
		Holder:      h.identity,
		Token:       h.token,
		AcquireTime: h.acquireTime,
		RenewTime:   renew,
		EndTime:     end,
		Ended:       how,
		Reason:      reason,
	}
}

func compareLeaseID(a, b LeaseID) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

func sortedLeaseIDs(set map[LeaseID]struct{}) []LeaseID {
	return slices.SortedFunc(maps.Keys(set), compareLeaseID)
}

func holderNames(l *lease) string {
	names := make([]string, len(l.holders))
	for i, h := range l.holders {
		names[i] = h.identity
	}
	return strings.Join(names, ", ")
}

func currentTokens(l *lease) string {
	if len(l.holders) == 0 {
		return "it has no holder"
	}
	toks := make([]string, len(l.holders))
	for i, h := range l.holders {
		toks[i] = fmt.Sprint(h.token)
	}
	return "current token " + strings.Join(toks, ", ")
}

// MaxHoldGrant is a grant with a max hold, for the leader to time.
type MaxHoldGrant struct {
	Lease       LeaseID
	Token       int64
	Holder      string
	AcquireTime int64
	MaxHold     int64
	AskedToStep bool // already asked to step down, for whatever reason
}

// MaxHoldGrants lists the grants that have a max hold, in no order. It
// reads without copying the leases, so the leader can look every second.
func (m *Machine) MaxHoldGrants() []MaxHoldGrant {
	var out []MaxHoldGrant
	for l := range m.leases.all() {
		for i := range l.holders {
			if h := &l.holders[i]; h.maxHold() > 0 {
				out = append(out, MaxHoldGrant{Lease: l.LeaseID, Token: h.token, Holder: h.identity, AcquireTime: h.acquireTime, MaxHold: h.maxHold(), AskedToStep: h.stepDown() != ""})
			}
		}
	}
	return out
}

// LeaseLabel is one label of a lease, read without copying the lease.
func (m *Machine) LeaseLabel(id LeaseID, key string) (string, bool) {
	l, ok := m.leases.get(id)
	if !ok {
		return "", false
	}
	v, ok := l.labels()[key]
	return v, ok
}
