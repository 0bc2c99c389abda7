//go:build linux

package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Sessions on clients of their own take one mutex in turns: never two
// holders, every holder's lock key created after the previous holder's,
// and every holder's write guarded by IsOwner accepted.
func testMutexExclusion(t *testing.T, tg target) {
	const workers, rounds = 8, 5
	const name, counter = "mutex-excl", "mutex-excl-counter"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var (
		holders atomic.Int32
		mu      sync.Mutex // for the race detector: etcd's lock is invisible to it
		lastRev int64
		held    int
	)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, tg)
		sess := newSession(t, c, 10)
		wg.Go(func() {
			errc <- func() error {
				for r := range rounds {
					m := concurrency.NewMutex(sess, name)
					if err := m.Lock(ctx); err != nil {
						return fmt.Errorf("worker %d round %d: lock: %w", w, r, err)
					}
					if n := holders.Add(1); n != 1 {
						return fmt.Errorf("worker %d round %d: %d holders at once", w, r, n)
					}
					resp, err := c.Get(ctx, m.Key())
					if err != nil {
						return fmt.Errorf("get own lock key: %w", err)
					}
					if len(resp.Kvs) != 1 {
						return fmt.Errorf("worker %d: lock key %s absent while held", w, m.Key())
					}
					kv := resp.Kvs[0]
					if kv.Lease != int64(sess.Lease()) {
						return fmt.Errorf("lock key %s: lease = %x, expected: %x", m.Key(), kv.Lease, sess.Lease())
					}
					mu.Lock()
					prev := lastRev
					lastRev = kv.CreateRevision
					held++
					n := held
					mu.Unlock()
					if kv.CreateRevision <= prev {
						return fmt.Errorf("worker %d: lock key created at revision %d, after a holder whose key was created at %d", w, kv.CreateRevision, prev)
					}
					tr, err := c.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(counter, strconv.Itoa(n))).Commit()
					if err != nil {
						return fmt.Errorf("guarded put: %w", err)
					}
					if !tr.Succeeded {
						return fmt.Errorf("worker %d: write guarded by IsOwner refused while holding the lock", w)
					}
					time.Sleep(time.Duration(rand.N(3)) * time.Millisecond)
					holders.Add(-1)
					if err := m.Unlock(ctx); err != nil {
						return fmt.Errorf("unlock: %w", err)
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	c := newClient(t, tg)
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 0 {
		t.Errorf("lock keys left after every holder unlocked: %d (first %q)", len(kvs), kvs[0].Key)
	}
	resp, err := c.Get(ctx, counter)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != strconv.Itoa(workers*rounds) {
		t.Errorf("guarded counter: got = %v, expected: %d", resp.Kvs, workers*rounds)
	}
}

// TryLock answers ErrLocked while another session holds the mutex and
// leaves no key of its own behind; it takes the mutex once it is free.
func testTryLock(t *testing.T, tg target) {
	const name = "trylock"
	ctx := ctxT(t)
	c := newClient(t, tg)
	m1 := concurrency.NewMutex(newSession(t, c, 10), name)
	m2 := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := m1.TryLock(ctx); err != nil {
		t.Fatalf("first TryLock of a free mutex: %v", err)
	}
	held := m1.Key()
	if err := m2.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock of a held mutex: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != held {
		t.Fatalf("keys after a refused TryLock: got = %v, expected: only the holder's %s", kvs, held)
	}
	// The holder's own session trying again still holds it.
	if err := m1.TryLock(ctx); err != nil {
		t.Fatalf("TryLock by the holder's session: %v", err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(ctx); err != nil {
		t.Fatalf("TryLock of a mutex just unlocked: %v", err)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != m2.Key() {
		t.Fatalf("keys after the second session took the lock: got = %v, expected: only %s", kvs, m2.Key())
	}
	if err := m1.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock by the former holder: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Lock whose context ends while it waits returns the context's error
// and deletes its key, so that it does not stand in line for ever.
func testLockCancelled(t *testing.T, tg target) {
	const name = "lock-cancelled"
	ctx := ctxT(t)
	c := newClient(t, tg)
	holder := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	waiter := concurrency.NewMutex(newSession(t, c, 10), name)
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := waiter.Lock(dctx)
	dcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock until its deadline: got = %v, expected: %v", err, context.DeadlineExceeded)
	}
	canceller := concurrency.NewMutex(newSession(t, c, 10), name)
	cctx, ccancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, ccancel)
	err = canceller.Lock(cctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock cancelled: got = %v, expected: %v", err, context.Canceled)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != holder.Key() {
		t.Fatalf("keys after two abandoned Locks: got = %v, expected: only the holder's %s", kvs, holder.Key())
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Nobody is left in line: a new contender takes it at once.
	next := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := next.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the holder left and the waiters gave up: %v", err)
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
