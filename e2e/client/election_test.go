package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/server"
)

// term is what an observer reports of a leader, without the revision.
type term struct {
	Identity, Value string
	Token           int64
}

func termOf(l client.Leader) term { return term{l.Identity, l.Value, l.Token} }

func (t term) String() string {
	if t.Identity == "" {
		return "(nobody)"
	}
	return fmt.Sprintf("%s=%q@%d", t.Identity, t.Value, t.Token)
}

// campaign runs e.Campaign on its own goroutine.
func campaign(ctx context.Context, e *client.Election, value string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- e.Campaign(ctx, value) }()
	return done
}

// wait returns what ch delivers, failing the test after 10s.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out after 10s waiting for %s", what)
		panic("unreachable")
	}
}

// waitQueued waits until n sessions wait in the queue of default/name, so
// that the order of campaigns is the order the test started them in.
func waitQueued(t *testing.T, c *client.Client, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := c.Lease(context.Background(), "default", name)
		if err == nil && len(l.Waiters) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters of %s: got = %d (err %v), expected: %d", name, len(l.Waiters), err, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestElectionObserveSeesEveryChangeInOrder(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "scheduler"
	ids := []string{"a", "b", "c"}
	var es []*client.Election
	for _, id := range ids {
		es = append(es, newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity(id)).Election(name))
	}
	watcher := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("watcher")).Election(name)

	if err := es[0].Campaign(ctx, "a:1"); err != nil {
		t.Fatal(err)
	}
	want := []term{{"a", "a:1", tokenOf(es[0])}}

	observeCtx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	observed := watcher.Observe(observeCtx)
	var got []client.Leader
	got = append(got, wait(t, observed, "the current leader"))
	if termOf(got[0]) != want[0] {
		t.Fatalf("first observed: got = %v, expected: the current leader %v", termOf(got[0]), want[0])
	}

	// b and c queue behind a, in that order; then each leader proclaims
	// a new value and resigns, handing over to the next.
	elected := []<-chan error{nil, campaign(ctx, es[1], "b:1")}
	waitQueued(t, c, name, 1)
	elected = append(elected, campaign(ctx, es[2], "c:1"))
	waitQueued(t, c, name, 2)
	for i, e := range es {
		id := ids[i]
		if i > 0 {
			if err := wait(t, elected[i], id+"'s campaign"); err != nil {
				t.Fatal(err)
			}
			want = append(want, term{id, id + ":1", tokenOf(e)})
		}
		if err := e.Proclaim(ctx, id+":2"); err != nil {
			t.Fatal(err)
		}
		want = append(want, term{id, id + ":2", tokenOf(e)})
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Read until the last leader's resignation is reported.
	for {
		l := wait(t, observed, fmt.Sprintf("observed changes (so far %v)", got))
		got = append(got, l)
		var leaders []term
		for _, g := range got {
			if g.Identity != "" {
				leaders = append(leaders, termOf(g))
			}
		}
		if len(leaders) >= len(want) && l.Identity == "" {
			if !slices.Equal(leaders, want) {
				t.Fatalf("observed leaders: got = %v, expected: %v", leaders, want)
			}
			break
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i].Revision <= got[i-1].Revision {
			t.Errorf("observed revisions: got = %d after %d, expected: strictly increasing", got[i].Revision, got[i-1].Revision)
		}
		if termOf(got[i]) == termOf(got[i-1]) {
			t.Errorf("observed %v twice in a row at revisions %d and %d, expected: each change once", termOf(got[i]), got[i-1].Revision, got[i].Revision)
		}
	}
	for i := 1; i < len(want); i++ {
		if want[i].Identity != want[i-1].Identity && want[i].Token <= want[i-1].Token {
			t.Errorf("token of %s: got = %d, expected: above %s's %d", want[i].Identity, want[i].Token, want[i-1].Identity, want[i-1].Token)
		}
	}
	stopObserving()
	for l := range observed {
		t.Errorf("observed after the last change: got = %v, expected: nothing", termOf(l))
	}
}

