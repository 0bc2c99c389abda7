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
		if i := slices.IndexFunc(l.Holders, func(g Grant) bool { return g.SessionID == s.ID }); i >= 0 {
			g := l.Holders[i]
			return Result{Lease: cloneLease(l), Grant: &g}
		}
		if s.isWaiting(c.Lease) {
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
		m.leases.put(l)
	}
	if !free {
		if len(l.Holders) == 0 && len(l.Waiters) == 0 {
			// An idle lease in its lock-delay: the first waiter sets the
			// capacity, as a grant would, so later acquires that ask for
			// the same capacity do not fail with ErrCapacityMismatch.
			l.Capacity = capacity
		}
		s.wait(l.LeaseID)
		l.GCAfter = c.GCAfter
		l.Waiters = append(l.Waiters, Waiter{SessionID: s.ID, Holder: s.Identity, Since: m.now, Value: c.Value, Exclusive: c.Exclusive, MaxHold: c.MaxHold})
		l.ModRevision = m.emit(Event{Type: EventLeaseWaiting, Lease: l.LeaseID, SessionID: s.ID, Holder: s.Identity})
		m.askStepDown(l)
		return Result{Lease: cloneLease(l), Queued: true}
	}
	l.Capacity = capacity
	l.LockDelay = c.LockDelay
	l.GCAfter = c.GCAfter
	if c.Labels != nil {
		l.Labels = cloneLabels(c.Labels)
	}
	g := m.grant(l, s, c.Value, c.Exclusive, c.MaxHold, exists)
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
func (m *Machine) grant(l *Lease, s *sessionState, value string, exclusive bool, maxHold int64, transition bool) Grant {
	token := m.emit(Event{Type: EventLeaseAcquired, Lease: l.LeaseID, SessionID: s.ID, Holder: s.Identity, Value: value})
	g := Grant{SessionID: s.ID, Holder: s.Identity, Token: token, AcquireTime: m.now, RenewTime: m.now, Value: value, Exclusive: exclusive, MaxHold: maxHold}
	m.events[len(m.events)-1].Token = token
	l.Holders = append(l.Holders, g)
	l.ModRevision = token
	if transition {
		l.Transitions++
	}
	s.hold(l)
	return g
}

// grantWaiters fills free places from the head of the queue, in the same
// command that freed them: no polling, and only the granted waiter wakes.
// It stops at the first waiter that does not fit, so a waiting writer is
// not overtaken by readers queued behind it. A waiter with the lease's
// preferred identity is the head, wherever it queued.
func (m *Machine) grantWaiters(l *Lease) {
	for len(l.Waiters) > 0 && l.DelayRevision == 0 {
		i := max(l.preferredWaiter(), 0)
		w := l.Waiters[i]
		if !fits(l.Holders, l.Capacity, w.Exclusive) {
			return
		}
		l.Waiters = slices.Delete(l.Waiters, i, i+1)
		s := m.sessions[w.SessionID]
		s.unwait(l.LeaseID)
		m.grant(l, s, w.Value, w.Exclusive, w.MaxHold, true)
	}
}

// preferredWaiter is the index of the first waiter with the preferred
// identity, or -1.
func (l *Lease) preferredWaiter() int {
	if l.PreferredHolder == "" {
		return -1
	}
	return slices.IndexFunc(l.Waiters, func(w Waiter) bool { return w.Holder == l.PreferredHolder })
}

// askStepDown asks the holders in the preferred waiter's way to step
// down, once each: the oldest grants, as many as must go for it to fit.
// Nothing is taken from them. A holder that has the preferred identity
// itself (another session of it) is never asked.
func (m *Machine) askStepDown(l *Lease) {
	i := l.preferredWaiter()
	if i < 0 || slices.ContainsFunc(l.Holders, func(g Grant) bool { return g.Holder == l.PreferredHolder }) {
		return
	}
	in := len(l.Holders) // in the way
	if !l.Waiters[i].Exclusive && !slices.ContainsFunc(l.Holders, func(g Grant) bool { return g.Exclusive }) {
		in = len(l.Holders) - l.Capacity + 1
	}
	reason := "preferred holder " + l.PreferredHolder + " is waiting"
	for j := range min(in, len(l.Holders)) {
		g := &l.Holders[j]
		if g.StepDown != "" {
			continue
		}
		g.StepDown = reason
		l.ModRevision = m.emit(Event{Type: EventLeaseStepDown, Lease: l.LeaseID, SessionID: g.SessionID, Holder: g.Holder, Token: g.Token, Reason: reason})
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
	g := &l.Holders[i]
	if g.StepDown == "" {
		g.StepDown = c.Reason
		l.ModRevision = m.emit(Event{Type: EventLeaseStepDown, Lease: l.LeaseID, SessionID: g.SessionID, Holder: g.Holder, Token: g.Token, Reason: c.Reason})
	}
	return Result{Lease: cloneLease(l)}
}

func (m *Machine) setPreferred(c SetPreferred) Result {
	if !m.atLeast(2) {
		return Result{Err: fmt.Errorf("%w: preferred holders need cluster version 2, the cluster runs %d: upgrade every member", ErrNotSupported, m.ClusterVersion())}
	}
	l, ok := m.leases.get(c.Lease)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrLeaseNotFound, c.Lease)}
	}
	if l.PreferredHolder == c.Identity {
		return Result{Lease: cloneLease(l)}
	}
	l.PreferredHolder = c.Identity
	reason := "preferred holder cleared"
	if c.Identity != "" {
		reason = "preferred holder set"
	}
	l.ModRevision = m.emit(Event{Type: EventLeasePreferred, Lease: l.LeaseID, Holder: c.Identity, Reason: reason})
	// Another head of the queue may fit where the old one did not.
	m.grantWaiters(l)
	m.askStepDown(l)
	return Result{Lease: cloneLease(l)}
}

