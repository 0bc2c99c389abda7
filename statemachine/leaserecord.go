package statemachine

import "slices"

// lease is the machine's own record of a lease, sized for the common
// case: a lock or an election with one holder, no waiters, labels,
// lock-delay or preferred holder. What only some leases have lives
// behind one pointer, made on first use (leaseRare), and so does what
// only some grants have (holderRare). Lease, the public form with every
// field, is built for results, reads and snapshots (public); the record
// is never handed out.
//
// A held lock cost the machine a 192-byte Lease and a 96-byte Grant;
// it costs a 128-byte record and an 80-byte holder (docs/benchmarks.md,
// "Memory per held lock").
type lease struct {
	LeaseID
	holders     []holder
	capacity    int
	transitions int64
	createRev   int64
	modRev      int64
	// gcAfter and idleSince are Lease's GCAfter and IdleSince: every
	// acquire sets the first (the server's default is an hour).
	gcAfter   int64
	idleSince int64
	last      *EndedGrant
	// cost is the record's share of Usage.Leases as last counted
	// (countLeases).
	cost int64
	rare *leaseRare
}

// leaseRare is what few leases have.
type leaseRare struct {
	waiters         []Waiter
	labels          map[string]string
	lockDelay       int64
	delayRevision   int64
	preferredHolder string
}

// holder is a current grant of a lease.
type holder struct {
	sessionID   int64
	token       int64
	acquireTime int64
	renewTime   int64
	identity    string
	value       string
	rare        *holderRare
}

// holderRare is what few grants have: see Grant.
type holderRare struct {
	exclusive bool
	stepDown  string
	maxHold   int64
}

func (l *lease) waiters() []Waiter {
	if l.rare == nil {
		return nil
	}
	return l.rare.waiters
}

func (l *lease) labels() map[string]string {
	if l.rare == nil {
		return nil
	}
	return l.rare.labels
}

func (l *lease) lockDelay() int64 {
	if l.rare == nil {
		return 0
	}
	return l.rare.lockDelay
}

func (l *lease) delayRevision() int64 {
	if l.rare == nil {
		return 0
	}
	return l.rare.delayRevision
}

func (l *lease) preferredHolder() string {
	if l.rare == nil {
		return ""
	}
	return l.rare.preferredHolder
}

// more is the record's rare part, made if it has none.
func (l *lease) more() *leaseRare {
	if l.rare == nil {
		l.rare = &leaseRare{}
	}
	return l.rare
}

// setWaiters, setLabels, setLockDelay, setDelayRevision and
// setPreferredHolder make the rare part only to hold something, and
// drop it once it holds nothing.
func (l *lease) setWaiters(w []Waiter) {
	if len(w) == 0 {
		w = nil
	}
	if w != nil || l.rare != nil {
		l.more().waiters = w
	}
	l.tidy()
}

func (l *lease) setLabels(labels map[string]string) {
	if labels != nil || l.rare != nil {
		l.more().labels = labels
	}
	l.tidy()
}

func (l *lease) setLockDelay(d int64) {
	if d != 0 || l.rare != nil {
		l.more().lockDelay = d
	}
	l.tidy()
}

func (l *lease) setDelayRevision(rev int64) {
	if rev != 0 || l.rare != nil {
		l.more().delayRevision = rev
	}
	l.tidy()
}

func (l *lease) setPreferredHolder(identity string) {
	if identity != "" || l.rare != nil {
		l.more().preferredHolder = identity
	}
	l.tidy()
}

func (l *lease) tidy() {
	if r := l.rare; r != nil && r.waiters == nil && r.labels == nil && r.lockDelay == 0 &&
		r.delayRevision == 0 && r.preferredHolder == "" {
		l.rare = nil
	}
}

// Idle reports whether nothing holds, waits for or delays the lease.
func (l *lease) Idle() bool {
	return len(l.holders) == 0 && len(l.waiters()) == 0 && l.delayRevision() == 0
}

