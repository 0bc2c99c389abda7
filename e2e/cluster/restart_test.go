package cluster_test

import (
	"context"
	"testing"
	"time"
)

// TestRollingRestartCostsClientsNoErrorsAndNoSessions restarts every
// node in turn with SIGTERM (which drains and hands leadership over) and
// the same command, under load from lockers whose clients know all three
// endpoints: they see no failed call and lose no session.
func TestRollingRestartCostsClientsNoErrorsAndNoSessions(t *testing.T) {
	skipShort(t)
	rounds := faultRounds(t, 1)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+time.Duration(rounds)*45*time.Second)
	defer cancel()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	l := startLockers(loadCtx, t, c, 16, 4, 10*time.Second)
	l.waitProgress(ctx, t, 16)

	for round := 1; round <= rounds; round++ {
		for _, n := range c.Nodes {
			wasLeader := c.Leader(ctx) == n.Index
			began := time.Now()
			n.Stop(15 * time.Second)
			stopped := time.Since(began)
			n.Restart(ctx)
			c.WaitCaughtUp(ctx)
			l.waitProgress(ctx, t, 16)
			t.Logf("round %d: node %d (leader: %v) stopped in %v, back %v after SIGTERM", round, n.Index, wasLeader,
				stopped.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		}
	}
	stopLoad()
	l.wg.Wait()
	for msg, n := range l.res.samples {
		t.Logf("%5d × %s", n, msg)
	}
	if l.res.lockErrs != 0 || l.res.opErrs != 0 {
		t.Errorf("failed calls: got = %d locks and %d puts or unlocks, expected: 0", l.res.lockErrs, l.res.opErrs)
	}
	if l.res.sessLosts != 0 {
		t.Errorf("lost sessions: got = %d, expected: 0", l.res.sessLosts)
	}
	t.Logf("%d grants, %d acknowledged puts", l.res.grantCount(), l.puts.Load())
	l.res.check(t)
	l.checkDurable(ctx, t, c)
}
