package client

import (
	"context"
)

// Grant is what a Mutex, Semaphore, RWMutex or Election holds: the
// session's current grant of a lease, with its fencing token and the
// signals of its end. Each of them embeds a Grant, so they answer these
// questions the same way.
//
// Hold the grant only while Valid is true, and stop the protected work
// when Lost fires or Context is cancelled: a grant can end without a
// release (the session's heartbeats stopped being acknowledged, or an
// operator revoked it).
type Grant struct {
	h *holder // the shared (or only) side
	// x is an RWMutex's exclusive side, nil for the others; the Grant
	// answers for whichever side holds.
	x *holder
}

func (g Grant) held() *holder {
	if g.x != nil {
		if t, _, _ := g.x.current(); t != 0 {
			return g.x
		}
	}
	return g.h
}

// Token is the current grant's fencing token with its lease name (Token
// 0 when nothing is held), and whether the grant is valid now (see
// Valid). Read both from one call: a grant can end, and another begin,
// between two.
func (g Grant) Token() (Token, bool) { return g.held().fenceToken() }

// Valid reports whether a grant is held and the session still certainly
// keeps it (see Session.Valid).
func (g Grant) Valid() bool { return g.held().valid() }

// Lost is closed when the current grant ends: lost, revoked or given
// back. Before the first grant it is already closed.
func (g Grant) Lost() <-chan struct{} { _, _, l := g.held().current(); return l }

// Context is cancelled when the current grant ends, with the cause; run
// the protected work under it. TokenFromContext reads its token.
func (g Grant) Context() context.Context { _, c, _ := g.held().current(); return c }

// Lease is the name of the lease the grant is of.
func (g Grant) Lease() LeaseName { return g.h.lease }

// Mutex is a distributed lock held by a session. Lock waits in the
// server's FIFO queue; each grant has a fencing token to hand to the
// resources the holder writes to. A Mutex is safe for concurrent use:
// goroutines sharing the session take turns.
//
// Its Grant says whether the lock is still held. Call Unlock after a
// loss too: it returns nil and lets the session's other goroutines take
// their turn.
type Mutex struct{ Grant }

// Mutex returns the lock named name (in the default namespace unless
// WithNamespace says otherwise).
func (s *Session) Mutex(name string, opts ...LeaseOption) *Mutex {
	return &Mutex{Grant{h: newHolder(s, name, 1, false, opts)}}
}

// Lock waits until the lock is granted to this session or ctx ends.
func (m *Mutex) Lock(ctx context.Context) error { return m.h.acquire(ctx, true, "") }

// TryLock takes the lock if it is free, or returns ErrLocked.
func (m *Mutex) TryLock(ctx context.Context) error { return m.h.acquire(ctx, false, "") }

// Unlock releases the grant named by its token. A grant that was already
// lost counts as released.
func (m *Mutex) Unlock(ctx context.Context) error { return m.h.release(ctx) }

// Semaphore lets up to capacity sessions hold it at once, each with its
// own fencing token. Its Grant is this session's place.
type Semaphore struct{ Grant }

// Semaphore returns the semaphore named name with the given capacity;
// every user of the name must agree on the capacity.
func (s *Session) Semaphore(name string, capacity int, opts ...LeaseOption) *Semaphore {
	return &Semaphore{Grant{h: newHolder(s, name, capacity, false, opts)}}
}

// Acquire waits for a place.
func (m *Semaphore) Acquire(ctx context.Context) error { return m.h.acquire(ctx, true, "") }

// TryAcquire takes a place if one is free, or returns ErrLocked.
func (m *Semaphore) TryAcquire(ctx context.Context) error { return m.h.acquire(ctx, false, "") }

// Release gives the place back.
func (m *Semaphore) Release(ctx context.Context) error { return m.h.release(ctx) }

// rwCapacity bounds how many sessions may read-lock one RWMutex at once.
const rwCapacity = 1000

// RWMutex is a readers-writer lock: any number of sessions read at once
// (up to 1000), a writer holds it alone. The server's queue is FIFO, so
// a waiting writer is not starved by a stream of readers: readers that
// arrive after it wait for it. Within one session, readers and writers
// take turns, since a session holds one grant per lock. Its Grant is
// whichever grant, shared or exclusive, the session holds.
type RWMutex struct{ Grant }

// RWMutex returns the readers-writer lock named name.
func (s *Session) RWMutex(name string, opts ...LeaseOption) *RWMutex {
	return &RWMutex{Grant{
		h: newHolder(s, name, rwCapacity, false, opts),
		x: newHolder(s, name, rwCapacity, true, opts),
	}}
}

// RLock waits for a shared grant.
func (m *RWMutex) RLock(ctx context.Context) error { return m.h.acquire(ctx, true, "") }

// RUnlock releases the shared grant.
func (m *RWMutex) RUnlock(ctx context.Context) error { return m.h.release(ctx) }

// Lock waits for the exclusive grant.
func (m *RWMutex) Lock(ctx context.Context) error { return m.x.acquire(ctx, true, "") }

// TryLock takes the exclusive grant if nobody holds the lock.
func (m *RWMutex) TryLock(ctx context.Context) error { return m.x.acquire(ctx, false, "") }

// Unlock releases the exclusive grant.
func (m *RWMutex) Unlock(ctx context.Context) error { return m.x.release(ctx) }