// An observer of an election nobody has campaigned for, on a server whose
// watch history no longer reaches back to revision 1 (a busy or restarted
// server), reports "nobody leads" once and then the first leader.
func TestElectionObserveBeforeAnyCampaignWithTrimmedHistory(t *testing.T) {
	limits := server.DefaultLimits()
	limits.MinTTL = 100 * time.Millisecond
	limits.WatchHistory = 8
	addr, stop, err := testserver.Open(limits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := c.KV().Put(ctx, fmt.Sprintf("filler/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	a := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("a")).Election("fresh")
	watcher := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("watcher")).Election("fresh")

	observeCtx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	observed := watcher.Observe(observeCtx)
	if got := termOf(wait(t, observed, "the first report")); got != (term{}) {
		t.Fatalf("first observed: got = %v, expected: (nobody)", got)
	}
	// Give a faulty observer time to repeat itself before anything changes.
	time.Sleep(300 * time.Millisecond)
	if err := a.Campaign(ctx, "a:1"); err != nil {
		t.Fatal(err)
	}
	if got, want := termOf(wait(t, observed, "the first leader")), (term{"a", "a:1", tokenOf(a)}); got != want {
		t.Fatalf("second observed: got = %v, expected: %v", got, want)
	}
	stopObserving()
	for range observed {
	}
}

func TestElectionLeader(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sa := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("a"))
	a := sa.Election("scheduler")
	other := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("b")).Election("scheduler")

	if _, err := other.Leader(ctx); !errors.Is(err, client.ErrNoLeader) {
		t.Fatalf("Leader before anyone campaigned: got = %v, expected: ErrNoLeader", err)
	}
	if err := a.Campaign(ctx, "10.0.0.7:8080"); err != nil {
		t.Fatal(err)
	}
	if !a.Valid() || tokenOf(a) <= 0 {
		t.Fatalf("after Campaign: got = leader %v token %d, expected: leader with a token", a.Valid(), tokenOf(a))
	}
	if tok, ok := a.Token(); !ok || tok != (client.Token{Namespace: "default", Name: "scheduler", Token: tokenOf(a)}) {
		t.Fatalf("Token: got = %v %v, expected: default/scheduler:%d true", tok, ok, tokenOf(a))
	}
	l, err := other.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (client.Leader{Identity: "a", SessionID: sa.ID(), Value: "10.0.0.7:8080", Token: tokenOf(a), Revision: l.Revision}); l != want || l.Revision < tokenOf(a) {
		t.Fatalf("Leader: got = %+v, expected: %+v at or after revision %d", l, want, tokenOf(a))
	}

	if err := a.Proclaim(ctx, "10.0.0.8:8080"); err != nil {
		t.Fatal(err)
	}
	l, err = other.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := termOf(l), (term{"a", "10.0.0.8:8080", tokenOf(a)}); got != want {
		t.Fatalf("Leader after Proclaim: got = %v, expected: %v (same token, new value)", got, want)
	}

	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Leader(ctx); !errors.Is(err, client.ErrNoLeader) {
		t.Fatalf("Leader after the leader resigned: got = %v, expected: ErrNoLeader", err)
	}
}

func TestElectionResignHandsOverToNextCampaigner(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("a")).Election("scheduler")
	b := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("b")).Election("scheduler")

	if err := a.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	first, lost, leading := tokenOf(a), a.Lost(), a.Context()
	bElected := campaign(ctx, b, "b")
	waitQueued(t, c, "scheduler", 1)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bElected, "b's campaign"); err != nil {
		t.Fatal(err)
	}
	if !b.Valid() || tokenOf(b) <= first {
		t.Fatalf("b after a resigned: got = leader %v token %d, expected: leader with a token above %d", b.Valid(), tokenOf(b), first)
	}
	select {
	case <-lost:
	default:
		t.Fatal("a's Lost after Resign: got = open, expected: closed")
	}
	if leading.Err() == nil {
		t.Fatal("a's Context after Resign: got = not done, expected: cancelled")
	}
	if a.Valid() || tokenOf(a) != 0 {
		t.Fatalf("a after Resign: got = leader %v token %d, expected: not leader, token 0", a.Valid(), tokenOf(a))
	}
	l, err := a.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := termOf(l), (term{"b", "b", tokenOf(b)}); got != want {
		t.Fatalf("Leader: got = %v, expected: %v", got, want)
	}
}

