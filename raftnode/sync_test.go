package raftnode

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestSyncBringsAFollowerUpToTheLeadersAcknowledgedWrites: a write the
// leader acknowledged is in a follower's own state once Sync returns
// there, every time (a follower applies an entry only after the leader
// tells it the entry committed, which can come after the leader's
// answer); and a node that knows no leader says so at once.
func TestSyncBringsAFollowerUpToTheLeadersAcknowledgedWrites(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3)
	lead := c.leader()
	f := c.others(lead)[0]
	for i := range 50 {
		v := fmt.Sprint(i)
		put(t, lead, "k", v)
		if err := f.Sync(ctxT(t)); err != nil {
			t.Fatalf("round %d: Sync on a follower: %v", i, err)
		}
		if got, _ := localKV(t, f); got["k"] != v {
			t.Fatalf("round %d: the follower's own state after Sync: got = k=%q, expected: k=%q", i, got["k"], v)
		}
	}

	c.isolate(f)
	waitFor(t, f.ID()+" to know no leader", func() bool { _, id := f.Leader(); return id == "" })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Sync(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Sync on a node that knows no leader: got = %v, expected: ErrNotLeader", err)
	}
}
