package raftnode

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// damagedCluster is a three-node cluster whose configs are kept, so that
// a node can be closed, its log damaged, and opened again.
type damagedCluster struct {
	*testCluster
	cfgs []Config
}

func newDamagedCluster(t *testing.T) *damagedCluster {
	dc := &damagedCluster{}
	dc.testCluster = newTestCluster(t, 3, func(c *Config) {
		c.WALSegmentSize = 8 << 20 // one segment: the damage is in the tail
		c.MinFreeBytes = -1
		dc.cfgs = append(dc.cfgs, *c)
	})
	dc.heal()
	return dc
}

// closeAndDamage closes node i and flips a byte of big value v in its
// log's newest segment: damage to a synced, acknowledged batch.
func (dc *damagedCluster) closeAndDamage(t *testing.T, i, v int) {
	t.Helper()
	if err := dc.nodes[i].Close(); err != nil {
		t.Fatal(err)
	}
	segs := segments(t, dc.cfgs[i].DataDir)
	flipByteOf(t, segs[len(segs)-1], v)
}

// reopen opens node i again on its data dir.
// writeThroughLeader puts values k0..k(n-1) through the leader and
// returns a follower that has applied them all.
func (dc *damagedCluster) writeThroughLeader(t *testing.T, n int) int {
	t.Helper()
	leader := dc.leader()
	for i := range n {
		put(t, leader, fmt.Sprintf("k%d", i), bigValue(i))
	}
	f := 0
	for dc.nodes[f] == leader {
		f++
	}
	last := fmt.Sprintf("k%d", n-1)
	waitFor(t, "the follower to apply every write", func() bool {
		got, _ := localKV(t, dc.nodes[f])
		return got[last] == bigValue(n-1)
	})
	return f
}

// followerThatLostK4 writes k0..k4 through the leader, damages a
// follower's batch of k4, and reopens it, owing k4: the cluster, the
// follower's index, and the follower.
func followerThatLostK4(t *testing.T) (*damagedCluster, int, *Node) {
	t.Helper()
	dc := newDamagedCluster(t)
	f := dc.writeThroughLeader(t, 5)
	dc.closeAndDamage(t, f, 4)
	return dc, f, dc.reopen(t, f)
}

func (dc *damagedCluster) reopen(t *testing.T, i int) *Node {
	t.Helper()
	n := openFake(t, dc.cfgs[i], nil)
	dc.nodes[i] = n
	return n
}

// A member whose log is damaged starts without --repair-log: it cuts the
// damage off, owes the entries, gets them back from the leader (which
// would otherwise resend from past the hole forever), and then votes
// again. Until then a vote request does not move it.
func TestADamagedMemberCatchesUpFromTheLeader(t *testing.T) {
	t.Parallel()
	dc, f, n := followerThatLostK4(t)
	owed := n.engine.catchUp.Load()
	if owed == 0 {
		t.Fatalf("got = no catch-up index after a repair that cut acknowledged entries, expected: the last one lost")
	}
	// A vote request from a far higher term, while it owes entries, by a
	// candidate whose log ends short of where the member's did: dropped,
	// so the member never reaches that term. (The hand-over moves its
	// term on by one or two meanwhile.)
	far := n.engine.term.Load() + 1000
	point, pointTerm := n.engine.catchUp.Load(), n.engine.catchUpTerm.Load()
	if pointTerm == 0 {
		t.Fatalf("got = catch-up term 0, expected: the hard state's term")
	}
	other := raftID(dc.ids[(f+1)%3])
	_ = n.engine.Process(ctxT(t), raftpb.Message{Type: raftpb.MsgVote, From: other, To: n.engine.rid, Term: far, Index: point - 1, LogTerm: pointTerm})
	time.Sleep(50 * time.Millisecond)
	if got := n.engine.term.Load(); got >= far {
		t.Fatalf("got = term %d after a vote request for term %d from a shorter log while owing entries, expected: the request dropped", got, far)
	}
	waitFor(t, "the member to catch up and vote again", func() bool {
		return n.engine.catchUp.Load() == 0
	})
	// setCatchUp publishes the point in memory before it writes it (the
	// term, then the index), so the meta store may lag the load above by
	// a moment.
	waitFor(t, "the catch-up point 0 on disk after catching up", func() bool {
		term, errT := n.engine.disk.meta.GetUint64(catchUpTermKey)
		index, errI := n.engine.disk.meta.GetUint64(catchUpKey)
		return errT == nil && errI == nil && term == 0 && index == 0
	})
	waitFor(t, "the lost write back on the member", func() bool {
		got, _ := localKV(t, n)
		return got["k4"] == bigValue(4)
	})
	// And it is a full member again: it takes writes with the others.
	put(t, dc.leader(), "after", "v")
	waitFor(t, "a new write on the member", func() bool {
		got, _ := localKV(t, n)
		return got["after"] == "v"
	})
}

