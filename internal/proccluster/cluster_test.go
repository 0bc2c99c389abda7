package proccluster

import (
	"context"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// TestIsolatedFollowerLosesTheLeaderAndCatchesUpWhenHealed checks the
// harness itself: an isolated node hears from nobody, through its own
// proxies or the others', and a healed one is back in the cluster.
func TestIsolatedFollowerLosesTheLeaderAndCatchesUpWhenHealed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three tenure processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := Start(t, 3)
	leader := c.WaitLeader(ctx)
	follower := (leader + 1) % 3
	c.Isolate(follower)
	// Raft's followers start an election after a heartbeat timeout (1s
	// by default) without contact; a cut-off one never wins it.
	for {
		st, err := c.Nodes[follower].Status(ctx)
		if err == nil && st.GetRole() == "candidate" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("isolated follower %d: last status %v, err %v; expected: role candidate", follower, st, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got := c.Leader(ctx, follower); got < 0 {
		t.Errorf("leader of the majority: got = none, expected: a node other than %d", follower)
	}
	c.Heal()
	c.WaitLeader(ctx)
	c.WaitCaughtUp(ctx)
	for _, n := range c.Nodes {
		n.WaitReady(ctx)
	}
}
