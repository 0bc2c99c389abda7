package cluster_test

import (
	"context"
	"testing"
	"time"
)

// TestLeaderKillUnderLoadKeepsLocksExclusiveAndAcknowledgedWritesDurable
// kills the leader with SIGKILL and restarts it, again and again, while
// 64 lockers on 8 leases (through all three nodes) write to a fenced
// resource and recorders run KV and lease calls. Afterwards:
//
//   - no two critical sections on a lease overlapped, and their tokens
//     strictly increased (safety rules 1 and 5);
//   - the fence accepted no write whose token was older than a grant
//     already acknowledged when the write began (rule 3);
//   - every acknowledged write is on every node (rule 7);
//   - both recorded histories are linearizable.
func TestLeaderKillUnderLoadKeepsLocksExclusiveAndAcknowledgedWritesDurable(t *testing.T) {
	skipShort(t)
	rounds := faultRounds(t, 5)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(rounds)*20*time.Second)
	defer cancel()

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	l := startLockers(loadCtx, t, c, 64, 8, 10*time.Second)
	r := startRecorders(loadCtx, t, c, 8, 4, 4)
	l.waitProgress(ctx, t, 64)

	began := time.Now()
	for round := 1; round <= rounds; round++ {
		leader := c.WaitLeader(ctx)
		c.Nodes[leader].Kill()
		killed := time.Now()
		next := c.WaitLeader(ctx, leader)
		elected := time.Since(killed)
		l.waitProgress(ctx, t, 16)
		c.Nodes[leader].Restart(ctx)
		l.waitProgress(ctx, t, 16)
		t.Logf("round %d: killed leader %d; node %d led after %v; %d grants so far", round, leader, next, elected.Round(time.Millisecond), l.res.grantCount())
	}
	stopLoad()
	l.wg.Wait()
	r.wg.Wait()
	t.Logf("%d rounds in %v: %d grants, %d acknowledged puts, %d failed locks, %d lost sessions",
		rounds, time.Since(began).Round(time.Millisecond), l.res.grantCount(), l.puts.Load(), l.res.lockErrs, l.res.sessLosts)

	for msg, n := range l.res.samples {
		t.Logf("%5d × %s", n, msg)
	}
	l.res.check(t)
	l.checkDurable(ctx, t, c)
	r.check(t)
}