func TestElectionCampaignGivenUpLeavesTheQueue(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("a")).Election("scheduler")
	b := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("b")).Election("scheduler")
	if err := a.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}

	giveUp, stop := context.WithCancel(ctx)
	bElected := campaign(giveUp, b, "b")
	waitQueued(t, c, "scheduler", 1)
	stop()
	if err := wait(t, bElected, "b's campaign to end"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Campaign with its context cancelled: got = %v, expected: context.Canceled", err)
	}
	waitQueued(t, c, "scheduler", 0)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := b.Leader(ctx); !errors.Is(err, client.ErrNoLeader) {
		t.Fatalf("Leader after a resigned: got = %v %v, expected: ErrNoLeader (b gave up)", termOf(l), err)
	}
	if b.Valid() || tokenOf(b) != 0 {
		t.Fatalf("b after giving up: got = leader %v token %d, expected: not leader", b.Valid(), tokenOf(b))
	}
	// b can campaign again.
	if err := b.Campaign(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if !b.Valid() {
		t.Fatal("b after campaigning again: got = not leader, expected: leader")
	}
}

func TestElectionProclaimByNonLeader(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	for _, tc := range []struct {
		name string
		// setup makes "leader" lead name with value "v" and returns an
		// Election of the same name that does not lead.
		setup func(t *testing.T, ctx context.Context, name string, stale, leader *client.Election) *client.Election
		// resign is what Resign returns to the non-leader.
		resign error
	}{
		{
			name: "a session that never campaigned is not the leader",
			setup: func(t *testing.T, ctx context.Context, name string, stale, leader *client.Election) *client.Election {
				if err := leader.Campaign(ctx, "v"); err != nil {
					t.Fatal(err)
				}
				return stale
			},
			resign: client.ErrNotLeader,
		},
		{
			name: "a leader that resigned is no longer the leader",
			setup: func(t *testing.T, ctx context.Context, name string, stale, leader *client.Election) *client.Election {
				if err := stale.Campaign(ctx, "old"); err != nil {
					t.Fatal(err)
				}
				if err := stale.Resign(ctx); err != nil {
					t.Fatal(err)
				}
				if err := leader.Campaign(ctx, "v"); err != nil {
					t.Fatal(err)
				}
				return stale
			},
			resign: client.ErrNotLeader,
		},
		{
			name: "a leader whose grant was revoked is no longer the leader, and resigning it is a no-op",
			setup: func(t *testing.T, ctx context.Context, name string, stale, leader *client.Election) *client.Election {
				if err := stale.Campaign(ctx, "old"); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Revoke(ctx, "default", name, 0, "test: break the lock"); err != nil {
					t.Fatal(err)
				}
				wait(t, stale.Lost(), "the revoked leader's Lost")
				if err := leader.Campaign(ctx, "v"); err != nil {
					t.Fatal(err)
				}
				return stale
			},
			resign: nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			name := strings.ReplaceAll(tc.name, " ", "-")[:40]
			stale := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("stale")).Election(name)
			leader := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("leader")).Election(name)
			stale = tc.setup(t, ctx, name, stale, leader)

			if err := stale.Proclaim(ctx, "hijacked"); !errors.Is(err, client.ErrNotLeader) {
				t.Errorf("Proclaim: got = %v, expected: ErrNotLeader", err)
			}
			if stale.Valid() {
				t.Errorf("IsLeader: got = true, expected: false")
			}
			if err := stale.Resign(ctx); !errors.Is(err, tc.resign) || (tc.resign == nil && err != nil) {
				t.Errorf("Resign: got = %v, expected: %v", err, tc.resign)
			}
			l, err := leader.Leader(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := termOf(l), (term{"leader", "v", tokenOf(leader)}); got != want {
				t.Errorf("Leader: got = %v, expected: %v, untouched", got, want)
			}
		})
	}
}
