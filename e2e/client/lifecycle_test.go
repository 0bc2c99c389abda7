package client_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/statemachine"
)

// The lease lifecycle, end to end through a real server: a record keeps
// its last ended grant and says how it ended; an idle record is deleted
// after its gc_after, and only then; a preferred holder is let in ahead
// of the queue, after the holder in its way was asked to step down.

// leaseNow reads default/name, failing the test on error.
func leaseNow(t *testing.T, c *client.Client, name string) client.Lease {
	t.Helper()
	l, err := c.Lease(context.Background(), client.DefaultNamespace, name)
	if err != nil {
		t.Fatalf("Lease %s: got = %v, expected: the record", name, err)
	}
	return l
}

// nextEvent returns the next event of events about lease name of one of
// types, skipping others, and fails the test after 10s.
func nextEvent(t *testing.T, events <-chan client.LeaseEvent, name string, types ...string) client.LeaseEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("got = watch closed, expected: a %v event of %s", types, name)
			}
			if ev.Err != nil {
				t.Fatalf("got = watch error %v, expected: a %v event of %s", ev.Err, types, name)
			}
			if ev.Name == name && slices.Contains(types, ev.Type) {
				return ev
			}
		case <-timeout:
			t.Fatalf("got = no %v event of %s within 10s, expected: one", types, name)
		}
	}
}

// waitDeleted waits until events has said that each lease of names was
// deleted, in any order, and fails the test after 10s.
func waitDeleted(t *testing.T, events <-chan client.LeaseEvent, names ...string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for len(names) > 0 {
		select {
		case ev, ok := <-events:
			if !ok || ev.Err != nil {
				t.Fatalf("got = watch ended (%v), expected: deleted events of %v", ev.Err, names)
			}
			if ev.Type == "deleted" {
				names = slices.DeleteFunc(names, func(n string) bool { return n == ev.Name })
			}
		case <-timeout:
			t.Fatalf("got = no deleted event of %v within 10s, expected: one each", names)
		}
	}
}

// checkLast checks that the record's last ended grant is the one named.
func checkLast(t *testing.T, l client.Lease, status, holder string, token int64, reason string) {
	t.Helper()
	if l.Status != status {
		t.Fatalf("status of %s: got = %q, expected: %q", l.Name, l.Status, status)
	}
	if len(l.Holders) != 0 || l.Holder != "" || l.Token != 0 {
		t.Fatalf("holders of %s: got = %+v (holder %q token %d), expected: none", l.Name, l.Holders, l.Holder, l.Token)
	}
	e := l.Last
	if e == nil {
		t.Fatalf("last grant of %s: got = nil, expected: %s's grant %d", l.Name, holder, token)
	}
	if e.Holder != holder || e.Token != token || e.Ended != status || e.Reason != reason {
		t.Fatalf("last grant of %s: got = holder %q token %d ended %q reason %q, expected: holder %q token %d ended %q reason %q",
			l.Name, e.Holder, e.Token, e.Ended, e.Reason, holder, token, status, reason)
	}
	// The renew time is the session's last renewal, which may come
	// before the grant (the session's opening, with no heartbeat since).
	if e.AcquireTime.IsZero() || e.RenewTime.IsZero() || e.EndTime.Before(e.RenewTime) || e.EndTime.Before(e.AcquireTime) {
		t.Fatalf("last grant of %s: got = acquired %v renewed %v ended %v, expected: both before the end", l.Name, e.AcquireTime, e.RenewTime, e.EndTime)
	}
}

