package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

// TestSemaphoreCapacity: six sessions share a semaphore of three; never
// more than three hold it, each with a token of its own.
func TestSemaphoreCapacity(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const (
		capacity = 3
		sessions = 6
		runFor   = time.Second
	)
	ss := make([]*client.Session, sessions)
	for i := range ss {
		ss[i] = newSession(t, c, client.WithTTL(2*time.Second))
	}

	// First the edges, deterministically.
	sems := make([]*client.Semaphore, sessions)
	for i := range sems {
		sems[i] = ss[i].Semaphore("pool", capacity)
	}
	for i := range capacity {
		if err := sems[i].TryAcquire(ctx); err != nil {
			t.Fatalf("holder %d: %v", i, err)
		}
	}
	if err := sems[capacity].TryAcquire(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("got = %v with %d holders, expected: ErrLocked", err, capacity)
	}
	if err := ss[capacity].Semaphore("pool", capacity+1).TryAcquire(ctx); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("got = %v for a different capacity, expected: ErrInvalidArgument", err)
	}
	tokens := map[int64]bool{}
	for i := range capacity {
		tok := tokenOf(sems[i])
		if tok == 0 || tokens[tok] || !sems[i].Valid() {
			t.Fatalf("got = holder %d token %d (seen %v) valid %v, expected: a valid token of its own", i, tok, tokens, sems[i].Valid())
		}
		tokens[tok] = true
	}
	if err := sems[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sems[capacity].TryAcquire(ctx); err != nil {
		t.Fatalf("got = %v after a release, expected: a place", err)
	}
	for _, i := range []int{1, 2, capacity} {
		if err := sems[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Then a fight.
	var (
		errs    errorList
		inside  atomic.Int32
		maxSeen atomic.Int32
		mu      sync.Mutex // guards holding and granted
		holding = map[int64]int{}
		granted = map[int64]bool{}
	)
	start := time.Now()
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Go(func() {
			sem := s.Semaphore("pool", capacity)
			for time.Since(start) < runFor {
				if err := sem.Acquire(ctx); err != nil {
					errs.add("session %d: Acquire: %v", i, err)
					return
				}
				tok := tokenOf(sem)
				n := inside.Add(1)
				for m := maxSeen.Load(); n > m && !maxSeen.CompareAndSwap(m, n); m = maxSeen.Load() {
				}
				if n > capacity {
					errs.add("got = %d holders, expected: at most %d", n, capacity)
				}
				mu.Lock()
				if other, ok := holding[tok]; ok {
					errs.add("got = token %d held by sessions %d and %d at once, expected: a token each", tok, other, i)
				}
				if granted[tok] {
					errs.add("got = token %d granted twice, expected: a new token per grant", tok)
				}
				holding[tok], granted[tok] = i, true
				mu.Unlock()
				if !sem.Valid() {
					errs.add("session %d: got = place invalid while held, expected: valid", i)
				}
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				delete(holding, tok)
				mu.Unlock()
				inside.Add(-1)
				if err := sem.Release(ctx); err != nil {
					errs.add("session %d: Release: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	errs.check(t)
	t.Logf("%d grants, at most %d holders at once", len(granted), maxSeen.Load())
	if got := maxSeen.Load(); got != capacity {
		t.Fatalf("got = at most %d holders at once, expected: %d", got, capacity)
	}
	if len(granted) < 2*sessions {
		t.Fatalf("got = %d grants, expected: at least %d", len(granted), 2*sessions)
	}
}
