package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// TestEveryNodeSeesTheSameThreeVoters is the harness's own check: three
// servers, one leader, and every node's configuration listing all three.
func TestEveryNodeSeesTheSameThreeVoters(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	if len(followers) != 2 {
		t.Fatalf("followers = %v, expected: the two nodes but %s", followers, lead)
	}
	for _, n := range c.Nodes() {
		m := members(t, n)
		var voters int
		for _, mem := range m.GetMembers() {
			if mem.GetVoter() {
				voters++
			}
			if mem.GetSelf() != (mem.GetId() == n.ID()) {
				t.Errorf("%s marks %s as self = %v", n, mem.GetId(), mem.GetSelf())
			}
		}
		if voters != 3 {
			t.Errorf("%s lists %d voters, expected: 3 (%v)", n, voters, m.GetMembers())
		}
	}
	// A follower forwards what only the leader serves and hands back the
	// leader's answer, naming the leader for clients that would rather
	// go there themselves — once it has applied the entry in which the
	// leader advertised its address, which may trail the configuration.
	for _, f := range followers {
		waitFor(t, waitCtx(t), f.ID()+" to know the leader's API address", func() bool {
			st, err := f.API().Cluster.Status(waitCtx(t), connect.NewRequest(&tenurev1.StatusRequest{}))
			return err == nil && st.Msg.GetLeaderApiAddress() == lead.Addr()
		})
	}
	for i, f := range followers {
		put, err := f.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: f.ID()}))
		if err != nil {
			t.Fatalf("put on follower %s: %v", f, err)
		}
		if got := put.Header().Get(server.LeaderHeader); got != lead.Addr() {
			t.Errorf("put on follower %s: %s = %q, expected: the leader's API address %s", f, server.LeaderHeader, got, lead.Addr())
		}
		got, err := lead.API().KV.Get(waitCtx(t), connect.NewRequest(&tenurev1.GetRequest{Key: "k"}))
		if err != nil || got.Msg.GetKv().GetValue() != f.ID() || got.Msg.GetKv().GetVersion() != int64(i+1) {
			t.Errorf("get on the leader after a put through %s: got = %v, %v, expected: value %s at version %d", f, got, err, f.ID(), i+1)
		}
		// A call already forwarded once is answered where it lands.
		req := connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "x"})
		req.Header().Set(server.ForwardedHeader, "test")
		_, err = f.API().KV.Put(waitCtx(t), req)
		if !isNotLeader(err) || !strings.Contains(err.Error(), lead.Addr()) {
			t.Errorf("forwarded put on follower %s: got = %v, expected: not-leader naming %s", f, err, lead.Addr())
		}
	}
}

// TestARestartedNodeRejoinsAndCatchesUp: Stop and Restart keep a node's
// data and addresses, and it follows the writes made while it was down.
func TestARestartedNodeRejoinsAndCatchesUp(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	down := followers[0]
	if err := c.Stop(down); err != nil {
		t.Fatal(err)
	}
	if down.Running() || down.Server() != nil {
		t.Fatalf("%s still running after Stop", down)
	}
	if _, err := down.Metrics(); err == nil {
		t.Errorf("metrics of a stopped node: got = a registry, expected: an error")
	}
	// Two of three still make a quorum.
	if _, err := lead.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "while-down", Value: "1"})); err != nil {
		t.Fatalf("put with one node down: %v", err)
	}
	if err := c.Restart(down); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(down); err == nil {
		t.Error("restart of a running node: got = no error, expected: an error")
	}
	caughtUp(t, leader(t, c), down)
}

// TestAHealedMinorityRejoins: a node cut off long enough to campaign on
// its own rejoins once healed, and the cluster keeps one leader that
// takes writes.
func TestAHealedMinorityRejoins(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	cut := followers[0]
	c.Disconnect(cut)
	if _, err := lead.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "while-cut", Value: "1"})); err != nil {
		t.Fatalf("put with one node cut off: %v", err)
	}
	c.Heal()
	lead = leader(t, c)
	if _, err := lead.API().KV.Put(waitCtx(t), connect.NewRequest(&tenurev1.PutRequest{Key: "healed", Value: "1"})); err != nil {
		t.Fatalf("put after healing: %v", err)
	}
	caughtUp(t, lead, cut)
}

