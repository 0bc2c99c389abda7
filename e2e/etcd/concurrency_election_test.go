//go:build linux

package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// An observer sees every leader and every value proclaimed, in order,
// when each change is observed before the next is made (etcd's Observe
// promises the latest value, not every one in between).
func testElection(t *testing.T, tg target) {
	const name = "election"
	ctx := ctxT(t)
	c := newClient(t, tg)
	sa, sb, so := newSession(t, c, 10), newSession(t, c, 10), newSession(t, c, 10)
	ea, eb := concurrency.NewElection(sa, name), concurrency.NewElection(sb, name)
	observer := concurrency.NewElection(so, name)

	if _, err := observer.Leader(ctx); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("Leader with nobody elected: got = %v, expected: %v", err, concurrency.ErrElectionNoLeader)
	}
	if err := observer.Proclaim(ctx, "x"); !errors.Is(err, concurrency.ErrElectionNotLeader) {
		t.Fatalf("Proclaim without a campaign: got = %v, expected: %v", err, concurrency.ErrElectionNotLeader)
	}
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	obs := observer.Observe(octx)
	var lastCreate, lastMod int64
	observed := func(e *concurrency.Election, value string) {
		t.Helper()
		select {
		case resp, ok := <-obs:
			if !ok {
				t.Fatalf("observe ended waiting for %q", value)
			}
			kv := resp.Kvs[0]
			if string(kv.Value) != value || string(kv.Key) != e.Key() || kv.CreateRevision != e.Rev() {
				t.Fatalf("observed %s=%q created at %d, expected: %s=%q created at %d", kv.Key, kv.Value, kv.CreateRevision, e.Key(), value, e.Rev())
			}
			if kv.CreateRevision < lastCreate || kv.ModRevision <= lastMod {
				t.Fatalf("observed %q at create %d mod %d, after create %d mod %d", value, kv.CreateRevision, kv.ModRevision, lastCreate, lastMod)
			}
			lastCreate, lastMod = kv.CreateRevision, kv.ModRevision
		case <-ctx.Done():
			t.Fatalf("observe: nothing seen waiting for %q", value)
		}
	}
	// expect observes value and, nothing having changed since, reads it
	// from Leader too.
	expect := func(e *concurrency.Election, value string) {
		t.Helper()
		observed(e, value)
		resp, err := observer.Leader(ctx)
		if err != nil {
			t.Fatalf("Leader: %v", err)
		}
		if got := string(resp.Kvs[0].Value); got != value {
			t.Fatalf("Leader: got = %q, expected: %q", got, value)
		}
	}

	if err := ea.Campaign(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	expect(ea, "a1")
	for _, v := range []string{"a2", "a3"} {
		if err := ea.Proclaim(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	observed(ea, "a2") // proclaimed in a row: each is seen, in order
	expect(ea, "a3")

	campaigned := make(chan error, 1)
	go func() { campaigned <- eb.Campaign(ctx, "b1") }()
	select {
	case err := <-campaigned:
		t.Fatalf("a second candidate was elected while the leader stays: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-campaigned; err != nil {
		t.Fatalf("campaign once the leader resigned: %v", err)
	}
	expect(eb, "b1")
	if err := ea.Proclaim(ctx, "stale"); !errors.Is(err, concurrency.ErrElectionNotLeader) {
		t.Fatalf("Proclaim by the resigned leader: got = %v, expected: %v", err, concurrency.ErrElectionNotLeader)
	}
	if err := eb.Proclaim(ctx, "b2"); err != nil {
		t.Fatal(err)
	}
	expect(eb, "b2")
	if err := eb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := observer.Leader(ctx); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("Leader once everyone resigned: got = %v, expected: %v", err, concurrency.ErrElectionNoLeader)
	}
	if err := ea.Campaign(ctx, "a4"); err != nil {
		t.Fatal(err)
	}
	expect(ea, "a4")
	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ocancel()
	for range obs { // observe closes its channel once its context ends
	}
}