func TestLeaseRecordSaysHowItsLastGrantEnded(t *testing.T) {
	addr := startServer(t)
	admin := newClient(t, addr)

	t.Run("an unlock leaves it released, naming the holder and its token", func(t *testing.T) {
		ctx := testCtx(t)
		s := newSession(t, admin, client.WithIdentity("unlocker"))
		m := s.Mutex("unlocked")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		token := tokenOf(m)
		if l := leaseNow(t, admin, "unlocked"); l.Status != "held" || l.Last != nil {
			t.Fatalf("while held: got = status %q last %+v, expected: \"held\", no last grant", l.Status, l.Last)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l := leaseNow(t, admin, "unlocked")
		checkLast(t, l, "released", "unlocker", token, "released")
		// A release is its own last sign of life.
		if !l.Last.RenewTime.Equal(l.Last.EndTime) {
			t.Fatalf("renew time: got = %v, expected: the end time %v", l.Last.RenewTime, l.Last.EndTime)
		}
	})

	t.Run("a revoke leaves it revoked with the operator's reason", func(t *testing.T) {
		ctx := testCtx(t)
		s := newSession(t, admin, client.WithIdentity("evicted"))
		m := s.Mutex("broken")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		token := tokenOf(m)
		const reason = "node drained for maintenance"
		revoked, err := admin.Revoke(ctx, client.DefaultNamespace, "broken", 0, reason)
		if err != nil || !slices.Equal(revoked, []int64{token}) {
			t.Fatalf("Revoke: got = %v, %v, expected: [%d], nil", revoked, err, token)
		}
		checkLast(t, leaseNow(t, admin, "broken"), "revoked", "evicted", token, reason)
		wait(t, m.Lost(), "the revoked holder to notice")
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock after the revoke: got = %v, expected: nil", err)
		}
		// The holder's late unlock changes nothing: the record still says
		// how the grant really ended.
		checkLast(t, leaseNow(t, admin, "broken"), "revoked", "evicted", token, reason)
	})

	t.Run("a session that stops heartbeating leaves it expired, last renewed at least a TTL before the end", func(t *testing.T) {
		ctx := testCtx(t)
		const ttl = time.Second
		p := startProxy(t, addr)
		defer p.Resume()
		s := newSession(t, newClient(t, p.Addr()), client.WithTTL(ttl), client.WithHeartbeatInterval(ttl/10), client.WithIdentity("vanished"))
		m := s.Mutex("abandoned")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		token := tokenOf(m)
		// Wait until the leader has seen a heartbeat after the grant, so
		// that the record has a renew time of its own to keep.
		var seen time.Time
		waitFor(t, "a heartbeat after the grant", func() bool {
			l := leaseNow(t, admin, "abandoned")
			seen = l.RenewTime
			return l.RenewTime.After(l.AcquireTime)
		})
		p.Block() // the holder is cut off: no more heartbeats
		var l client.Lease
		waitFor(t, "the session to expire", func() bool {
			l = leaseNow(t, admin, "abandoned")
			return l.Status == "expired"
		})
		checkLast(t, l, "expired", "vanished", token, "session expired")
		e := l.Last
		if e.RenewTime.Before(seen) {
			t.Fatalf("renew time: got = %v, expected: the last heartbeat, at or after %v", e.RenewTime, seen)
		}
		// The server expires a session only after a full TTL without a
		// heartbeat.
		if gap := e.EndTime.Sub(e.RenewTime); gap < ttl {
			t.Fatalf("end - renew time: got = %v, expected: at least the TTL %v", gap, ttl)
		}
	})
}

