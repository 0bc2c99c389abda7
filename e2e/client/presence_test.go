package client_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

// Presence, end to end: a node heartbeat holds its node lease while its
// context lives and lets go at once when it ends; announcements are held
// until withdrawn, and Live follows the set of them a selector matches.

func TestHeartbeatHoldsTheNodeLeaseUntilCancelled(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	admin := newClient(t, addr)
	// A TTL far longer than the test: a prompt release can only come from
	// the heartbeat letting go, never from an expiry.
	const ttl = time.Minute
	labels := map[string]string{"zone": "b", "role": "worker"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan client.Token, 4)
	returned := make(chan error, 1)
	go func() {
		returned <- c.Heartbeat(ctx, "node-1", labels, client.PresenceOptions{
			TTL: ttl, Identity: "kubelet-node-1",
			OnHeld: func(tok client.Token) { held <- tok },
		})
	}()
	tok := wait(t, held, "the node lease to be held")
	if tok.Namespace != client.NodeLeaseNamespace || tok.Name != "node-1" || tok.Token == 0 {
		t.Fatalf("token: got = %v, expected: %s/node-1 with a token", tok, client.NodeLeaseNamespace)
	}
	l, err := admin.Lease(context.Background(), client.NodeLeaseNamespace, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if l.Status != "held" || l.Holder != "kubelet-node-1" || l.Token != tok.Token || l.LeaseDuration != ttl || !maps.Equal(l.Labels, labels) {
		t.Fatalf("node lease: got = status %q holder %q token %d duration %v labels %v, expected: held by kubelet-node-1 with token %d, duration %v, labels %v",
			l.Status, l.Holder, l.Token, l.LeaseDuration, l.Labels, tok.Token, ttl, labels)
	}

	cancel()
	if err := wait(t, returned, "Heartbeat to return"); err != nil {
		t.Fatalf("Heartbeat after cancel: got = %v, expected: nil", err)
	}
	// Released by the time Heartbeat returned, a minute before the TTL
	// could have expired it.
	l, err = admin.Lease(context.Background(), client.NodeLeaseNamespace, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if l.Status != "released" || len(l.Holders) != 0 || l.Last == nil || l.Last.Token != tok.Token || l.Last.Holder != "kubelet-node-1" {
		t.Fatalf("after cancel: got = status %q holders %+v last %+v, expected: released, the last grant token %d of kubelet-node-1", l.Status, l.Holders, l.Last, tok.Token)
	}
}

func TestHeartbeatWithAnInvalidNodeNameFailsAtOnce(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	for _, tc := range []struct {
		name, node string
	}{
		{"a slash, refused by the client", "rack-1/node-1"},
		{"a name over the server's limit, refused by the server", strings.Repeat("n", 600)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The caller's context never ends: only the error can end it.
			returned := make(chan error, 1)
			go func() {
				returned <- c.Heartbeat(context.Background(), tc.node, nil, client.PresenceOptions{})
			}()
			if err := wait(t, returned, "Heartbeat to return"); !errors.Is(err, client.ErrInvalidArgument) {
				t.Fatalf("got = %v, expected: ErrInvalidArgument", err)
			}
		})
	}
}

// Taken away (revoked), an announcement is taken again at once, with a
// new token, and says so through OnLost and OnHeld.
func TestAnnouncementIsTakenAgainAfterALoss(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	held := make(chan client.Token, 4)
	lost := make(chan error, 4)
	a, err := c.Announce(ctx, "services", "api-0", map[string]string{"app": "api"}, "10.0.0.1:8080", client.PresenceOptions{
		OnHeld: func(tok client.Token) { held <- tok },
		OnLost: func(err error) { lost <- err },
	})
	if err != nil {
		t.Fatal(err)
	}
	first := wait(t, held, "the first OnHeld")
	if a.Token() != first {
		t.Fatalf("Token: got = %v, expected: %v", a.Token(), first)
	}
	if _, err := c.Revoke(ctx, "services", "api-0", first.Token, "test"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, lost, "OnLost"); !errors.Is(err, client.ErrNotHolder) {
		t.Fatalf("OnLost: got = %v, expected: ErrNotHolder", err)
	}
	again := wait(t, held, "OnHeld after the loss")
	if again.Token <= first.Token || a.Token() != again {
		t.Fatalf("after the loss: got = OnHeld %v Token %v, expected: both a token above %d", again, a.Token(), first.Token)
	}
	l, err := c.Lease(ctx, "services", "api-0")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token != again.Token || l.Value != "10.0.0.1:8080" {
		t.Fatalf("lease: got = token %d value %q, expected: %d, \"10.0.0.1:8080\"", l.Token, l.Value, again.Token)
	}
	if err := a.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Err(); err != nil {
		t.Fatalf("Err after Withdraw: got = %v, expected: nil", err)
	}
}

// nextLive returns the next live set, failing the test after 10s or on
// an error.
func nextLive(t *testing.T, live <-chan client.LiveSet) client.LiveSet {
	t.Helper()
	set, ok := <-waitChan(t, live)
	if !ok {
		t.Fatal("got = live channel closed, expected: a set")
	}
	if set.Err != nil {
		t.Fatalf("got = live set error %v, expected: a set", set.Err)
	}
	return set
}

// waitChan forwards one receive from ch, or fails the test after 10s.
func waitChan[T any](t *testing.T, ch <-chan T) <-chan T {
	t.Helper()
	out := make(chan T, 1)
	select {
	case v, ok := <-ch:
		if ok {
			out <- v
		} else {
			close(out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("got = nothing within 10s, expected: a value")
	}
	return out
}

// checkLive checks that set holds exactly the leases named in want, with
// their values.
func checkLive(t *testing.T, set client.LiveSet, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, l := range set.Leases {
		got[l.Name] = l.Value
	}
	if !maps.Equal(got, want) {
		t.Fatalf("live set at revision %d: got = %v, expected: %v", set.Revision, got, want)
	}
	if !slices.IsSorted(set.Names()) {
		t.Fatalf("live set names: got = %v, expected: sorted", set.Names())
	}
}

func TestLiveFollowsAnnouncementsMatchingTheSelector(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	const ns = "services"
	announce := func(name, app, value string) *client.Announcement {
		t.Helper()
		a, err := c.Announce(ctx, ns, name, map[string]string{"app": app}, value)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Withdraw(context.Background()) })
		return a
	}
	api0 := announce("api-0", "api", "10.0.0.1:8080")
	announce("api-1", "api", "10.0.0.2:8080")
	announce("db-0", "db", "10.0.0.9:5432")

	liveCtx, stop := context.WithCancel(ctx)
	defer stop()
	live := c.Live(liveCtx, ns, "app=api")

	first := nextLive(t, live)
	checkLive(t, first, map[string]string{"api-0": "10.0.0.1:8080", "api-1": "10.0.0.2:8080"})
	if first.Revision == 0 {
		t.Fatal("first set: got = revision 0, expected: the revision read at")
	}

	if err := api0.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	shrunk := nextLive(t, live)
	checkLive(t, shrunk, map[string]string{"api-1": "10.0.0.2:8080"})

	announce("api-2", "api", "10.0.0.3:8080")
	grown := nextLive(t, live)
	checkLive(t, grown, map[string]string{"api-1": "10.0.0.2:8080", "api-2": "10.0.0.3:8080"})
	if !(first.Revision < shrunk.Revision && shrunk.Revision < grown.Revision) {
		t.Fatalf("revisions: got = %d, %d, %d, expected: increasing", first.Revision, shrunk.Revision, grown.Revision)
	}

	// Following ends with its context, and the channel closes.
	stop()
	for {
		if _, ok := <-waitChan(t, live); !ok {
			break
		}
	}
}

func TestLiveWithABadSelectorEndsWithTheError(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	live := c.Live(testCtx(t), "services", "app in (")
	set, ok := <-waitChan(t, live)
	if !ok || !errors.Is(set.Err, client.ErrInvalidArgument) {
		t.Fatalf("got = %+v (open %v), expected: a set with ErrInvalidArgument", set, ok)
	}
	if _, ok := <-waitChan(t, live); ok {
		t.Fatal("got = another set, expected: the channel closed")
	}
}
