package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/raftnode"
)

// dial returns a Go client of the given nodes, closed when the test ends.
func dial(t testing.TB, nodes ...*cluster.Node) *client.Client {
	t.Helper()
	var endpoints []string
	for _, n := range nodes {
		endpoints = append(endpoints, n.URL())
	}
	c, err := client.New(context.Background(), endpoints, client.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestAFollowerAnswersAsTheLeaderWould: writes and linearizable reads
// sent to any node get the leader's answer, so a write through one
// follower is read through the other at once.
func TestAFollowerAnswersAsTheLeaderWould(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	a, b := followers[0], followers[1]
	for i := range 20 {
		value := fmt.Sprint(i)
		if _, err := a.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: value})); err != nil {
			t.Fatalf("put %d through %s: %v", i, a, err)
		}
		got, err := b.API().KV.Get(waitCtx(t), connect.NewRequest(&tenurev1.GetRequest{Key: "k"}))
		if err != nil || got.Msg.GetKv().GetValue() != value {
			t.Fatalf("get through %s right after put %d through %s: got = %v, %v, expected: %s", b, i, a, got, err, value)
		}
	}

	// A lease taken through one follower is validated through the other.
	s := openSession(t, a, time.Minute)
	token := acquire(t, a, s, "job")
	if v := validate(t, b, "job", token); !v.GetValid() {
		t.Errorf("validate through %s: got = invalid, expected: token %d valid", b, token)
	}
	// Domain errors come back as the leader gave them.
	_, err := b.API().Leases.Release(waitCtx(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: token + 100}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("release with a wrong token through %s: got = %v, expected: failed precondition (not holder)", b, err)
	}
	if n := counter(t, lead, "tenure_forwarded_calls_total", nil); n != 0 {
		t.Errorf("the leader forwarded %v calls, expected: none", n)
	}
	if n := counter(t, a, "tenure_forwarded_calls_total", nil); n < 20 {
		t.Errorf("%s forwarded %v calls, expected: at least the 20 puts", a, n)
	}
}

// TestAStaleReadIsAnsweredLocallyAndALinearizableOneNeverIs: a follower
// cut off from the leader answers a stale read from its own, older state,
// but never answers a linearizable one with it.
func TestAStaleReadIsAnsweredLocallyAndALinearizableOneNeverIs(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	cut := followers[0]
	if _, err := lead.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "old"})); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, lead, cut)
	c.Disconnect(cut)
	next := leaderOtherThan(t, c, cut)
	if _, err := next.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "new"})); err != nil {
		t.Fatal(err)
	}

	got, err := cut.API().KV.Get(waitCtx(t), connect.NewRequest(&tenurev1.GetRequest{Key: "k", Stale: true}))
	if err != nil || got.Msg.GetKv().GetValue() != "old" {
		t.Errorf("stale get on the cut-off %s: got = %v, %v, expected: its own old value", cut, got, err)
	}
	got, err = cut.API().KV.Get(waitCtx(t), connect.NewRequest(&tenurev1.GetRequest{Key: "k"}))
	if err == nil && got.Msg.GetKv().GetValue() != "new" {
		t.Errorf("linearizable get on the cut-off %s: got = %q, expected: new, or an error", cut, got.Msg.GetKv().GetValue())
	}
}