// holderOf is the index of the holder that session id is, or -1.
func (l *lease) holderOf(id int64) int {
	return slices.IndexFunc(l.holders, func(h holder) bool { return h.sessionID == id })
}

// dropWaiter takes session id out of the queue.
func (l *lease) dropWaiter(id int64) {
	l.setWaiters(slices.DeleteFunc(l.waiters(), func(w Waiter) bool { return w.SessionID == id }))
}

// removeHolderAt drops holder i; an empty lease keeps no backing array.
func (l *lease) removeHolderAt(i int) {
	l.holders = slices.Delete(l.holders, i, i+1)
	if len(l.holders) == 0 {
		l.holders = nil
	}
}

func (h *holder) exclusive() bool { return h.rare != nil && h.rare.exclusive }

func (h *holder) stepDown() string {
	if h.rare == nil {
		return ""
	}
	return h.rare.stepDown
}

func (h *holder) maxHold() int64 {
	if h.rare == nil {
		return 0
	}
	return h.rare.maxHold
}

func (h *holder) setStepDown(reason string) {
	if h.rare == nil {
		h.rare = &holderRare{}
	}
	h.rare.stepDown = reason
}

// grant is h in its public form.
func (h *holder) grant() Grant {
	return Grant{
		SessionID: h.sessionID, Holder: h.identity, Token: h.token,
		AcquireTime: h.acquireTime, RenewTime: h.renewTime, Value: h.value,
		Exclusive: h.exclusive(), StepDown: h.stepDown(), MaxHold: h.maxHold(),
	}
}

// holderOfGrant is g as the record keeps it.
func holderOfGrant(g Grant) holder {
	h := holder{
		sessionID: g.SessionID, token: g.Token, acquireTime: g.AcquireTime,
		renewTime: g.RenewTime, identity: g.Holder, value: g.Value,
	}
	if g.Exclusive || g.StepDown != "" || g.MaxHold != 0 {
		h.rare = &holderRare{exclusive: g.Exclusive, stepDown: g.StepDown, maxHold: g.MaxHold}
	}
	return h
}

// public is the lease in its public form, sharing nothing with the
// record.
func (l *lease) public() *Lease {
	out := &Lease{
		LeaseID:         l.LeaseID,
		Capacity:        l.capacity,
		Waiters:         slices.Clone(l.waiters()),
		Transitions:     l.transitions,
		Labels:          cloneLabels(l.labels()),
		LockDelay:       l.lockDelay(),
		DelayRevision:   l.delayRevision(),
		CreateRevision:  l.createRev,
		ModRevision:     l.modRev,
		GCAfter:         l.gcAfter,
		IdleSince:       l.idleSince,
		PreferredHolder: l.preferredHolder(),
	}
	if len(l.holders) > 0 {
		out.Holders = make([]Grant, len(l.holders))
		for i := range l.holders {
			out.Holders[i] = l.holders[i].grant()
		}
	}
	if l.last != nil {
		last := *l.last
		out.Last = &last
	}
	return out
}

// recordOf is p as the machine keeps it; it shares p's labels, waiters
// and last grant, so p must not be used after.
func recordOf(p *Lease) *lease {
	l := &lease{
		LeaseID: p.LeaseID, capacity: p.Capacity, transitions: p.Transitions,
		createRev: p.CreateRevision, modRev: p.ModRevision,
		gcAfter: p.GCAfter, idleSince: p.IdleSince, last: p.Last,
	}
	if len(p.Holders) > 0 {
		l.holders = make([]holder, len(p.Holders))
		for i, g := range p.Holders {
			l.holders[i] = holderOfGrant(g)
		}
	}
	l.setWaiters(p.Waiters)
	l.setLabels(p.Labels)
	l.setLockDelay(p.LockDelay)
	l.setDelayRevision(p.DelayRevision)
	l.setPreferredHolder(p.PreferredHolder)
	return l
}
