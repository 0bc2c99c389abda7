package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
)

// outage is how long a restarted node stays down after it has stopped:
// longer than the 6 attempts of a non-waiting call (50ms doubling to 1s,
// about 1.6s in all), so a wait that counted attempts would give up.
const outage = 2 * time.Second

// restart stops node, keeps it down for outage and starts it again on
// the same data dir and address.
func restart(t *testing.T, node *testserver.Node) {
	t.Helper()
	if err := node.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	time.Sleep(outage)
	if err := node.Start(); err != nil {
		t.Fatalf("start again: %v", err)
	}
}

// TestMutexLockWaitsThroughServerRestart: session A holds a lock and
// session B waits for it in Lock(context.Background()) while the server
// stops, stays down for 2s and starts again on the same data dir and
// address. Only the context bounds a wait, so B's Lock rides out the
// refused connections and the "not leader" answers of the restarting
// node, and is granted — with a token above A's — once A unlocks. A
// keeps its grant, with its token, across the restart.
func TestMutexLockWaitsThroughServerRestart(t *testing.T) {
	node := testserver.StartNode(t, testserver.Limits())
	ca, cb := newClient(t, node.Addr()), newClient(t, node.Addr())
	// Sessions outlive the restart: the node gives every session a full
	// TTL again when it is promoted.
	const ttl = 30 * time.Second
	a := newSession(t, ca, client.WithTTL(ttl), client.WithIdentity("holder"))
	b := newSession(t, cb, client.WithTTL(ttl), client.WithIdentity("waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	ma := a.Mutex("restart")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := tokenOf(ma)
	mb := b.Mutex("restart")
	locked := make(chan error, 1)
	// Bounded all the same: closing b's session at cleanup ends the wait.
	go func() { locked <- mb.Lock(context.Background()) }()
	waitQueued(t, ca, "restart", 1)

	restart(t, node)

	select {
	case err := <-locked:
		t.Fatalf("got = B's Lock returned %v across the restart while A holds, expected: still waiting", err)
	default:
	}
	if got, err := ca.Validate(ctx, client.Token{Namespace: "default", Name: "restart", Token: first}); err != nil || !got.Valid {
		t.Fatalf("got = A's token %d valid %v (%v) after the restart, expected: valid", first, got.Valid, err)
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatalf("got = B's Lock returned %v, expected: nil, granted after A unlocked", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("got = B still waiting 20s after A unlocked, expected: granted")
	}
	if tok := tokenOf(mb); tok <= first || !mb.Valid() {
		t.Fatalf("got = B's token %d valid %v, expected: above A's %d and valid", tok, mb.Valid(), first)
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockWaitEndsOnlyWithContextOrSession: a wait on a server that is
// down is not given up after the attempts a non-waiting call gets. It
// ends when its context does, or with ErrSessionExpired when the
// session's validity runs out first, and never with ErrUnavailable.
func TestLockWaitEndsOnlyWithContextOrSession(t *testing.T) {
	node := testserver.StartNode(t, testserver.Limits())
	c := newClient(t, node.Addr())
	long := newSession(t, c, client.WithTTL(30*time.Second))
	// Valid for 0.75×6s after its last acknowledged heartbeat, sent at
	// most 2s before the cut: past the retries of a non-waiting call.
	short := newSession(t, c, client.WithTTL(6*time.Second))
	if err := node.Stop(); err != nil {
		t.Fatal(err)
	}

	t.Run("a lost session ends the wait with ErrSessionExpired", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := short.Mutex("down").Lock(ctx)
		if !errors.Is(err, client.ErrSessionExpired) {
			t.Fatalf("got = %v, expected: ErrSessionExpired", err)
		}
		if short.Err() == nil {
			t.Fatal("got = session not lost, expected: lost")
		}
	})

	t.Run("the context ends the wait", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := long.Mutex("down").Lock(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("got = %v, expected: context.DeadlineExceeded", err)
		}
	})
}
