package raftnode

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAMemberBackWithAnEmptyLogFailsInsteadOfPanicking: a voter closed
// and opened again under its ID on an empty data dir, waiting to be
// added, is still a voter to the leader, which knows how far its log
// went and heartbeats it with that commit index. etcd's raft panicked
// on it ("tocommit(…) is out of range [lastIndex(0)]"); the node now
// refuses the traffic and reports ErrLogLost through Failed and Err,
// while the others go on.
func TestAMemberBackWithAnEmptyLogFailsInsteadOfPanicking(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3)
	lead := c.leader()
	for i := range 10 {
		put(t, lead, fmt.Sprint("k", i), "v")
	}
	old := c.others(lead)[0]
	waitFor(t, old.ID()+" to catch up", func() bool { return old.AppliedIndex() >= lead.AppliedIndex() })
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(t.TempDir(), "")
	cfg.PeerAddr = ""
	cfg.NodeID = old.ID()
	cfg.Network = c.net
	cfg.WALSegmentSize = 1 << 20
	cfg.Bootstrap = false
	fresh := openFake(t, cfg, nil)
	select {
	case <-fresh.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("got = the node on an empty log still running 10s on, expected: Failed closed")
	}
	var lost *LogLostError
	if err := fresh.Err(); !errors.Is(err, ErrLogLost) || !errors.As(err, &lost) || lost.LastIndex != 0 || lost.Commit == 0 {
		t.Fatalf("got = %v, expected: ErrLogLost, a commit index past 0", err)
	}
	put(t, c.leader(c.others(old)...), "after", "v")
}