// The safety rule itself: a write acknowledged by the leader and one
// follower, the follower's copy then damaged and cut, the leader gone.
// The third node never had the write. If the damaged follower voted, the
// two would elect the third, whose log is as long as its own, and the
// acknowledged write would be lost. It does not vote: there is no leader
// until the old one is back, and then the write is there.
func TestADamagedMemberDoesNotElectALeaderWithoutItsLostEntries(t *testing.T) {
	t.Parallel()
	dc := newDamagedCluster(t)
	leader := dc.leader()
	put(t, leader, "before", "v")
	var l, f, o int // leader, follower, other
	for i, n := range dc.nodes {
		if n == leader {
			l = i
		}
	}
	f, o = (l+1)%3, (l+2)%3
	for _, i := range []int{f, o} {
		waitFor(t, "every node to apply the first write", func() bool {
			got, _ := localKV(t, dc.nodes[i])
			return got["before"] == "v"
		})
	}
	dc.isolate(dc.nodes[o])
	put(t, leader, "acked", bigValue(7)) // the leader and f: a quorum
	waitFor(t, "the follower to apply the write", func() bool {
		got, _ := localKV(t, dc.nodes[f])
		return got["acked"] == bigValue(7)
	})
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	dc.closeAndDamage(t, f, 7)
	dc.heal()
	n := dc.reopen(t, f)
	if n.engine.catchUp.Load() == 0 {
		t.Fatalf("got = no catch-up index, expected: the damaged member owes the write")
	}
	// Twenty election timeouts: time enough for o to be elected, if n voted.
	deadline := time.Now().Add(20 * dc.cfgs[o].ElectionTimeout)
	for time.Now().Before(deadline) {
		if n.IsLeader() || dc.nodes[o].IsLeader() {
			t.Fatalf("got = a leader elected without the acknowledged write (node %s), expected: none until the old leader is back", map[bool]string{true: n.ID(), false: dc.nodes[o].ID()}[n.IsLeader()])
		}
		time.Sleep(10 * time.Millisecond)
	}
	back := dc.reopen(t, l)
	next := dc.leader(back, n, dc.nodes[o])
	got, _ := readKV(t, next)
	if got["acked"] != bigValue(7) {
		t.Fatalf("got = acked %.20q on the new leader %s, expected: the acknowledged write", got["acked"], next.ID())
	}
	waitFor(t, "the damaged member to catch up", func() bool { return n.engine.catchUp.Load() == 0 })
}

// A lone node has no one to catch up from: a damaged log is refused, as
// before, and --repair-log's cut leaves it nothing to owe.
func TestALoneNodeOwesNothingAfterARepair(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fillWAL(t, dir, 10)
	segs := segments(t, dir)
	flipByteOf(t, segs[len(segs)-1], 9)
	cfg := walTestConfig(t, dir)
	if _, err := open(cfg, newFake(nil)); !errors.Is(err, ErrCorruptLog) {
		t.Fatalf("got = %v, expected: ErrCorruptLog, the lone node refusing", err)
	}
	cfg.RepairLog = true
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	if got := n.engine.catchUp.Load(); got != 0 {
		t.Fatalf("got = catch-up index %d on a lone node, expected: 0", got)
	}
}

// While it owes entries, a member still votes for a candidate whose log
// reaches where its own did, by raft's up-to-date rule against that
// point: the cluster's most up-to-date member can be elected with its
// vote. (Refusing every vote stopped a cluster for good when two of
// three members were catching up at once: internal/sim, seed 53.)
func TestADamagedMemberVotesForACandidateThatHasWhatItLost(t *testing.T) {
	t.Parallel()
	dc := newDamagedCluster(t)
	f := dc.writeThroughLeader(t, 3)
	// The others stop: no leader will catch the member up meanwhile.
	for i, n := range dc.nodes {
		if i != f {
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	dc.closeAndDamage(t, f, 2)
	n := dc.reopen(t, f)
	point, pointTerm := n.engine.catchUp.Load(), n.engine.catchUpTerm.Load()
	if point == 0 || pointTerm == 0 {
		t.Fatalf("got = catch-up point (%d, %d), expected: set", pointTerm, point)
	}
	far := n.engine.term.Load() + 1000
	_ = n.engine.Process(ctxT(t), raftpb.Message{Type: raftpb.MsgVote, From: raftID(dc.ids[(f+1)%3]), To: n.engine.rid, Term: far, Index: point, LogTerm: pointTerm})
	waitFor(t, "the member to step the vote request", func() bool { return n.engine.term.Load() == far })
	if n.engine.catchUp.Load() != point {
		t.Fatalf("got = catch-up index %d after voting, expected: still %d (it has not caught up)", n.engine.catchUp.Load(), point)
	}
}

// TestAMemberOwingABoundPastTheLogEndsItsDebtInAnIdleCluster: a repair
// that cannot tell how far a damaged segment reached owes a bound, which
// may lie past anything the cluster has written. Once the member holds
// everything the leader has committed, nothing more comes to end the
// debt while the cluster is idle: the member asks for a hand-over, and
// the new leader's first entry, of a later term, ends it (catchup.go),
// with no write. It stayed owing, refusing every vote, before.
func TestAMemberOwingABoundPastTheLogEndsItsDebtInAnIdleCluster(t *testing.T) {
	t.Parallel()
	_, _, n := followerThatLostK4(t)
	waitFor(t, "the lost write back on the member", func() bool {
		got, _ := localKV(t, n)
		return got["k4"] == bigValue(4)
	})
	bound := CatchUp{Index: n.engine.lastIndex.Load() + 1000, Term: n.engine.term.Load()}
	n.engine.setCatchUp(bound)
	waitFor(t, "the member to end its debt with nothing written", func() bool {
		return n.engine.catchUp.Load() == 0
	})
	if got := n.engine.lastIndex.Load(); got >= bound.Index {
		t.Fatalf("got = a log at %d, expected: short of the bound %d (the debt ended by a later term, not by writes)", got, bound.Index)
	}
}
