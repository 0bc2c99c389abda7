//go:build linux

package etcd

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// A holder whose client goes away without revoking its lease (a crashed
// process) keeps the lock until its session's TTL runs out, never sooner,
// and then, within about the TTL, the next waiter gets it; an election led by the same session
// passes to the next candidate.
func testSessionExpiry(t *testing.T, tg target) {
	const name, ename, ttl = "expiry-lock", "expiry-election", 2
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	crashing, err := clientv3.New(clientv3.Config{Endpoints: []string{tg.addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer crashing.Close()
	sa, err := concurrency.NewSession(crashing, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	ma, ea := concurrency.NewMutex(sa, name), concurrency.NewElection(sa, ename)
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ea.Campaign(ctx, "crashing"); err != nil {
		t.Fatal(err)
	}
	heldKey := ma.Key()

	c := newClient(t, tg)
	sb := newSession(t, c, 10)
	mb, eb := concurrency.NewMutex(sb, name), concurrency.NewElection(sb, ename)
	locked, elected := make(chan time.Time, 1), make(chan time.Time, 1)
	errc := make(chan error, 2)
	go func() {
		if err := mb.Lock(ctx); err != nil {
			errc <- fmt.Errorf("waiter's Lock: %w", err)
			return
		}
		locked <- time.Now()
	}()
	go func() {
		if err := eb.Campaign(ctx, "next"); err != nil {
			errc <- fmt.Errorf("waiter's Campaign: %w", err)
			return
		}
		elected <- time.Now()
	}()
	// Both wait behind the holder's keys before its client goes.
	waitFor(ctx, t, "the waiter's lock and election keys", func() bool {
		return len(keysUnder(t, c, name+"/")) == 2 && len(keysUnder(t, c, ename+"/")) == 2
	})
	// A keep-alive of our own just before the close: the lease can end no
	// sooner than a full TTL after it was sent.
	sent := time.Now()
	if _, err := crashing.KeepAliveOnce(ctx, sa.Lease()); err != nil {
		t.Fatalf("keep the holder's lease alive once more: %v", err)
	}
	if err := crashing.Close(); err != nil {
		t.Fatalf("close the holder's client: %v", err)
	}

	for range 2 {
		var at time.Time
		select {
		case at = <-locked:
			if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != mb.Key() {
				t.Errorf("lock keys once the waiter holds it: got = %v, expected: only %s", kvs, mb.Key())
			}
		case at = <-elected:
			resp, err := eb.Leader(ctx)
			if err != nil || string(resp.Kvs[0].Value) != "next" {
				t.Errorf("leader once the holder's session expired: got = %v, %v, expected: next", resp, err)
			}
		case err := <-errc:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("the holder's session never expired: %v", ctx.Err())
		}
		// The upper bound is loose, for a loaded machine: it catches a
		// lease that outlives its TTL by far, not a slow expiry.
		switch d := at.Sub(sent); {
		case d < ttl*time.Second:
			t.Errorf("passed on %v after the holder's last keep-alive, before its %ds TTL ran out", d, ttl)
		case d > (ttl+8)*time.Second:
			t.Errorf("passed on %v after the holder's last keep-alive, far beyond its %ds TTL", d, ttl)
		default:
			t.Logf("passed on %v after the holder's last keep-alive (TTL %ds)", d.Round(time.Millisecond), ttl)
		}
	}
	if resp, err := c.Get(ctx, heldKey); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the expired holder's lock key %s: got = %v, %v, expected: deleted", heldKey, resp, err)
	}
	ttlResp, err := c.TimeToLive(ctx, sa.Lease())
	if err != nil || ttlResp.TTL != -1 {
		t.Errorf("TimeToLive of the expired lease: got = %v, %v, expected: TTL -1", ttlResp, err)
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := eb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// A session that has ended can take nothing: Lock and Campaign on a
// revoked lease answer etcd's "requested lease not found", and a waiter
// whose session expires while it waits learns, once its turn comes, that
// its key is gone (ErrSessionExpired) instead of holding the lock.
func testEndedSession(t *testing.T, tg target) {
	const name, ename = "ended-lock", "ended-election"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t, tg)

	revoked, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	if err := revoked.Close(); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	if err := concurrency.NewMutex(revoked, name).Lock(ctx); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("Lock on a revoked session: got = %v, expected: %v", err, rpctypes.ErrLeaseNotFound)
	}
	if err := concurrency.NewElection(revoked, ename).Campaign(ctx, "v"); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("Campaign on a revoked session: got = %v, expected: %v", err, rpctypes.ErrLeaseNotFound)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 0 {
		t.Errorf("keys after a Lock on a revoked session: %v", kvs)
	}

	holder := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	expiring, err := concurrency.NewSession(c, concurrency.WithTTL(2))
	if err != nil {
		t.Fatal(err)
	}
	waiter := concurrency.NewMutex(expiring, name)
	locked := make(chan error, 1)
	go func() { locked <- waiter.Lock(ctx) }()
	waitFor(ctx, t, "the waiter's key", func() bool { return len(keysUnder(t, c, name+"/")) == 2 })
	expiring.Orphan() // no more keep-alives: the lease ends by itself
	waitFor(ctx, t, "the waiter's lease to expire", func() bool {
		r, err := c.TimeToLive(ctx, expiring.Lease())
		return err == nil && r.TTL == -1
	})
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != holder.Key() {
		t.Errorf("keys once the waiter's lease expired: got = %v, expected: only the holder's %s", kvs, holder.Key())
	}
	select {
	case err := <-locked:
		t.Fatalf("the waiter's Lock returned before the holder let go: %v", err)
	default:
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; !errors.Is(err, concurrency.ErrSessionExpired) {
		t.Errorf("Lock of a waiter whose session expired: got = %v, expected: %v", err, concurrency.ErrSessionExpired)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 0 {
		t.Errorf("keys after everyone left: %v", kvs)
	}
}
