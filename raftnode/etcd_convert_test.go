package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestASingleNodesHashicorpDataDirConvertsItselfOnce is issue 24's
// upgrade path: a data dir the hashicorp engine wrote, with a snapshot
// and a log tail after it, opens on the etcd engine with every write in
// it, says so once in the log, and is the etcd engine's from then on.
func TestASingleNodesHashicorpDataDirConvertsItselfOnce(t *testing.T) {
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(dir, store)
			cfg.Engine = EngineHashicorp
			n := openFake(t, cfg, nil)
			waitLeader(t, n)
			for i := range 5 {
				put(t, n, fmt.Sprintf("k%d", i), "snapshotted")
			}
			snapshotNow(t, n)
			put(t, n, "k0", "tail")
			put(t, n, "k9", "tail")
			want, wantRev := readKV(t, n)
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}

			logs := &recordHandler{}
			cfg.Engine = EngineEtcd
			cfg.Logger = slog.New(logs)
			n = openFake(t, cfg, nil)
			waitLeader(t, n)
			got, rev := readKV(t, n)
			if rev != wantRev || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after the conversion: kv = %v at revision %d, expected: %v at %d", got, rev, want, wantRev)
			}
			if r := put(t, n, "after", "v"); r.Revision != wantRev+1 {
				t.Errorf("first write on the etcd engine: revision %d, expected: %d", r.Revision, wantRev+1)
			}
			if c := logs.count("converted the data dir"); c != 1 {
				t.Errorf("conversion log lines = %d, expected: 1", c)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}

			// Once only: the next start finds the etcd engine's dir.
			logs = &recordHandler{}
			cfg.Logger = slog.New(logs)
			n = openFake(t, cfg, nil)
			waitLeader(t, n)
			if got, rev := readKV(t, n); rev != wantRev+1 || got["after"] != "v" || got["k0"] != "tail" {
				t.Errorf("reopened: kv = %v at revision %d, expected the converted state and the later write at %d", got, rev, wantRev+1)
			}
			if c := logs.count("converted the data dir"); c != 0 {
				t.Errorf("conversion log lines on the second start = %d, expected: 0", c)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}

			// And the old engine no longer takes it.
			cfg.Engine = EngineHashicorp
			if _, err := open(cfg, newFake(nil)); !errors.Is(err, ErrOtherEngine) {
				t.Errorf("the hashicorp engine on the converted dir: got = %v, expected: ErrOtherEngine", err)
			}
		})
	}
}

// TestAClusterMembersHashicorpDataDirIsNotConverted: a member of a
// larger cluster cannot change engines alone; Open refuses, naming the
// way across, and leaves the data dir as it was.
func TestAClusterMembersHashicorpDataDirIsNotConverted(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	cfg.Engine = EngineHashicorp
	cfg.NodeID = "n1"
	cfg.InitialVoters = []Peer{{ID: "n1"}, {ID: "n2", Address: "127.0.0.1:1"}, {ID: "n3", Address: "127.0.0.1:2"}}
	n := openFake(t, cfg, nil)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	cfg.Engine = EngineEtcd
	_, err := open(cfg, newFake(nil))
	if !errors.Is(err, ErrOtherEngine) || !strings.Contains(err.Error(), "tenure snapshot save") || !strings.Contains(err.Error(), "tenure snapshot restore") {
		t.Fatalf("got = %v, expected: ErrOtherEngine naming snapshot save and restore", err)
	}
	cfg.Engine = EngineHashicorp
	n = openFake(t, cfg, nil)
	if members, err := n.Members(); err != nil || len(members) != 3 {
		t.Errorf("the hashicorp engine after the refusal: members = %v (%v), expected: the 3 it had", members, err)
	}
}

func (h *recordHandler) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := 0
	for _, r := range h.records {
		if strings.Contains(r.Message, substr) {
			c++
		}
	}
	return c
}

// TestANodeJoiningACompactedLeaderCatchesUp: the leader has snapshotted
// and dropped the log a newcomer would need, and its newest snapshot
// predates the newcomer; the newcomer still catches up, from a snapshot
// that names it (etcd raft refuses one that does not). A converted
// node's first peer is in the same place: its one snapshot names it alone.
func TestANodeJoiningACompactedLeaderCatchesUp(t *testing.T) {
	cfg := testConfig(t.TempDir(), "wal")
	cfg.NodeID = "n1"
	cfg.SnapshotThreshold, cfg.CatchUpEntries = 8, 2
	leader := openFake(t, cfg, nil)
	waitLeader(t, leader)
	for i := range 40 {
		put(t, leader, fmt.Sprintf("k%02d", i), "v")
	}
	snapshotNow(t, leader)

	cfg = testConfig(t.TempDir(), "wal")
	cfg.NodeID, cfg.Bootstrap = "n2", false
	joiner := openFake(t, cfg, nil)
	if err := leader.AddNonvoter(ctxT(t), joiner.ID(), joiner.Addr()); err != nil {
		t.Fatalf("add non-voter: %v", err)
	}
	want := put(t, leader, "last", "v").Revision
	waitFor(t, "the newcomer to catch up", func() bool {
		_, rev := localKV(t, joiner)
		return rev == want
	})
	if got, _ := localKV(t, joiner); got["k00"] != "v" || got["last"] != "v" {
		t.Errorf("newcomer's keys: got = %v, expected k00..k39 and last", got)
	}
}
