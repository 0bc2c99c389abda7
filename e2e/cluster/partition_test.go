package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/linearizability"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// electionTimeout is `tenure serve`'s default --election-timeout.
const electionTimeout = 500 * time.Millisecond

// TestLeaderCutOffStepsDownAndRejoinsAsFollower isolates the leader from
// both followers and from clients, while lockers work through every
// node:
//
//   - the old leader steps down within the election timeout (plus 1s of
//     scheduling slack) and grants nothing, even asked directly;
//   - the majority elects a new leader and the lockers go on;
//   - healed, the old leader follows the new one and catches up;
//   - no two critical sections overlapped and the fence accepted no
//     stale write, throughout.
func TestLeaderCutOffStepsDownAndRejoinsAsFollower(t *testing.T) {
	skipShort(t)
	rounds := faultRounds(t, 1)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+time.Duration(rounds)*20*time.Second)
	defer cancel()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	l := startLockers(loadCtx, t, c, 16, 2, 10*time.Second)
	l.waitProgress(ctx, t, 16)

	for round := 1; round <= rounds; round++ {
		old := c.WaitLeader(ctx)
		// A session opened on the old leader before the cut, to ask it for
		// a grant directly once it is cut off.
		direct := rawClients(t, "http://"+c.Nodes[old].Direct)
		open, err := direct.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "cut-off", Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatalf("open a session on leader %d: %v", old, err)
		}
		cut := time.Now()
		c.Isolate(old)
		stepped := waitRole(ctx, t, c, old, func(st *tenurev1.StatusResponse) bool { return st.GetRole() != "leader" })
		if limit := electionTimeout + time.Second; stepped > limit {
			t.Errorf("round %d: cut-off leader %d stepped down after %v, expected: within %v", round, old, stepped.Round(time.Millisecond), limit)
		}
		next := c.WaitLeader(ctx, old)
		resp, err := direct.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: open.Msg.GetSession().GetId(), Name: "lease-0", Capacity: 1}))
		if err == nil {
			t.Errorf("round %d: acquire on the cut-off old leader: got = acquired %v token %d, expected: an error (it leads no more and cannot reach the leader)",
				round, resp.Msg.GetAcquired(), resp.Msg.GetToken())
		}
		l.waitProgress(ctx, t, 16)
		c.Heal()
		// A follower of another node: usually next, but the rejoin may
		// cost next its term on a loaded machine, and another lead.
		waitRole(ctx, t, c, old, func(st *tenurev1.StatusResponse) bool {
			return st.GetRole() == "follower" && st.GetLeaderId() != "" && st.GetLeaderId() != c.Nodes[old].Peer
		})
		c.WaitCaughtUp(ctx)
		t.Logf("round %d: leader %d cut off; stepped down after %v; node %d leads; rejoined as follower %v after the cut",
			round, old, stepped.Round(time.Millisecond), next, time.Since(cut).Round(time.Millisecond))
	}
	stopLoad()
	l.wg.Wait()
	t.Logf("%d grants, %d failed locks, %d lost sessions", l.res.grantCount(), l.res.lockErrs, l.res.sessLosts)
	l.res.check(t)
	l.checkDurable(ctx, t, c)
}

// waitRole polls node i's own status until ok holds and returns how long
// that took.
func waitRole(ctx context.Context, t *testing.T, c *proccluster.Cluster, i int, ok func(*tenurev1.StatusResponse) bool) time.Duration {
	t.Helper()
	begin := time.Now()
	for {
		st, err := c.Nodes[i].Status(ctx)
		if err == nil && ok(st) {
			return time.Since(begin)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %d: last status %v (err %v) after %v; expected: the awaited role", i, st, err, time.Since(begin).Round(time.Millisecond))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestStaleReadsFromACutOffFollowerFailTheLinearizabilityCheck proves the
// checker catches a bug: reads answered by a follower from its own state
// while it is cut off (client.Stale, which is documented to trail) are
// recorded as if they were linearizable reads, while writes go on in the
// majority. The history must fail the check; without those reads it must
// pass.
func TestStaleReadsFromACutOffFollowerFailTheLinearizabilityCheck(t *testing.T) {
	skipShort(t)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leader := c.WaitLeader(ctx)
	follower := (leader + 1) % len(c.Nodes)
	cl := newClient(t, c, leader)
	stale, err := client.New(ctx, []string{c.Nodes[follower].Direct}, client.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()

	const key = "broken"
	hist := linearizability.NewHistory()
	honest := linearizability.NewHistory()
	put := func(value string) {
		in := linearizability.KVInput{Op: linearizability.Put, Key: key, Value: value}
		done, done2 := hist.Call(0, in), honest.Call(0, in)
		if _, err := cl.KV().Put(ctx, key, value); err != nil {
			t.Fatalf("put %s: %v", value, err)
		}
		done(linearizability.KVOutput{})
		done2(linearizability.KVOutput{})
	}
	put("0")
	c.WaitCaughtUp(ctx)
	c.Isolate(follower)
	for i := 1; i <= 5; i++ {
		put(fmt.Sprint(i))
		done := hist.Call(1, linearizability.KVInput{Op: linearizability.Get, Key: key})
		kv, err := stale.KV().Get(ctx, key, client.Stale())
		if err != nil {
			t.Fatalf("stale get from cut-off follower %d: %v", follower, err)
		}
		done(linearizability.KVOutput{Found: true, Value: kv.Value})
	}
	model := linearizability.KVModel.ToModel()
	if got := linearizability.Check(model, hist.Operations(), 10*time.Second, ""); got != porcupine.Illegal {
		t.Errorf("history with stale reads from a cut-off follower: got = %s, expected: %s", got, porcupine.Illegal)
	}
	if got := linearizability.Check(model, honest.Operations(), 10*time.Second, ""); got != porcupine.Ok {
		t.Errorf("the same history without those reads: got = %s, expected: %s", got, porcupine.Ok)
	}
	c.Heal()
}

func rawClients(t *testing.T, url string) raw {
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return raw{tenurev1connect.NewSessionServiceClient(hc, url), tenurev1connect.NewLeaseServiceClient(hc, url), nil}
}