func TestIdleLeaseIsDeletedAfterItsGCAfter(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	s := newSession(t, c, client.WithIdentity("gc"))
	events := c.WatchLeases(ctx, client.ListOptions{Namespace: client.DefaultNamespace}, 0)

	// Long enough for the reads below to find the record before it goes,
	// even on a loaded machine.
	const gcAfter = time.Second
	lock := func(name string, opts ...client.LeaseOption) (*client.Mutex, int64) {
		t.Helper()
		m := s.Mutex(name, opts...)
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		return m, tokenOf(m)
	}

	kept, _ := lock("kept", client.WithGCAfter(0))
	byDefault, _ := lock("by-default")
	short, shortToken := lock("short", client.WithGCAfter(gcAfter))
	if l := leaseNow(t, c, "short"); l.GCAfter != gcAfter || !l.DeleteTime.IsZero() {
		t.Fatalf("while held: got = gc after %v delete time %v, expected: %v, no delete time", l.GCAfter, l.DeleteTime, gcAfter)
	}
	// Released before short, so that by short's deletion each of them has
	// been idle for longer than short's gc_after.
	for _, m := range []*client.Mutex{kept, byDefault, short} {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// While idle the record says when it goes: its end plus gc_after.
	l := leaseNow(t, c, "short")
	if l.Status != "released" || l.Last == nil {
		t.Fatalf("after unlock: got = status %q last %+v, expected: released, with a last grant", l.Status, l.Last)
	}
	if want := l.Last.EndTime.Add(gcAfter); !l.DeleteTime.Equal(want) {
		t.Fatalf("delete time: got = %v, expected: %v (end + gc_after)", l.DeleteTime, want)
	}

	ev := nextEvent(t, events, "short", "deleted")
	if ev.Holder != "gc" || ev.Token != shortToken {
		t.Fatalf("deleted event: got = holder %q token %d, expected: the last holder %q, token %d", ev.Holder, ev.Token, "gc", shortToken)
	}
	if _, err := c.Lease(ctx, client.DefaultNamespace, "short"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Lease after deletion: got = %v, expected: ErrNotFound", err)
	}
	// Went idle before short did, and outlives it: gc_after 0 keeps it.
	l = leaseNow(t, c, "kept")
	if l.Status != "released" || l.GCAfter != 0 || !l.DeleteTime.IsZero() {
		t.Fatalf("kept: got = status %q gc after %v delete time %v, expected: released, 0, none", l.Status, l.GCAfter, l.DeleteTime)
	}
	// Without WithGCAfter the server's default applies: an hour.
	l = leaseNow(t, c, "by-default")
	if l.GCAfter != time.Hour || !l.DeleteTime.Equal(l.Last.EndTime.Add(time.Hour)) {
		t.Fatalf("by-default: got = gc after %v delete time %v, expected: 1h, end + 1h (%v)", l.GCAfter, l.DeleteTime, l.Last.EndTime.Add(time.Hour))
	}
}

// However the last grant ended, the idle record is collected after its
// gc_after, and the deleted event names its last holder.
func TestIdleLeaseIsCollectedHoweverItsLastGrantEnded(t *testing.T) {
	addr := startServer(t)
	admin := newClient(t, addr)
	events := admin.WatchLeases(testCtx(t), client.ListOptions{Namespace: client.DefaultNamespace}, 0)
	gc := client.WithGCAfter(100 * time.Millisecond)

	for _, tc := range []struct {
		name   string
		status string
		// end ends the grant of m, held by session s.
		end func(t *testing.T, ctx context.Context, s *client.Session, m *client.Mutex, p *proxy)
	}{
		{"released by its holder", "released", func(t *testing.T, ctx context.Context, s *client.Session, m *client.Mutex, p *proxy) {
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"released by closing the session", "released", func(t *testing.T, ctx context.Context, s *client.Session, m *client.Mutex, p *proxy) {
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"revoked by an operator", "revoked", func(t *testing.T, ctx context.Context, s *client.Session, m *client.Mutex, p *proxy) {
			if _, err := admin.Revoke(ctx, client.DefaultNamespace, m.Lease().Name, 0, "test"); err != nil {
				t.Fatal(err)
			}
		}},
		{"expired with its session", "expired", func(t *testing.T, ctx context.Context, s *client.Session, m *client.Mutex, p *proxy) {
			p.Block()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			p := startProxy(t, addr)
			defer p.Resume()
			// A short TTL only where the session is meant to expire.
			ttl := 10 * time.Second
			if tc.status == "expired" {
				ttl = 500 * time.Millisecond
			}
			s := newSession(t, newClient(t, p.Addr()), client.WithTTL(ttl), client.WithIdentity("holder"))
			name := strings.ReplaceAll(tc.name, " ", "-")
			m := s.Mutex(name, gc)
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			token := tokenOf(m)
			tc.end(t, ctx, s, m, p)
			ev := nextEvent(t, events, name, tc.status, "deleted")
			if ev.Type != tc.status {
				t.Fatalf("first event after the grant: got = %q, expected: %q", ev.Type, tc.status)
			}
			ev = nextEvent(t, events, name, "deleted")
			if ev.Holder != "holder" || ev.Token != token {
				t.Fatalf("deleted event: got = holder %q token %d, expected: holder %q token %d", ev.Holder, ev.Token, "holder", token)
			}
			if _, err := admin.Lease(ctx, client.DefaultNamespace, name); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("Lease after deletion: got = %v, expected: ErrNotFound", err)
			}
		})
	}
}

// Fencing tokens are global revisions: a name deleted and made again
// never hands out a token a holder of the old record had.
func TestLeaseMadeAgainAfterDeletionGetsAHigherToken(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	s := newSession(t, c)
	events := c.WatchLeases(ctx, client.ListOptions{Namespace: client.DefaultNamespace}, 0)

	// The first grant keeps the record while the second is taken; the
	// second lets it go soon after its release.
	long := s.Mutex("reused", client.WithGCAfter(time.Hour))
	m := s.Mutex("reused", client.WithGCAfter(100*time.Millisecond))
	var earlier []int64
	for _, m := range []*client.Mutex{long, m} {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		earlier = append(earlier, tokenOf(m))
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deleted := nextEvent(t, events, "reused", "deleted")
	if deleted.Token != earlier[1] {
		t.Fatalf("deleted event: got = token %d, expected: the last grant's %d", deleted.Token, earlier[1])
	}

	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	token := tokenOf(m)
	for _, old := range earlier {
		if token <= old {
			t.Fatalf("token after deletion: got = %d, expected: above every earlier token %v", token, earlier)
		}
	}
	l := leaseNow(t, c, "reused")
	if l.Last != nil || l.CreateRevision <= deleted.Revision {
		t.Fatalf("new record: got = last %+v created at %d, expected: no last grant, created after the deletion at %d", l.Last, l.CreateRevision, deleted.Revision)
	}
}

// A lease is collected only once idle: not while held, not while a
// session waits for it, however long ago its gc_after would have run out.
func TestBusyLeaseIsNeverCollected(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	a := newSession(t, c, client.WithIdentity("a"))
	b := newSession(t, c, client.WithIdentity("b"))
	events := c.WatchLeases(ctx, client.ListOptions{Namespace: client.DefaultNamespace}, 0)
	gc := client.WithGCAfter(100 * time.Millisecond)

	held := a.Mutex("held", gc)
	if err := held.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	queued := a.Mutex("queued", gc)
	if err := queued.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := b.Mutex("queued", gc)
	granted := make(chan error, 1)
	go func() { granted <- waiter.Lock(ctx) }()
	waitQueued(t, c, "queued", 1)

	// The control: idle from now on, so collected about gc_after later;
	// the busy ones have been busy for longer than that by then.
	control := a.Mutex("control", gc)
	if err := control.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := control.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, events, "control", "deleted")
	for _, name := range []string{"held", "queued"} {
		l := leaseNow(t, c, name)
		if l.Status != "held" || !l.DeleteTime.IsZero() {
			t.Fatalf("%s after the control's deletion: got = status %q delete time %v, expected: held, no delete time", name, l.Status, l.DeleteTime)
		}
	}

	// Handed from a to the waiter: never idle, so never collected.
	if err := queued.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, granted, "the waiter's grant"); err != nil {
		t.Fatal(err)
	}
	if l := leaseNow(t, c, "queued"); l.Holder != "b" || !l.DeleteTime.IsZero() {
		t.Fatalf("queued after the hand-over: got = holder %q delete time %v, expected: b, no delete time", l.Holder, l.DeleteTime)
	}
	// Once their last holders let go, both are idle, and go in turn.
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitDeleted(t, events, "queued", "held")
}

func TestPreferredHolderIsGrantedAheadOfTheQueue(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	a := newSession(t, c, client.WithIdentity("a"))
	b := newSession(t, c, client.WithIdentity("b"))
	p := newSession(t, c, client.WithIdentity("p"))

	ma := a.Mutex("primary")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost, grantCtx := ma.Lost(), ma.Context()
	mb, mp := b.Mutex("primary"), p.Mutex("primary")
	bGranted, pGranted := make(chan error, 1), make(chan error, 1)
	go func() { bGranted <- mb.Lock(ctx) }()
	waitQueued(t, c, "primary", 1) // b first: FIFO would grant b
	go func() { pGranted <- mp.Lock(ctx) }()
	waitQueued(t, c, "primary", 2)

	l, err := c.SetPreferredHolder(ctx, client.DefaultNamespace, "primary", "p")
	if err != nil {
		t.Fatal(err)
	}
	if l.PreferredHolder != "p" {
		t.Fatalf("SetPreferredHolder: got = preferred %q, expected: \"p\"", l.PreferredHolder)
	}

	// a is asked to step down: its grant ends here, with that cause...
	wait(t, lost, "a's grant to end")
	if cause := context.Cause(grantCtx); !errors.Is(cause, client.ErrStepDown) {
		t.Fatalf("cause: got = %v, expected: ErrStepDown", cause)
	}
	if ma.Valid() {
		t.Fatal("got = a's grant valid after the step-down request, expected: invalid")
	}
	// ...but nothing is taken from it on the server until it lets go.
	l = leaseNow(t, c, "primary")
	if l.Holder != "a" || len(l.Holders) != 1 || l.Holders[0].StepDown == "" || len(l.Waiters) != 2 {
		t.Fatalf("after the request: got = holders %+v waiters %+v, expected: a, asked to step down, and b and p waiting", l.Holders, l.Waiters)
	}
	select {
	case err := <-pGranted:
		t.Fatalf("got = p granted (%v) while a holds, expected: p waits", err)
	case err := <-bGranted:
		t.Fatalf("got = b granted (%v) while a holds, expected: b waits", err)
	default:
	}

	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, pGranted, "p's grant"); err != nil {
		t.Fatal(err)
	}
	l = leaseNow(t, c, "primary")
	if l.Holder != "p" || len(l.Waiters) != 1 || l.Waiters[0].Holder != "b" {
		t.Fatalf("after a let go: got = holder %q waiters %+v, expected: p, with b waiting", l.Holder, l.Waiters)
	}
	if l.Last == nil || l.Last.Holder != "a" || l.Last.Ended != "released" {
		t.Fatalf("last grant: got = %+v, expected: a's, released", l.Last)
	}
	// The preferred holder is never asked to step down for b.
	select {
	case <-mp.Lost():
		t.Fatalf("got = p's grant ended (%v), expected: held", context.Cause(mp.Context()))
	default:
	}
	if err := mp.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bGranted, "b's grant"); err != nil {
		t.Fatal(err)
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// RunElection stops leading when asked to step down, resigns, and the
// preferred candidate leads.
func TestRunElectionHandsOverToThePreferredCandidate(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := testCtx(t)
	const name = "scheduler"
	a := newSession(t, c, client.WithIdentity("a"))
	p := newSession(t, c, client.WithIdentity("p"))

	type leadership struct {
		token int64
		cause error // why its context ended
	}
	var mu sync.Mutex
	var leaders []string // in the order they started
	callbacks := func(id string, started, ended chan leadership) client.Callbacks {
		return client.Callbacks{OnStartedLeading: func(ctx context.Context) {
			mu.Lock()
			leaders = append(leaders, id)
			mu.Unlock()
			tok, _ := client.TokenFromContext(ctx)
			started <- leadership{token: tok.Token}
			<-ctx.Done()
			ended <- leadership{token: tok.Token, cause: context.Cause(ctx)}
		}}
	}
	aStarted, aEnded := make(chan leadership, 4), make(chan leadership, 4)
	pStarted, pEnded := make(chan leadership, 4), make(chan leadership, 4)
	stopA := runElection(t, a, name, callbacks("a", aStarted, aEnded))
	first := wait(t, aStarted, "a to lead")

	// Preferring p while p does not campaign asks nothing of a.
	if _, err := c.SetPreferredHolder(ctx, client.DefaultNamespace, name, "p"); err != nil {
		t.Fatal(err)
	}
	if l := leaseNow(t, c, name); l.Holder != "a" || l.Holders[0].StepDown != "" {
		t.Fatalf("preferred p, p not waiting: got = holders %+v, expected: a, not asked to step down", l.Holders)
	}

	stopP := runElection(t, p, name, callbacks("p", pStarted, pEnded))
	ended := wait(t, aEnded, "a to stop leading")
	if ended.token != first.token || !errors.Is(ended.cause, client.ErrStepDown) {
		t.Fatalf("a's leadership ended: got = token %d cause %v, expected: token %d, ErrStepDown", ended.token, ended.cause, first.token)
	}
	led := wait(t, pStarted, "p to lead")
	if led.token <= first.token {
		t.Fatalf("p's token: got = %d, expected: above a's %d", led.token, first.token)
	}
	if l := leaseNow(t, c, name); l.Holder != "p" {
		t.Fatalf("holder: got = %q, expected: \"p\"", l.Holder)
	}
	// a campaigns again behind p, and p is left alone.
	waitQueued(t, c, name, 1)
	select {
	case got := <-pEnded:
		t.Fatalf("got = p stopped leading (%v), expected: p leads on", got.cause)
	case got := <-aStarted:
		t.Fatalf("got = a leads again (token %d) while p leads, expected: a waits", got.token)
	default:
	}
	if err := stopP(); err != nil {
		t.Fatalf("RunElection p: got = %v, expected: nil (a clean stop)", err)
	}
	if err := stopA(); err != nil {
		t.Fatalf("RunElection a: got = %v, expected: nil (a clean stop)", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaders) < 2 || leaders[0] != "a" || leaders[1] != "p" {
		t.Fatalf("leaders in order: got = %v, expected: a, then p", leaders)
	}
}

func TestSetPreferredHolderOfAnUnknownLeaseIsNotFound(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	_, err := c.SetPreferredHolder(testCtx(t), client.DefaultNamespace, "nobody-ever-held-this", "p")
	if !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("got = %v, expected: ErrNotFound", err)
	}
}

// In a cluster formed from scratch, every member registers the version
// its build runs and the leader raises the cluster version to it: the
// gated calls then work through any member.
func TestEveryMemberOfAFreshClusterRunsTheLatestVersion(t *testing.T) {
	cl := newTCPCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := newClient(t, cl.nodes[0].addr)
	leader := leaderOf(t, settledMembers(t, ctx, admin, 3))
	var follower *tcpNode
	for _, n := range cl.nodes {
		if n.id != leader.ID {
			follower = n
		}
	}

	var members []client.Member
	waitFor(t, "every member to run the latest cluster version", func() bool {
		members = settledMembers(t, ctx, admin, 3)
		for _, m := range members {
			if m.Version != statemachine.Version || m.ClusterVersion != statemachine.Version {
				return false
			}
		}
		return true
	})

	// Through a follower: the calls are forwarded to the leader.
	c := newClient(t, follower.addr)
	s := newSession(t, c, client.WithIdentity("a"))
	m := s.Mutex("primary", client.WithGCAfter(100*time.Millisecond))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.SetPreferredHolder(ctx, client.DefaultNamespace, "primary", "p")
	if err != nil || l.PreferredHolder != "p" {
		t.Fatalf("SetPreferredHolder: got = preferred %q, %v, expected: \"p\", nil", l.PreferredHolder, err)
	}
	events := c.WatchLeases(ctx, client.ListOptions{Namespace: client.DefaultNamespace}, 0)
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitDeleted(t, events, "primary")
}