// TestTheGoClientFollowsTheLeader: a client given one follower learns the
// leader from the first answer and calls it directly from then on.
func TestTheGoClientFollowsTheLeader(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	f := followers[0]
	cl := dial(t, f)
	for i := range 10 {
		if _, err := cl.KV().Put(waitCtx(t), "k", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := cl.Endpoints()[0]; got != lead.URL() {
		t.Errorf("endpoint in use after ten puts: got = %s, expected: the leader %s", got, lead.URL())
	}
	if n := counter(t, f, "tenure_forwarded_calls_total", nil); n > 1 {
		t.Errorf("%s forwarded %v calls, expected: only the first", f, n)
	}
	// Sessions heartbeat on the leader's stream.
	s, err := cl.NewSession(waitCtx(t), client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	m := s.Mutex("job")
	if err := m.Lock(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // more than a TTL of heartbeats
	if !m.Valid() {
		t.Error("a session opened through a follower lost its lock within a TTL, expected: heartbeats reach the leader")
	}
}

// TestAParkedAcquireKeepsItsPlaceAcrossFailover is safety rule 6 through
// a failover: two waiters queue behind a holder, the leader dies, and the
// waits carry on against the new leader in the same order, without their
// callers seeing anything but latency.
func TestAParkedAcquireKeepsItsPlaceAcrossFailover(t *testing.T) {
	c := cluster.New(t, 3)
	old := leader(t, c)
	cl := dial(t, c.Nodes()...)
	ctx := waitCtx(t)
	session := func() *client.Session {
		s, err := cl.NewSession(ctx, client.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	holder := session().Mutex("job")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var order []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range []string{"first", "second"} {
		m := session().Mutex("job")
		wg.Go(func() {
			if err := m.Lock(ctx); err != nil {
				t.Errorf("%s waiter: %v", name, err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			if err := m.Unlock(ctx); err != nil {
				t.Errorf("%s waiter unlock: %v", name, err)
			}
		})
		// Queue in a known order.
		waitFor(t, ctx, name+" to queue", func() bool {
			l, err := cl.Lease(ctx, "", "job")
			return err == nil && len(l.Waiters) == map[string]int{"first": 1, "second": 2}[name]
		})
	}

	if err := c.Stop(old); err != nil {
		t.Fatal(err)
	}
	next := leader(t, c)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatalf("unlock on %s after failover: %v", next, err)
	}
	wg.Wait()
	if fmt.Sprint(order) != "[first second]" {
		t.Errorf("grant order after failover: got = %v, expected: [first second]", order)
	}
}

// TestARollingRestartCostsClientsNothing: restarting every node in turn,
// the way an upgrade does, while clients lock, write and read, loses no
// session and fails no call: a node that stops hands leadership over and
// finishes what it started, and clients retry what it refused.
func TestARollingRestartCostsClientsNothing(t *testing.T) {
	// tenure serve's raft timeouts, not the harness's shorter ones: the
	// test is about planned restarts, and an election forced by a starved
	// CPU (the whole suite shares two cores) would, honestly, leave a
	// write in doubt.
	c := cluster.New(t, 3, cluster.WithRaft(func(rc *raftnode.Config) {
		rc.ElectionTimeout = 500 * time.Millisecond
	}))
	cl := dial(t, c.Nodes()...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ops, failures atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	var wg sync.WaitGroup
	var sessions []*client.Session
	for w := range 4 {
		s, err := cl.NewSession(waitCtx(t), client.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
		wg.Go(func() {
			m := s.Mutex(fmt.Sprintf("job-%d", w))
			for i := 0; ctx.Err() == nil; i++ {
				if err := m.Lock(ctx); err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("lock: %w", err))
					}
					return
				}
				if _, err := cl.KV().Put(context.Background(), fmt.Sprintf("w%d", w), fmt.Sprint(i)); err != nil {
					fail(fmt.Errorf("put: %w", err))
				}
				if kv, err := cl.KV().Get(context.Background(), fmt.Sprintf("w%d", w)); err != nil || kv.Value != fmt.Sprint(i) {
					fail(fmt.Errorf("get after put %d: %+v, %w", i, kv, err))
				}
				if err := m.Unlock(context.Background()); err != nil {
					fail(fmt.Errorf("unlock: %w", err))
				}
				ops.Add(1)
			}
		})
	}
	for _, n := range c.Nodes() {
		before := ops.Load()
		waitFor(t, waitCtx(t), "load before restarting "+n.ID(), func() bool { return ops.Load() >= before+20 })
		if err := c.Shutdown(n); err != nil {
			t.Fatalf("shutdown %s: %v", n, err)
		}
		if err := c.Restart(n); err != nil {
			t.Fatalf("restart %s: %v", n, err)
		}
		lead := leader(t, c)
		caughtUp(t, lead, n)
	}
	before := ops.Load()
	waitFor(t, waitCtx(t), "load after the restarts", func() bool { return ops.Load() >= before+20 })
	cancel()
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Errorf("%d calls failed during the rolling restart, the first: %v", n, firstErr.Load())
	}
	for _, s := range sessions {
		select {
		case <-s.Lost():
			t.Errorf("session %d was lost: %v", s.ID(), s.Err())
		default:
		}
		if err := s.Close(context.Background()); err != nil && !errors.Is(err, client.ErrSessionExpired) {
			t.Errorf("close session %d: %v", s.ID(), err)
		}
	}
}

// TestAnAcquireParkedThroughAFollowerWaitsAsLongAsItsCaller: forwarding
// bounds only the search for a leader, not the call: a curl user's wait
// parked through a follower lasts until the grant.
func TestAnAcquireParkedThroughAFollowerWaitsAsLongAsItsCaller(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	holder := openSession(t, lead, time.Minute)
	waiter := openSession(t, lead, time.Minute)
	token := acquire(t, lead, holder, "job")
	keep(t, holder, time.Second, c.Nodes()...)
	keep(t, waiter, time.Second, c.Nodes()...)
	done := make(chan *tenurev1.AcquireResponse, 1)
	go func() {
		resp, err := followers[0].API().Leases.Acquire(context.Background(), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: waiter, Name: "job", Wait: true}))
		if err != nil {
			t.Errorf("waiting acquire through %s: %v", followers[0], err)
			done <- nil
			return
		}
		done <- resp.Msg
	}()
	time.Sleep(4 * time.Second) // longer than a forward may look for a leader
	select {
	case r := <-done:
		t.Fatalf("the waiting acquire returned %v while the lock was held, expected: still waiting", r)
	default:
	}
	if _, err := lead.API().Leases.Release(waitCtx(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: token})); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r == nil || !r.GetAcquired() || r.GetToken() <= token {
		t.Errorf("the waiting acquire after the release: got = %v, expected: granted with a token above %d", r, token)
	}
}

// TestAFollowerServesWatchesFromItsOwnState: a watch on a follower sees
// every event of writes made on the leader, in revision order, without
// gaps (rule 8), since every replica applies the same events at the same
// revisions.
func TestAFollowerServesWatchesFromItsOwnState(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	first, err := lead.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "w/start", Value: "v"}))
	if err != nil {
		t.Fatal(err)
	}
	caughtUp(t, lead, followers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events := dial(t, followers[0]).KV().Watch(ctx, "w/", client.WithPrefix(), client.WithRevision(first.Msg.GetRevision()+1))
	const writes = 20
	// The follower may apply the last put before the leader answers it:
	// the test waits for the writer, not just for the events.
	written := make(chan struct{})
	defer func() { <-written }()
	go func() {
		defer close(written)
		for i := range writes {
			if _, err := lead.API().KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: fmt.Sprintf("w/%02d", i), Value: "v"})); err != nil {
				t.Errorf("put %d: %v", i, err)
				return
			}
		}
	}()
	last := first.Msg.GetRevision()
	for i := range writes {
		ev, ok := <-events
		if !ok || ev.Err != nil {
			t.Fatalf("watch on %s ended after %d events: %v", followers[0], i, ev.Err)
		}
		if want := fmt.Sprintf("w/%02d", i); ev.KV.Key != want || ev.Revision != last+1 {
			t.Fatalf("event %d on %s: got = %s at revision %d, expected: %s at revision %d", i, followers[0], ev.KV.Key, ev.Revision, want, last+1)
		}
		last = ev.Revision
	}
}
