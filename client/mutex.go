package client

import (
	"context"
)

// Mutex is a distributed lock held by a session. Lock waits in the
// server's FIFO queue; each grant has a fencing token to hand to the
// resources the holder writes to. A Mutex is safe for concurrent use:
// goroutines sharing the session take turns.
//
// Hold the lock only while Valid is true, and stop the protected work
// when Lost fires or Context is cancelled: the lock can be lost without
// Unlock (the session's heartbeats stopped being acknowledged, or an
// operator revoked it). Call Unlock after a loss too: it returns nil and
// lets the session's other goroutines take their turn.
type Mutex struct{ h *holder }

// Mutex returns the lock named name (in the default namespace unless
// WithNamespace says otherwise).
func (s *Session) Mutex(name string, opts ...LeaseOption) *Mutex {
	return &Mutex{newHolder(s, name, 1, false, opts)}
}

// Lock waits until the lock is granted to this session or ctx ends.
func (m *Mutex) Lock(ctx context.Context) error { return m.h.acquire(ctx, true, "") }

// TryLock takes the lock if it is free, or returns ErrLocked.
func (m *Mutex) TryLock(ctx context.Context) error { return m.h.acquire(ctx, false, "") }

// Unlock releases the grant named by its token. A grant that was already
// lost counts as released.
func (m *Mutex) Unlock(ctx context.Context) error { return m.h.release(ctx) }

// Token is the current grant's fencing token, 0 when not held.
func (m *Mutex) Token() int64 { t, _, _ := m.h.current(); return t }

// FenceToken is the token with its lease name, and whether it is valid.
func (m *Mutex) FenceToken() (Token, bool) { return m.h.fenceToken() }

// Valid reports whether the lock is held and the session still certainly
// keeps it (see Session.Valid).
func (m *Mutex) Valid() bool { return m.h.valid() }

// Lost is closed when the current grant ends: lost, revoked or unlocked.
func (m *Mutex) Lost() <-chan struct{} { _, _, l := m.h.current(); return l }

// Context is cancelled when the current grant ends; run the protected
// work under it.
func (m *Mutex) Context() context.Context { _, c, _ := m.h.current(); return c }

// Semaphore lets up to capacity sessions hold it at once, each with its
// own fencing token. Its methods mirror Mutex.
type Semaphore struct{ h *holder }

// Semaphore returns the semaphore named name with the given capacity;
// every user of the name must agree on the capacity.
func (s *Session) Semaphore(name string, capacity int, opts ...LeaseOption) *Semaphore {
	return &Semaphore{newHolder(s, name, capacity, false, opts)}
}

// Acquire waits for a place.
func (m *Semaphore) Acquire(ctx context.Context) error { return m.h.acquire(ctx, true, "") }

// TryAcquire takes a place if one is free, or returns ErrLocked.
func (m *Semaphore) TryAcquire(ctx context.Context) error { return m.h.acquire(ctx, false, "") }

// Release gives the place back.
func (m *Semaphore) Release(ctx context.Context) error { return m.h.release(ctx) }

// Token is this holder's fencing token, 0 when not held.
func (m *Semaphore) Token() int64 { t, _, _ := m.h.current(); return t }

// FenceToken is the token with its lease name, and whether it is valid.
func (m *Semaphore) FenceToken() (Token, bool) { return m.h.fenceToken() }

// Valid reports whether a place is held and still certainly kept.
func (m *Semaphore) Valid() bool { return m.h.valid() }

// Lost is closed when the current place ends.
func (m *Semaphore) Lost() <-chan struct{} { _, _, l := m.h.current(); return l }

// Context is cancelled when the current place ends.
func (m *Semaphore) Context() context.Context { _, c, _ := m.h.current(); return c }

// rwCapacity bounds how many sessions may read-lock one RWMutex at once.
const rwCapacity = 1000

// RWMutex is a readers-writer lock: any number of sessions read at once
// (up to 1000), a writer holds it alone. The server's queue is FIFO, so
// a waiting writer is not starved by a stream of readers: readers that
// arrive after it wait for it. Within one session, readers and writers
// take turns, since a session holds one grant per lock.
type RWMutex struct {
	read, write *holder
}

// RWMutex returns the readers-writer lock named name.
func (s *Session) RWMutex(name string, opts ...LeaseOption) *RWMutex {
	return &RWMutex{
		read:  newHolder(s, name, rwCapacity, false, opts),
		write: newHolder(s, name, rwCapacity, true, opts),
	}
}

// RLock waits for a shared grant.
func (m *RWMutex) RLock(ctx context.Context) error { return m.read.acquire(ctx, true, "") }

// RUnlock releases the shared grant.
func (m *RWMutex) RUnlock(ctx context.Context) error { return m.read.release(ctx) }

// Lock waits for the exclusive grant.
func (m *RWMutex) Lock(ctx context.Context) error { return m.write.acquire(ctx, true, "") }

// TryLock takes the exclusive grant if nobody holds the lock.
func (m *RWMutex) TryLock(ctx context.Context) error { return m.write.acquire(ctx, false, "") }

// Unlock releases the exclusive grant.
func (m *RWMutex) Unlock(ctx context.Context) error { return m.write.release(ctx) }

// held returns whichever side currently holds a grant.
func (m *RWMutex) held() *holder {
	if t, _, _ := m.write.current(); t != 0 {
		return m.write
	}
	return m.read
}

// Token is the current grant's fencing token (read or write), 0 when not
// held.
func (m *RWMutex) Token() int64 { t, _, _ := m.held().current(); return t }

// FenceToken is the token with its lease name, and whether it is valid.
func (m *RWMutex) FenceToken() (Token, bool) { return m.held().fenceToken() }

// Valid reports whether a grant is held and still certainly kept.
func (m *RWMutex) Valid() bool { return m.held().valid() }

// Lost is closed when the current grant ends.
func (m *RWMutex) Lost() <-chan struct{} { _, _, l := m.held().current(); return l }

// Context is cancelled when the current grant ends.
func (m *RWMutex) Context() context.Context { _, c, _ := m.held().current(); return c }
