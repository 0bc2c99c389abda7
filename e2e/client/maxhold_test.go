package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
)

// A holder that keeps a grant past its max hold is asked to step down —
// its grant ends locally with ErrStepDown, saying max-hold — and, still
// holding after the grace, is revoked: the stuck job loses the lock, and
// the next waiter gets it with a higher token.
func TestMaxHoldAsksThenRevokes(t *testing.T) {
	limits := testserver.Limits()
	limits.MaxHoldGrace = 500 * time.Millisecond
	addr := testserver.Start(t, limits)
	c := newClient(t, addr)
	ctx := testCtx(t)

	stuck := newSession(t, c, client.WithIdentity("stuck-job"))
	m := stuck.Mutex("nightly", client.WithMaxHold(time.Second))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := tokenOf(m)
	if l, err := c.Lease(ctx, client.DefaultNamespace, "nightly"); err != nil || l.MaxHold != time.Second {
		t.Fatalf("lease max hold: got = %v (%v), expected: 1s", l.MaxHold, err)
	}
	next := newSession(t, c, client.WithIdentity("next-job"))
	n := next.Mutex("nightly")
	locked := make(chan error, 1)
	go func() { locked <- n.Lock(ctx) }()

	select {
	case <-m.Lost():
	case <-ctx.Done():
		t.Fatal("the grant past its max hold was never asked to step down")
	}
	cause := context.Cause(m.Context())
	if !errors.Is(cause, client.ErrStepDown) || !strings.Contains(cause.Error(), "max-hold") {
		t.Fatalf("cause of the loss: got = %v, expected: ErrStepDown for max-hold", cause)
	}
	// Asked, not robbed: the stuck job still holds it on the server...
	l, err := c.Lease(ctx, client.DefaultNamespace, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token != first || len(l.Holders) != 1 || !strings.Contains(l.Holders[0].StepDown, "max-hold") {
		t.Fatalf("lease after the request: got = token %d holders %+v, expected: still %d, marked to step down", l.Token, l.Holders, first)
	}
	// ...until the grace is over and the server revokes it, so the next
	// job is granted without the stuck one doing anything.
	if err := <-locked; err != nil {
		t.Fatalf("next job's Lock: got = %v, expected: granted once the stuck grant is revoked", err)
	}
	if got := tokenOf(n); got <= first {
		t.Errorf("next job's token: got = %d, expected: above %d", got, first)
	}
	l, err = c.Lease(ctx, client.DefaultNamespace, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if l.Last == nil || l.Last.Ended != "revoked" || l.Last.Token != first || !strings.Contains(l.Last.Reason, "max-hold") {
		t.Fatalf("the stuck grant's end: got = %+v, expected: revoked for max-hold", l.Last)
	}
	if d := l.Last.EndTime.Sub(l.Last.AcquireTime); d < time.Second+limits.MaxHoldGrace {
		t.Errorf("revoked %v after the grant, expected: no sooner than the max hold and the grace, %v", d, time.Second+limits.MaxHoldGrace)
	}
}

// A max hold over the server's limit is refused, naming the limit.
func TestMaxHoldOverTheLimitIsRefused(t *testing.T) {
	limits := testserver.Limits()
	limits.MaxHold = time.Hour
	c := newClient(t, testserver.Start(t, limits))
	s := newSession(t, c)
	err := s.Mutex("job", client.WithMaxHold(2*time.Hour)).Lock(testCtx(t))
	if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "--max-hold-limit") {
		t.Fatalf("Lock with a max hold over the limit: got = %v, expected: ErrInvalidArgument naming --max-hold-limit", err)
	}
}
