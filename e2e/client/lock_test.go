package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
)

// fencedResource is a downstream resource guarded by fencing tokens with
// a monotonic policy: it remembers the highest token it has seen and
// rejects writes with a lower one. It also notices critical sections
// that overlap, which a correct lock never allows.
type fencedResource struct {
	inside   atomic.Int32 // critical sections under way
	overlaps atomic.Int32 // entries that found another under way

	mu       sync.Mutex // guards the fields below
	highest  int64
	accepted []int64 // tokens of accepted writes, in order
	rejected int
	sections []section // in order of entry
}

// section is one critical section: who held the lock, with which token.
type section struct {
	session int
	token   int64
}

func (r *fencedResource) enter(session int, token int64) {
	if r.inside.Add(1) != 1 {
		r.overlaps.Add(1)
	}
	r.mu.Lock()
	r.sections = append(r.sections, section{session, token})
	r.mu.Unlock()
}

func (r *fencedResource) exit() { r.inside.Add(-1) }

// write applies the monotonic policy.
func (r *fencedResource) write(token int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.highest {
		r.rejected++
		return false
	}
	r.highest = token
	r.accepted = append(r.accepted, token)
	return true
}

// errorList collects failures from goroutines, which must not call
// t.Fatal; the test reports them once they are joined.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Errorf(format, args...))
}

func (l *errorList) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, err := range l.errs {
		if i == 10 {
			t.Errorf("... and %d more", len(l.errs)-10)
			break
		}
		t.Error(err)
	}
	if len(l.errs) > 0 {
		t.FailNow()
	}
}

// TestMutexMutualExclusion: 32 goroutines in 4 sessions fight over one
// lock and write to a fenced resource. Goroutines of one session take
// turns through the session's gate; sessions take turns through the
// server's FIFO queue.
func TestMutexMutualExclusion(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	const (
		sessions   = 4
		perSession = 8
		runFor     = 2 * time.Second
		maxRounds  = 400
	)
	var res fencedResource
	var errs errorList
	var rounds atomic.Int32
	start := time.Now()
	var wg sync.WaitGroup
	for i := range sessions {
		s := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity(fmt.Sprintf("s%d", i)))
		for range perSession {
			wg.Go(func() {
				m := s.Mutex("shared")
				for time.Since(start) < runFor && rounds.Add(1) <= maxRounds {
					// Every waiter is granted in the end (FIFO), so the
					// generous timeout only bounds a broken test.
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					err := m.Lock(ctx)
					if err != nil {
						cancel()
						errs.add("session %d: Lock: %v", i, err)
						return
					}
					token, ok := m.Token()
					if !ok || token.Token != tokenOf(m) || token.Name != "shared" || token.Namespace != "default" {
						errs.add("session %d: got = fence token %v valid %v, expected: default/shared:%d valid", i, token, ok, tokenOf(m))
					}
					res.enter(i, token.Token)
					if !res.write(token.Token) {
						errs.add("session %d: got = write with token %d rejected, expected: accepted", i, token.Token)
					}
					time.Sleep(time.Millisecond)
					if !m.Valid() {
						errs.add("session %d: got = lock invalid inside its critical section, expected: valid", i)
					}
					if !res.write(token.Token) {
						errs.add("session %d: got = second write with token %d rejected, expected: accepted", i, token.Token)
					}
					res.exit()
					if err := m.Unlock(ctx); err != nil {
						errs.add("session %d: Unlock: %v", i, err)
					}
					cancel()
				}
			})
		}
	}
	wg.Wait()
	errs.check(t)
	elapsed := time.Since(start)

	if n := res.overlaps.Load(); n != 0 {
		t.Fatalf("got = %d overlapping critical sections, expected: 0", n)
	}
	if res.rejected != 0 {
		t.Fatalf("got = %d writes rejected as stale, expected: 0", res.rejected)
	}
	for i := 1; i < len(res.accepted); i++ {
		if res.accepted[i] < res.accepted[i-1] {
			t.Fatalf("got = stale write accepted: token %d after %d, expected: never lower", res.accepted[i], res.accepted[i-1])
		}
	}
	handovers := 0
	held := make([]int, sessions)
	for i, sec := range res.sections {
		held[sec.session]++
		if i == 0 {
			continue
		}
		prev := res.sections[i-1]
		if sec.token <= prev.token {
			t.Fatalf("got = section %d token %d after %d, expected: strictly increasing", i, sec.token, prev.token)
		}
		if sec.session != prev.session {
			handovers++
		}
	}
	n := len(res.sections)
	t.Logf("%d critical sections, %d handovers between sessions, per session %v, in %v", n, handovers, held, elapsed.Round(time.Millisecond))
	if n < 40 {
		t.Fatalf("got = %d critical sections, expected: at least 40", n)
	}
	// The server's queue is FIFO and each session has one goroutine in
	// it, so the sessions mostly alternate.
	if handovers < n/2 {
		t.Fatalf("got = %d handovers in %d sections, expected: at least %d", handovers, n, n/2)
	}
	for i, h := range held {
		if h < n/(4*sessions) {
			t.Fatalf("got = session %d held the lock %d times of %d, expected: at least %d", i, h, n, n/(4*sessions))
		}
	}
}

