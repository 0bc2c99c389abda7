package raftnode

import (
	"fmt"
	"testing"
)

// heldOf is what n lists of member id: whether it votes, and whether it
// is a held learner.
func heldOf(t *testing.T, n *Node, id string) (voter, held, found bool) {
	t.Helper()
	members, err := n.Members()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.ID == id {
			return m.Voter, m.Held, true
		}
	}
	return false, false, false
}

// A learner added held stays held on the leader across a snapshot and a
// restart from it, and on the learner itself, which got the
// configuration in a snapshot; adding it again changes nothing, and its
// promotion ends it. Progress says how far its log is.
func TestAHeldLearnerStaysHeldUntilPromoted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	cfg.NodeID = "n1"
	cfg.SnapshotThreshold, cfg.CatchUpEntries = 8, 2
	leader := openFake(t, cfg, nil)
	waitLeader(t, leader)
	for i := range 20 {
		put(t, leader, fmt.Sprintf("k%02d", i), "v")
	}
	snapshotNow(t, leader)

	jcfg := testConfig(t.TempDir(), "wal")
	jcfg.NodeID, jcfg.Bootstrap = "n2", false
	joiner := openFake(t, jcfg, nil)
	if err := leader.AddLearner(ctxT(t), "n2", joiner.Addr(), true); err != nil {
		t.Fatal(err)
	}
	last := put(t, leader, "last", "v")
	waitFor(t, "the learner to catch up", func() bool {
		_, rev := localKV(t, joiner)
		return rev == last.Revision
	})
	if voter, held, _ := heldOf(t, joiner, "n2"); voter || !held {
		t.Errorf("the learner's own view: got = voter %v, held %v, expected: a held learner", voter, held)
	}
	// The leader learns how far the learner got from its answer, which
	// may arrive a moment after the learner applied.
	waitFor(t, "the leader to hear the learner's progress", func() bool {
		match, _, err := leader.Progress("n2")
		return err == nil && match > 0
	})
	match, leaderMatch, err := leader.Progress("n2")
	if err != nil || match == 0 || match > leaderMatch {
		t.Errorf("progress: got = %d of %d, %v, expected: 0 < match <= the leader's", match, leaderMatch, err)
	}

	// The snapshot files keep it (as hashicorp's Staging).
	snapshotNow(t, leader)
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	leader = openFake(t, cfg, nil)
	waitLeader(t, leader)
	if voter, held, found := heldOf(t, leader, "n2"); !found || voter || !held {
		t.Fatalf("after a restart from a snapshot: got = found %v, voter %v, held %v, expected: a held learner", found, voter, held)
	}
	if err := leader.AddLearner(ctxT(t), "n2", joiner.Addr(), true); err != nil {
		t.Fatal(err)
	}
	if err := leader.AddVoter(ctxT(t), "n2", joiner.Addr()); err != nil {
		t.Fatal(err)
	}
	if voter, held, _ := heldOf(t, leader, "n2"); !voter || held {
		t.Errorf("after the promotion: got = voter %v, held %v, expected: a voter", voter, held)
	}
}
