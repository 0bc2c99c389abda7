package raftnode

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// TestVotersJoinOverTCP is a cluster grown with AddVoter on the TCP
// transport, as tenure serve runs one; partitions and failover in detail
// are tested on testCluster.
func TestVotersJoinOverTCP(t *testing.T) {
	t.Parallel()
	nodes := make([]*Node, 3)
	for i := range nodes {
		cfg := testConfig(t.TempDir(), "wal")
		cfg.NodeID = fmt.Sprintf("n%d", i+1)
		cfg.Bootstrap = i == 0
		// Not the harness's 50 ms: a two-voter cluster loaded by the
		// whole suite lost its leader to check-quorum between the two
		// joins ("leadership lost while the entry was in flight"), and
		// this test is about joining over TCP, not timing.
		cfg.ElectionTimeout = 300 * time.Millisecond
		nodes[i] = openFake(t, cfg, nil)
	}
	leader := nodes[0]
	waitLeader(t, leader)
	for _, f := range nodes[1:] {
		if err := leader.AddVoter(ctxT(t), f.ID(), f.Addr()); err != nil {
			t.Fatalf("add voter: %v", err)
		}
	}
	r := put(t, leader, "a", "1")

	// A follower names the leader, so the API can forward the write,
	// once the leader's first heartbeat has reached it (on a busy
	// machine, some time after AddVoter returns).
	follower := nodes[1]
	var err error
	var nle *NotLeaderError
	waitFor(t, "the new voter to hear from the leader", func() bool {
		_, err = follower.Propose(ctxT(t), statemachine.Put{Key: "b"})
		return !errors.As(err, &nle) || nle.LeaderID != ""
	})
	if !errors.As(err, &nle) || nle.LeaderID != "n1" || nle.Leader != leader.Addr() {
		t.Errorf("propose on a follower: err = %v, expected: a *NotLeaderError naming n1 at %s", err, leader.Addr())
	}
	if err := follower.Read(ctxT(t), func(*statemachine.Machine) error { return nil }); !errors.Is(err, ErrNotLeader) {
		t.Errorf("read on a follower: err = %v, expected: ErrNotLeader", err)
	}
	waitFor(t, "followers to apply the write", func() bool {
		return nodes[1].AppliedIndex() >= leader.AppliedIndex() && nodes[2].AppliedIndex() >= leader.AppliedIndex()
	})

	// A leader that closes its TCP transport is replaced, and the next
	// one serves its acknowledged write.
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	var next *Node
	waitFor(t, "a new leader", func() bool {
		for _, n := range nodes[1:] {
			if n.IsLeader() {
				next = n
				return true
			}
		}
		return false
	})
	if got, rev := readKV(t, next); got["a"] != "1" || rev != r.Revision {
		t.Errorf("new leader reads %v at revision %d, expected: a=1 at %d", got, rev, r.Revision)
	}
}