func (m *Machine) collectLeases(c CollectLeases) Result {
	if c.Epoch != m.epoch || !m.atLeast(2) {
		return Result{} // proposed by an earlier leader, or too early to run
	}
	for _, il := range c.Leases {
		l, ok := m.leases.get(il.Lease)
		if !ok || !l.Idle() || l.GCAfter <= 0 || l.ModRevision != il.Revision {
			continue // gone, busy again, or changed since it was timed
		}
		m.leases.delete(il.Lease)
		m.usage.Leases -= l.cost
		ev := Event{Type: EventLeaseDeleted, Lease: il.Lease, Reason: "idle for " + time.Duration(l.GCAfter).String()}
		if l.Last != nil {
			ev.Holder, ev.Token = l.Last.Holder, l.Last.Token
		}
		m.emit(ev)
	}
	return Result{}
}

func (m *Machine) findHolder(id LeaseID, token int64) (*Lease, int, error) {
	l, ok := m.leases.get(id)
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
	if err := m.actOnGrant(c.Actor, l.LeaseID, l.Holders[i], "release", true); err != nil {
		return Result{Err: err}
	}
	m.removeHolder(l, i, EventLeaseReleased, "released")
	m.grantWaiters(l)
	return Result{Lease: cloneLease(l)}
}

func (m *Machine) removeHolder(l *Lease, i int, typ EventType, reason string) Grant {
	g := l.Holders[i]
	l.Holders = slices.Delete(l.Holders, i, i+1)
	m.sessions[g.SessionID].unhold(l)
	how := EndReleased
	if typ == EventLeaseRevoked {
		how = EndRevoked
	}
	l.Last = ended(g, how, reason, m.now, m.now)
	l.ModRevision = m.emit(Event{Type: typ, Lease: l.LeaseID, SessionID: g.SessionID, Holder: g.Holder, Token: g.Token, Reason: reason})
	return g
}

func (m *Machine) setValue(c SetValue) Result {
	l, i, err := m.findHolder(c.Lease, c.Token)
	if err != nil {
		return Result{Err: err}
	}
	if err := m.actOnGrant(c.Actor, l.LeaseID, l.Holders[i], "set the value of", false); err != nil {
		return Result{Err: err}
	}
	g := &l.Holders[i]
	g.Value = c.Value
	g.RenewTime = m.now
	l.ModRevision = m.emit(Event{Type: EventLeaseValueSet, Lease: l.LeaseID, SessionID: g.SessionID, Holder: g.Holder, Token: g.Token, Value: c.Value})
	return Result{Lease: cloneLease(l)}
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
		l.Waiters = slices.DeleteFunc(l.Waiters, func(w Waiter) bool { return w.SessionID == s.ID })
		l.ModRevision = m.emit(Event{Type: EventLeaseWaitEnded, Lease: c.Lease, SessionID: s.ID, Holder: s.Identity, Reason: "wait cancelled"})
		if m.atLeast(2) {
			m.grantWaiters(l) // the waiter may have been the head
		}
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
		l, ok := m.leases.get(d.Lease)
		if !ok || l.DelayRevision == 0 || l.DelayRevision != d.Revision {
			continue
		}
		l.DelayRevision = 0
		l.ModRevision = m.emit(Event{Type: EventLockDelayEnded, Lease: l.LeaseID})
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
	return *cloneLease(l), true
}

// Leases returns copies of the leases in a namespace ("" for all), sorted
// by namespace and name.
func (m *Machine) Leases(namespace string) []Lease {
	var out []Lease
	for l := range m.leases.in(namespace) {
		out = append(out, *cloneLease(l))
	}
	slices.SortFunc(out, func(a, b Lease) int { return compareLeaseID(a.LeaseID, b.LeaseID) })
	return out
}

func cloneLease(l *Lease) *Lease {
	out := *l
	out.cost = 0
	out.Holders = slices.Clone(l.Holders)
	out.Waiters = slices.Clone(l.Waiters)
	out.Labels = cloneLabels(l.Labels)
	if l.Last != nil {
		last := *l.Last
		out.Last = &last
	}
	return &out
}

// ended records how grant g ended.
func ended(g Grant, how Ending, reason string, renew, end int64) *EndedGrant {
	return &EndedGrant{
		SessionID:   g.SessionID,
		Holder:      g.Holder,
		Token:       g.Token,
		AcquireTime: g.AcquireTime,
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
		for _, g := range l.Holders {
			if g.MaxHold > 0 {
				out = append(out, MaxHoldGrant{Lease: l.LeaseID, Token: g.Token, Holder: g.Holder, AcquireTime: g.AcquireTime, MaxHold: g.MaxHold, AskedToStep: g.StepDown != ""})
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
	v, ok := l.Labels[key]
	return v, ok
}