func TestMutexBasics(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := newSession(t, c, client.WithTTL(2*time.Second))
	b := newSession(t, c, client.WithTTL(2*time.Second))

	t.Run("Unlock of a lock never taken fails with ErrNotHolder", func(t *testing.T) {
		m := a.Mutex("never")
		if err := m.Unlock(ctx); !errors.Is(err, client.ErrNotHolder) {
			t.Fatalf("got = %v, expected: ErrNotHolder", err)
		}
		if tokenOf(m) != 0 || m.Valid() {
			t.Fatalf("got = token %d valid %v, expected: 0, false", tokenOf(m), m.Valid())
		}
		select {
		case <-m.Lost():
		default:
			t.Fatal("got = Lost open on a lock not held, expected: closed")
		}
	})

	t.Run("a second Unlock fails with ErrNotHolder", func(t *testing.T) {
		m := a.Mutex("twice")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); !errors.Is(err, client.ErrNotHolder) {
			t.Fatalf("got = %v, expected: ErrNotHolder", err)
		}
	})

	t.Run("goroutines of one session take turns with rising tokens", func(t *testing.T) {
		m1, m2 := a.Mutex("turns"), a.Mutex("turns")
		if err := m1.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		first := tokenOf(m1)
		got := make(chan error, 1)
		go func() { got <- m2.Lock(ctx) }()
		select {
		case err := <-got:
			t.Fatalf("got = second Lock returned %v while the first holds, expected: waiting", err)
		case <-time.After(200 * time.Millisecond):
		}
		if err := m1.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if tokenOf(m2) <= first {
			t.Fatalf("got = token %d, expected: above %d", tokenOf(m2), first)
		}
		if err := m2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a cancelled wait leaves the queue and is never granted", func(t *testing.T) {
		ma, mb := a.Mutex("cancel"), b.Mutex("cancel")
		if err := ma.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() { got <- mb.Lock(wctx) }()
		time.Sleep(100 * time.Millisecond) // let b park on the server
		wcancel()
		select {
		case err := <-got:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got = %v, expected: context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("got = Lock still waiting 5s after its context was cancelled, expected: returned")
		}
		if err := ma.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Nobody holds it now: a third party takes it at once.
		c3 := newSession(t, c, client.WithTTL(2*time.Second)).Mutex("cancel")
		if err := c3.TryLock(ctx); err != nil {
			t.Fatalf("got = %v, expected: the lock free after the cancelled waiter left", err)
		}
		if err := mb.TryLock(ctx); !errors.Is(err, client.ErrLocked) {
			t.Fatalf("got = %v, expected: ErrLocked", err)
		}
		if err := c3.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestMutexRevoke: an operator's break-lock through the API ends the
// grant at once: Lost fires, the context is cancelled with ErrNotHolder,
// and the watchdog runs. The session itself lives on.
func TestMutexRevoke(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := newSession(t, c, client.WithTTL(2*time.Second))
	watchdog := make(chan struct{}, 1)
	m := s.Mutex("revoked", client.WithWatchdog(func() { watchdog <- struct{}{} }))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := tokenOf(m)
	lost, lockCtx := m.Lost(), m.Context()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	leases := tenurev1connect.NewLeaseServiceClient(&http.Client{Transport: tr}, "http://"+addr)
	start := time.Now()
	resp, err := leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Namespace: "default", Name: "revoked", Token: token, Reason: "test break-lock"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.GetRevoked(); !slices.Equal(got, []int64{token}) {
		t.Fatalf("got = revoked %v, expected: [%d]", got, token)
	}
	select {
	case <-lost:
	case <-time.After(2 * time.Second):
		t.Fatal("got = Lost open 2s after the revoke, expected: closed")
	}
	select {
	case <-watchdog:
	case <-time.After(2 * time.Second):
		t.Fatal("got = watchdog not called 2s after the revoke, expected: called")
	}
	t.Logf("loss noticed %v after the revoke was sent", time.Since(start).Round(time.Millisecond))
	if cause := context.Cause(lockCtx); !errors.Is(cause, client.ErrNotHolder) {
		t.Fatalf("got = cause %v, expected: ErrNotHolder", cause)
	}
	if m.Valid() {
		t.Fatal("got = lock valid after the revoke, expected: invalid")
	}
	if _, ok := m.Token(); ok {
		t.Fatal("got = fence token valid after the revoke, expected: invalid")
	}
	if !s.Valid() {
		t.Fatal("got = session invalid after a revoke, expected: the session lives on")
	}
	// Unlock after a loss counts as released and frees the session's turn.
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("got = Unlock after revoke %v, expected: nil", err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if tokenOf(m) <= token || !m.Valid() {
		t.Fatalf("got = token %d valid %v, expected: above %d, valid", tokenOf(m), m.Valid(), token)
	}
	// The validation API agrees: the old token is gone, the new one holds.
	for _, tc := range []struct {
		token int64
		valid bool
	}{{token, false}, {tokenOf(m), true}} {
		v, err := leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Namespace: "default", Name: "revoked", Token: tc.token}))
		if err != nil {
			t.Fatal(err)
		}
		if v.Msg.GetValid() != tc.valid {
			t.Fatalf("got = token %d valid %v, expected: %v", tc.token, v.Msg.GetValid(), tc.valid)
		}
	}
	select {
	case <-watchdog:
		t.Fatal("got = watchdog called again, expected: once")
	default:
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A clean Unlock does not call the watchdog.
	select {
	case <-watchdog:
		t.Fatal("got = watchdog called after Unlock, expected: not called")
	case <-time.After(200 * time.Millisecond):
	}
}

func TestGrantContextCarriesItsFencingToken(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	s := newSession(t, c, client.WithTTL(2*time.Second))
	m := s.Mutex("token-in-context")
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(context.Background())
	got, ok := client.TokenFromContext(m.Context())
	want := client.Token{Namespace: "default", Name: "token-in-context", Token: tokenOf(m)}
	if !ok || got != want {
		t.Fatalf("got = %v %v, expected: %v", got, ok, want)
	}
}

func TestCancelledLockLeavesNoGrantBehind(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	holder := newSession(t, c, client.WithTTL(2*time.Second))
	waiter := newSession(t, c, client.WithTTL(2*time.Second))
	hm := holder.Mutex("late-cancel")
	if err := hm.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Cancel the waiter's Lock at about the moment the holder releases,
	// many times, so that some cancellations race the grant.
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		wm := waiter.Mutex("late-cancel")
		go func() { done <- wm.Lock(ctx) }()
		time.Sleep(20 * time.Millisecond)
		go func() { _ = hm.Unlock(context.Background()) }()
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		cancel()
		if err := <-done; err == nil {
			if err := wm.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		// Whatever happened, the waiter must not hold the lock now, and
		// the holder can take it again at once.
		tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := hm.Lock(tctx)
		tcancel()
		if err != nil {
			t.Fatalf("round %d: holder could not relock: %v (a grant left behind?)", i, err)
		}
	}
	_ = hm.Unlock(context.Background())
}
