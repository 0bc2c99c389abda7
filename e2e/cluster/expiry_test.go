package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

const expiryTTL = 5 * time.Second

// TestSessionsNeverExpireEarlyAcrossLeaderChanges checks safety rule 4,
// "TTL is a lower bound on the server", with heartbeats sent as plain
// Refresh calls every TTL/3 to whichever node answers (so that only the
// server's side is under test):
//
//   - sessions heartbeating through back-to-back leader changes (kill -9
//     and SIGSTOP of the leader, in turn) are never expired;
//   - a session whose heartbeats stop expires no earlier than TTL after
//     the send of its last acknowledged heartbeat and no later than TTL +
//     election timeout + 1s after its acknowledgement.
func TestSessionsNeverExpireEarlyAcrossLeaderChanges(t *testing.T) {
	skipShort(t)
	rounds := faultRounds(t, 5)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second+time.Duration(rounds)*15*time.Second)
	defer cancel()
	nodes := make([]raw, len(c.Nodes))
	for i, n := range c.Nodes {
		nodes[i] = rawClients(t, "http://"+n.API)
	}

	hbCtx, stopHeartbeats := context.WithCancel(ctx)
	defer stopHeartbeats()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var expired []string
	ids := make([]int64, 8)
	for i := range ids {
		ids[i] = openRaw(ctx, t, nodes, expiryTTL)
		wg.Go(func() {
			for hbCtx.Err() == nil {
				if _, _, gone := refresh(hbCtx, nodes, ids[i]); gone {
					mu.Lock()
					expired = append(expired, fmt.Sprintf("session %d", ids[i]))
					mu.Unlock()
					return
				}
				pause(hbCtx, expiryTTL/3)
			}
		})
	}
	for round := 1; round <= rounds; round++ {
		leader := c.WaitLeader(ctx)
		how := "kill -9"
		if round%2 == 0 {
			how = "SIGSTOP"
			c.Nodes[leader].Pause()
		} else {
			c.Nodes[leader].Kill()
		}
		next := c.WaitLeader(ctx, leader)
		if how == "SIGSTOP" {
			c.Nodes[leader].Resume()
		} else {
			c.Nodes[leader].Restart(ctx)
		}
		t.Logf("round %d: %s leader %d; node %d leads", round, how, leader, next)
	}
	stopHeartbeats()
	wg.Wait()
	for _, e := range expired {
		t.Errorf("%s heartbeating every TTL/3: got = expired, expected: alive", e)
	}
	for _, id := range ids {
		if _, err := getSession(ctx, nodes, id); err != nil {
			t.Errorf("session %d after the leader changes: got = %v, expected: alive", id, err)
		}
	}

	t.Run("a session whose heartbeats stop expires within its bounds", func(t *testing.T) {
		c.WaitLeader(ctx)
		id := openRaw(ctx, t, nodes, expiryTTL)
		sent, acked, gone := refresh(ctx, nodes, id)
		if gone {
			t.Fatalf("session %d expired at its first heartbeat", id)
		}
		earliest := sent.Add(expiryTTL)
		latest := acked.Add(expiryTTL + electionTimeout + time.Second)
		for {
			start := time.Now()
			_, err := getSession(ctx, nodes, id)
			end := time.Now()
			switch {
			case err == nil && start.After(latest):
				t.Fatalf("session %d still alive %v after its last acknowledged heartbeat, expected: expired within TTL + election timeout + 1s = %v",
					id, start.Sub(acked).Round(time.Millisecond), expiryTTL+electionTimeout+time.Second)
			case err == nil:
			case reason(err) == "session-not-found":
				if end.Before(earliest) {
					t.Errorf("session %d expired %v after its last acknowledged heartbeat was sent, expected: no earlier than TTL = %v",
						id, end.Sub(sent).Round(time.Millisecond), expiryTTL)
				}
				t.Logf("session %d gone between %v and %v after its last heartbeat was sent", id, start.Sub(sent).Round(time.Millisecond), end.Sub(sent).Round(time.Millisecond))
				return
			}
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
			pause(ctx, 20*time.Millisecond)
		}
	})
}

func openRaw(ctx context.Context, t *testing.T, nodes []raw, ttl time.Duration) int64 {
	t.Helper()
	for ctx.Err() == nil {
		resp, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
			return nodes[rand.N(len(nodes))].sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "expiry", Ttl: durationpb.New(ttl)}))
		})
		if err == nil {
			return resp.Msg.GetSession().GetId()
		}
		pause(ctx, 50*time.Millisecond)
	}
	t.Fatal(ctx.Err())
	return 0
}

// refresh sends one heartbeat, trying node after node until one is
// answered, and returns when the answered one was sent and answered, and
// whether the server said the session is gone.
func refresh(ctx context.Context, nodes []raw, id int64) (sent, acked time.Time, gone bool) {
	for i := rand.N(len(nodes)); ctx.Err() == nil; i++ {
		sent = time.Now()
		resp, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.KeepAliveResponse], error) {
			return nodes[i%len(nodes)].sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: id}))
		})
		switch {
		case err == nil:
			return sent, time.Now(), resp.Msg.GetExpired()
		case reason(err) == "session-not-found":
			return sent, time.Now(), true
		}
		pause(ctx, 20*time.Millisecond)
	}
	return sent, time.Now(), false
}

// getSession reads a session linearizably through any node that answers
// with a verdict.
func getSession(ctx context.Context, nodes []raw, id int64) (*tenurev1.Session, error) {
	var last error
	for i := range 3 * len(nodes) {
		resp, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetSessionResponse], error) {
			return nodes[i%len(nodes)].sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id}))
		})
		if err == nil {
			return resp.Msg.GetSession(), nil
		}
		if reason(err) == "session-not-found" {
			return nil, err
		}
		last = err
		pause(ctx, 20*time.Millisecond)
	}
	return nil, last
}