// TestEveryMemberAdvertisesItsAPIAddress: followers register their API
// address through the leader, so any node lists every member's, and asks
// each for its own status.
func TestEveryMemberAdvertisesItsAPIAddress(t *testing.T) {
	c := cluster.New(t, 3)
	for _, n := range c.Nodes() {
		waitFor(t, waitCtx(t), n.ID()+" to list every member's status", func() bool {
			for _, m := range members(t, n).GetMembers() {
				if m.GetApiAddress() != c.Node(int(m.GetId()[1]-'0')).Addr() || m.GetStatus().GetId() != m.GetId() {
					return false
				}
			}
			return true
		})
	}
}

// TestANodeDownForLongCatchesUpFromASnapshot: while a follower is down,
// the leader snapshots and drops the log behind it, so the follower can
// only catch up by being sent the snapshot; it does, with every write.
func TestANodeDownForLongCatchesUpFromASnapshot(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithRaft(func(rc *raftnode.Config) {
		rc.SnapshotThreshold, rc.CatchUpEntries = 50, 5
	}))
	lead := leader(t, c)
	var down *cluster.Node
	for _, n := range c.Nodes() {
		if n != lead {
			down = n
		}
	}
	caughtUp(t, lead, down)
	before := newestSnapshot(t, down)
	if n := counter(t, down, "tenure_raft_snapshot_restores_total", nil); n != 0 {
		t.Fatalf("snapshot restores on %s before: got = %v, expected: 0", down, n)
	}
	if err := c.Stop(down); err != nil {
		t.Fatal(err)
	}
	// Enough to fill several of the log's 1MiB segments: raft-wal serves
	// entries from its open segment even after they are truncated, so
	// only sealed segments behind the snapshot are really gone.
	const writes = 200
	value := strings.Repeat("v", 12<<10)
	kv := dial(t, c.Nodes()...).KV()
	for i := range writes {
		// With a node down, a loaded machine may elect another leader
		// under a put; writing the same value again is harmless.
		var err error
		for range 5 {
			if _, err = kv.Put(waitCtx(t), fmt.Sprintf("k%03d", i), value); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// The leader has snapshotted past everything the follower has, and
	// kept only a few entries behind that.
	waitFor(t, waitCtx(t), "the leader to snapshot past the stopped follower", func() bool {
		return newestSnapshot(t, leader(t, c)) > before+writes/2
	})
	if err := c.Restart(down); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, leader(t, c), down)
	// Its own newest snapshot is older than what it now holds: the state
	// came in a snapshot from the leader.
	if n := counter(t, down, "tenure_raft_snapshot_restores_total", nil); n < 1 {
		t.Errorf("snapshot restores on %s after catching up: got = %v, expected: the leader's", down, n)
	}
	got, err := down.API().KV.Range(waitCtx(t), connect.NewRequest(&tenurev1.RangeRequest{Prefix: "k", Stale: true}))
	if err != nil || len(got.Msg.GetKvs()) != writes {
		t.Errorf("keys on %s after catching up: got = %d, %v, expected: all %d", down, len(got.Msg.GetKvs()), err, writes)
	}
}

// newestSnapshot is the raft index of the newest snapshot in n's data
// dir (the file snapshot store names them term-index-time), 0 if none.
func newestSnapshot(t *testing.T, n *cluster.Node) uint64 {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.DataDir(), "raft", "snapshots"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var newest uint64
	for _, e := range entries {
		parts := strings.Split(e.Name(), "-")
		if len(parts) != 3 || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		if idx, err := strconv.ParseUint(parts[1], 10, 64); err == nil {
			newest = max(newest, idx)
		}
	}
	return newest
}
