package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// failoverTime is the longest a new leader takes to be elected after
// the leader stops: a follower that has not heard from it for a random
// time between --election-timeout and twice it stands (pre-vote, then
// vote), and the vote takes an election timeout at most.
const failoverTime = 3 * electionTimeout

// stallFor is how long the leader is frozen in
// TestLeaderStallKeepsEveryLock for sessions of the given TTL: the TTL
// less failoverTime. 3.5s, 4.5s and 6.5s for TTLs of 5s, 6s and 8s,
// each longer than the validity window (0.75 TTL) left to some session
// when the leader froze.
func stallFor(ttl time.Duration) time.Duration { return ttl - failoverTime }

// TestLeaderStallKeepsEveryLock freezes the leader (SIGSTOP) for less
// than a TTL, again and again, while sessions of 5s, 6s and 8s TTLs,
// three of each on three clients that start on different nodes, each
// hold a Mutex. A frozen leader keeps its connections and answers
// nothing; a new one is elected within failoverTime. Then:
//
//   - no session is lost and no Lost fires: a heartbeat the frozen
//     leader leaves unanswered goes through another node to the new
//     leader in time (it used to wait on the frozen node for the whole
//     validity window and give the session up);
//   - every lock is still held by the session that took it, with the
//     same fencing token, as each client and the cluster see it.
//
// The shortest TTL is 5s because no client can keep a shorter one
// through every stall: a session whose heartbeat fell due as the leader
// froze has 0.75 TTL - TTL/3 = 5/12 TTL of validity left, 1.25s at a
// TTL of 3s, less than failoverTime (1.5s). At 5s it has 2.08s.
func TestLeaderStallKeepsEveryLock(t *testing.T) {
	skipShort(t)
	c := proccluster.Start(t, 3, "--election-timeout", electionTimeout.String())
	ttls := []time.Duration{5 * time.Second, 6 * time.Second, 8 * time.Second}
	stalls := []time.Duration{stallFor(ttls[0]), stallFor(ttls[1]), stallFor(ttls[2]), stallFor(ttls[0]), stallFor(ttls[1])}
	var frozen time.Duration
	for _, d := range stalls {
		frozen += d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+frozen+time.Duration(len(stalls))*10*time.Second)
	defer cancel()

	type holder struct {
		name  string
		ttl   time.Duration
		s     *client.Session
		m     *client.Mutex
		token int64
	}
	var holders []*holder
	for first := range c.Nodes {
		cl := newClient(t, c, first)
		for _, ttl := range ttls {
			s, err := cl.NewSession(ctx, client.WithTTL(ttl))
			if err != nil {
				t.Fatalf("open a session with TTL %v: %v", ttl, err)
			}
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			h := &holder{name: fmt.Sprintf("stall-%d-%v", first, ttl), ttl: ttl, s: s}
			h.m = s.Mutex(h.name)
			if err := h.m.Lock(ctx); err != nil {
				t.Fatalf("lock %s: %v", h.name, err)
			}
			tok, _ := h.m.Token()
			h.token = tok.Token
			holders = append(holders, h)
		}
	}
	admin := newClient(t, c, 0)

	// The closest each TTL came to losing a session: the least validity
	// left, sampled, for the log.
	margin := map[time.Duration]time.Duration{}
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			for _, h := range holders {
				if left := time.Until(h.s.ValidUntil()); h.s.Err() == nil && (margin[h.ttl] == 0 || left < margin[h.ttl]) {
					margin[h.ttl] = left
				}
			}
			select {
			case <-sampling.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() {
		stopSampling()
		<-sampled
		for _, ttl := range ttls {
			t.Logf("TTL %v: least validity left at any time: %v", ttl, margin[ttl].Round(time.Millisecond))
		}
	}()

	// check reports every lost session and every lock that changed hands.
	check := func(when string) {
		t.Helper()
		for _, h := range holders {
			select {
			case <-h.s.Lost():
				t.Errorf("%s: session of %s (TTL %v): got = lost (%v), expected: alive", when, h.name, h.ttl, h.s.Err())
				continue
			default:
			}
			select {
			case <-h.m.Lost():
				t.Errorf("%s: %s (TTL %v): got = grant lost (%v), expected: held", when, h.name, h.ttl, context.Cause(h.m.Context()))
			default:
			}
			if tok, _ := h.m.Token(); tok.Token != h.token {
				t.Errorf("%s: %s's token as its holder sees it: got = %d, expected: %d", when, h.name, tok.Token, h.token)
			}
			l, err := admin.Lease(ctx, client.DefaultNamespace, h.name)
			if err != nil {
				t.Errorf("%s: read lease %s: %v", when, h.name, err)
				continue
			}
			if l.Holder != h.s.Identity() || l.Token != h.token {
				t.Errorf("%s: %s on the cluster: got = held by %q with token %d, expected: %q with %d", when, h.name, l.Holder, l.Token, h.s.Identity(), h.token)
			}
		}
	}

	for round, d := range stalls {
		leader := c.WaitLeader(ctx)
		c.Nodes[leader].Pause()
		t.Logf("round %d: leader %d frozen at %s", round+1, leader, time.Now().Format(time.StampMilli))
		time.Sleep(d)
		next := c.Leader(ctx, leader)
		c.Nodes[leader].Resume()
		resumed := time.Now()
		c.WaitLeader(ctx)
		c.WaitCaughtUp(ctx)
		t.Logf("round %d: leader %d frozen for %v; node %d led when it woke", round+1, leader, d, next)
		check(fmt.Sprintf("after stall %d (%v)", round+1, d))
		if t.Failed() {
			return
		}
		// Each stall starts from sessions that have all been heard since
		// the last one ended, as they are between two real pauses.
		for _, h := range holders {
			for h.s.ValidUntil().Add(-h.ttl*3/4).Before(resumed) && h.s.Err() == nil {
				select {
				case <-ctx.Done():
					t.Fatalf("session of %s: no heartbeat acknowledged since stall %d ended", h.name, round+1)
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		check(fmt.Sprintf("%v after stall %d", time.Since(resumed).Round(time.Millisecond), round+1))
	}
}
