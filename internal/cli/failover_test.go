package cli

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/cluster"
)

// TestLockAndElectHoldersKeepRunningAcrossALeaderCrash: the commands that
// run a child under a grant ride out the leader's crash: their sessions
// move to the new leader within their validity, so the child is never
// stopped and the command exits with the child's own status. A waiter
// queued behind the lock gets it after the failover, in turn.
func TestLockAndElectHoldersKeepRunningAcrossALeaderCrash(t *testing.T) {
	c := cluster.New(t, 3)
	var endpoints []string
	for _, n := range c.Nodes() {
		endpoints = append(endpoints, n.Addr())
	}
	eps := strings.Join(endpoints, ",")
	type run struct {
		name           string
		stdout, stderr string
		code           int
	}
	results := make(chan run, 3)
	var wg sync.WaitGroup
	start := func(name string, args ...string) {
		wg.Go(func() {
			stdout, stderr, code := runMain(append([]string{"--endpoints", eps}, args...)...)
			results <- run{name, stdout, stderr, code}
		})
	}
	// Long enough to span the crash, the election and a TTL after it.
	start("lock", "lock", "--ttl", "3s", "job", "--", "sh", "-c", "sleep 5; echo held")
	start("elect", "elect", "--ttl", "3s", "scheduler", "--", "sh", "-c", "sleep 5; echo led")
	lead := leader(t, c)
	waitFor(t, 10*time.Second, "both grants", func() bool {
		return leaseHeld(t, lead, "job") && leaseHeld(t, lead, "scheduler")
	})
	start("waiter", "lock", "--ttl", "3s", "--wait", "30s", "job", "--", "echo", "next")

	time.Sleep(time.Second)
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(results)
	want := map[string]string{"lock": "held\n", "elect": "led\n", "waiter": "next\n"}
	for r := range results {
		if r.code != 0 || r.stdout != want[r.name] {
			t.Errorf("%s across the crash of the leader: got = exit %d, stdout %q, stderr %q, expected: exit 0 and %q", r.name, r.code, r.stdout, r.stderr, want[r.name])
		}
	}
}

func leader(t *testing.T, c *cluster.Cluster) *cluster.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// leaseHeld reports whether someone holds default/name, asked of n.
func leaseHeld(t *testing.T, n *cluster.Node, name string) bool {
	t.Helper()
	resp, err := n.API().Leases.Get(context.Background(), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: name}))
	return err == nil && len(resp.Msg.GetLease().GetHolders()) > 0
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStaleReadsAnswerFromTheNodeCalled: --stale reads the called node's
// own state, so a follower cut off from the others still answers, with
// what it last had; without it the answer is the leader's, or none.
func TestStaleReadsAnswerFromTheNodeCalled(t *testing.T) {
	c := cluster.New(t, 3)
	lead := leader(t, c)
	if _, _, code := runMain("--endpoints", lead.Addr(), "kv", "set", "k", "old"); code != 0 {
		t.Fatalf("kv set: exit %d", code)
	}
	var cut *cluster.Node
	for _, n := range c.Nodes() {
		if n != lead {
			cut = n
		}
	}
	waitFor(t, 10*time.Second, cut.ID()+" to have k", func() bool {
		stdout, _, code := runMain("--endpoints", cut.Addr(), "kv", "get", "--stale", "k")
		return code == 0 && stdout == "old\n"
	})
	c.Disconnect(cut)
	if _, _, code := runMain("--endpoints", leader(t, c).Addr(), "kv", "set", "k", "new"); code != 0 {
		t.Fatalf("kv set on the majority: exit %d", code)
	}
	for _, args := range [][]string{{"kv", "get", "--stale", "k"}, {"kv", "range", "--stale", "k"}, {"get", "leases", "--stale"}} {
		stdout, stderr, code := runMain(append([]string{"--endpoints", cut.Addr()}, args...)...)
		if code != 0 || (args[0] == "kv" && !strings.Contains(stdout, "old\n")) {
			t.Errorf("%v on the cut-off %s: got = exit %d, stdout %q, stderr %q, expected: exit 0 and its own old value", args, cut, code, stdout, stderr)
		}
	}
	stdout, _, code := runMain("--endpoints", cut.Addr(), "--timeout", "2s", "kv", "get", "k")
	if code == 2 {
		t.Fatalf("linearizable kv get: usage error")
	}
	if code == 0 && stdout != "new\n" {
		t.Errorf("linearizable kv get on the cut-off %s: got = %q, expected: new, or no answer", cut, stdout)
	}
}
