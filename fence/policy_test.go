package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

// storeFunc is a one-method fake Store.
type storeFunc func(lease string, token int64) (int64, error)

func (f storeFunc) Observe(lease string, token int64) (int64, error) { return f(lease, token) }

var _ fence.Store = storeFunc(nil)

func TestMonotonic(t *testing.T) {
	ctx := context.Background()
	p := fence.Monotonic(fence.NewMemoryStore())
	for _, n := range []int64{5, 5, 6} {
		if err := p.Check(ctx, tok("default", "db-writer", n)); err != nil {
			t.Fatalf("token %d: got = %v, expected: accepted", n, err)
		}
	}
	err := p.Check(ctx, tok("default", "db-writer", 3))
	var stale *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &stale) || stale.Current != 6 || !stale.Seen {
		t.Fatalf("got = %v, expected: a StaleError with current 6", err)
	}
	if want := "stale fencing token default/db-writer:3: a request with token 6 was already accepted"; err.Error() != want {
		t.Fatalf("got = %q, expected: %q", err, want)
	}
	// Same name in another namespace is another lease.
	if err := p.Check(ctx, tok("other", "db-writer", 1)); err != nil {
		t.Fatalf("other namespace: got = %v, expected: accepted", err)
	}
}

func TestMonotonicRefusesWhenTheStoreFails(t *testing.T) {
	broken := errors.New("disk full")
	p := fence.Monotonic(storeFunc(func(string, int64) (int64, error) { return 0, broken }))
	err := p.Check(context.Background(), tok("default", "db-writer", 5))
	if !errors.Is(err, fence.ErrUnavailable) || !errors.Is(err, broken) || errors.Is(err, fence.ErrStale) {
		t.Fatalf("got = %v, expected: ErrUnavailable wrapping the store's error", err)
	}
}

func TestPoliciesRefuseMalformedTokens(t *testing.T) {
	called := false
	p := fence.Monotonic(storeFunc(func(string, int64) (int64, error) { called = true; return 0, nil }))
	for _, bad := range []client.Token{tok("default", "x", 0), tok("", "x", 1), tok("default", "", 1), tok("Bad", "x", 1)} {
		if err := p.Check(context.Background(), bad); !errors.Is(err, fence.ErrMalformed) {
			t.Fatalf("%+v: got = %v, expected: ErrMalformed", bad, err)
		}
	}
	if called {
		t.Fatal("got = the store consulted, expected: malformed tokens refused first")
	}
}

func TestChain(t *testing.T) {
	var order []string
	step := func(name string, err error) fence.Policy {
		return fence.PolicyFunc(func(context.Context, client.Token) error { order = append(order, name); return err })
	}
	refused := errors.New("refused")
	err := fence.Chain(step("a", nil), step("b", refused), step("c", nil)).Check(context.Background(), tok("default", "x", 1))
	if !errors.Is(err, refused) || strings.Join(order, ",") != "a,b" {
		t.Fatalf("got = %v after %v, expected: refused after a,b", err, order)
	}
}

func TestValidate(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := fence.Validate(c)

	a, b := newSession(t, c, "a"), newSession(t, c, "b")
	ma, mb := a.Mutex("db-writer"), b.Mutex("db-writer")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	ta, ok := ma.Token()
	if !ok {
		t.Fatal("got = not valid, expected: a's grant valid")
	}
	if err := p.Check(ctx, ta); err != nil {
		t.Fatalf("holder's token: got = %v, expected: accepted", err)
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A released token is stale even before anyone else holds the lease.
	err := p.Check(ctx, ta)
	if !errors.Is(err, fence.ErrStale) || !strings.HasSuffix(err.Error(), "the lease has no holder") {
		t.Fatalf("released token: got = %v, expected: stale, no holder", err)
	}

	if err := mb.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	tb, _ := mb.Token()
	if err := p.Check(ctx, tb); err != nil {
		t.Fatalf("successor's token: got = %v, expected: accepted", err)
	}
	// The deposed holder is refused at once, though the successor has
	// not written anything: Validate asks the server.
	err = p.Check(ctx, ta)
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Current != tb.Token || stale.Holder != "b" {
		t.Fatalf("deposed token: got = %v, expected: stale with current %d held by b", err, tb.Token)
	}
	if !strings.Contains(err.Error(), "stale fencing token "+ta.String()+": the current holder's token is") {
		t.Fatalf("got = %q, expected: the message to name %s and the current token", err, ta)
	}

	// A lease nobody ever held.
	if err := p.Check(ctx, tok("default", "never-held", 1)); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("never-held lease: got = %v, expected: ErrStale", err)
	}

	// Every holder of a semaphore is current.
	s1, s2 := a.Semaphore("pool", 2), b.Semaphore("pool", 2)
	for _, s := range []*client.Semaphore{s1, s2} {
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		t1, _ := s.Token()
		if err := p.Check(ctx, t1); err != nil {
			t.Fatalf("semaphore holder %v: got = %v, expected: accepted", t1, err)
		}
	}
}

func TestValidateWithoutAServerIsUnavailable(t *testing.T) {
	// A port nobody listens on: take one and close it.
	addr := closedAddr(t)
	c := newClient(t, addr)
	err := fence.Validate(c).Check(context.Background(), tok("default", "db-writer", 7))
	if !errors.Is(err, fence.ErrUnavailable) || errors.Is(err, fence.ErrStale) {
		t.Fatalf("got = %v, expected: ErrUnavailable, not ErrStale", err)
	}
}
