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
