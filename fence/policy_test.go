package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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

func TestValidateWithoutAServerIsUnavailable(t *testing.T) {
	// A port nobody listens on: take one and close it.
	addr := closedAddr(t)
	c := newClient(t, addr)
	err := fence.Validate(c).Check(context.Background(), tok("default", "db-writer", 7))
	if !errors.Is(err, fence.ErrUnavailable) || errors.Is(err, fence.ErrStale) {
		t.Fatalf("got = %v, expected: ErrUnavailable, not ErrStale", err)
	}
}
