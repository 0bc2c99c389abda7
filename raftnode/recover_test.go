package raftnode

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// seedDataDir runs node "old" on a fresh data dir, writes a=1..b=2,
// snapshots, writes a=3 after the snapshot (so that a restore needs both
// the snapshot and the log), and closes it. It returns the dir and the
// address "old" was recorded at.
func seedDataDir(t *testing.T, store string) (dir, addr string) {
	t.Helper()
	dir = t.TempDir()
	cfg := testConfig(dir, store)
	cfg.NodeID = "old"
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	put(t, n, "a", "1")
	put(t, n, "b", "2")
	snapshotNow(t, n)
	put(t, n, "a", "3")
	addr = string(n.Addr())
	if err := n.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return dir, addr
}

// TestOpenRefusesADataDirThatDoesNotListThisNode is the "backup restored
// onto a new --peer-listen never becomes ready" bug: the copy's
// configuration names the old node ID, raft never campaigns as an ID it
// cannot find, and Open used to succeed into an endless follower.
func TestOpenRefusesADataDirThatDoesNotListThisNode(t *testing.T) {
	t.Parallel()
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			dir, oldAddr := seedDataDir(t, store)
			cfg := testConfig(dir, store)
			cfg.NodeID = "new"
			n, err := open(cfg, newFake(nil))
			if err == nil {
				n.Close()
				t.Fatal("open as another node ID: got = no error, expected: a *MembershipError")
			}
			var me *MembershipError
			if !errors.As(err, &me) {
				t.Fatalf("open as another node ID: got = %v, expected: a *MembershipError", err)
			}
			want := []Member{{ID: "old", Address: oldAddr, Voter: true}}
			if me.DataDir != dir || me.NodeID != "new" || me.Addr == "" || fmt.Sprint(me.Servers) != fmt.Sprint(want) {
				t.Errorf("got = %+v, expected: DataDir %s, NodeID new, an address, Servers %v", *me, dir, want)
			}
			msg := err.Error()
			for _, s := range []string{dir, "old@" + oldAddr, "new@" + me.Addr, "--node-id old --peer-listen " + oldAddr, "--force-new-cluster", "live cluster"} {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q does not contain %q", msg, s)
				}
			}

			// The refusal changed nothing: the old node still opens.
			cfg = testConfig(dir, store)
			cfg.NodeID = "old"
			n = openFake(t, cfg, nil)
			waitLeader(t, n)
			if got, rev := readKV(t, n); rev != 3 || got["a"] != "3" || got["b"] != "2" {
				t.Errorf("old node after the refusal: kv = %v at revision %d, expected: map[a:3 b:2] at 3", got, rev)
			}
		})
	}
}

func TestForceNewClusterRestoresTheDataOntoThisNode(t *testing.T) {
	t.Parallel()
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			dir, _ := seedDataDir(t, store)
			cfg := testConfig(dir, store)
			cfg.NodeID = "new"
			cfg.ForceNewCluster = true
			n := openFake(t, cfg, nil)
			waitLeader(t, n)
			if got, rev := readKV(t, n); rev != 3 || got["a"] != "3" || got["b"] != "2" {
				t.Errorf("after force new cluster: kv = %v at revision %d, expected: map[a:3 b:2] at 3", got, rev)
			}
			addr := string(n.Addr())
			ms, err := n.Members()
			want := []Member{{ID: "new", Address: addr, Voter: true, Leader: true}}
			if err != nil || fmt.Sprint(ms) != fmt.Sprint(want) {
				t.Errorf("members: got = %v %v, expected: %v", ms, err, want)
			}
			if r := put(t, n, "c", "4"); r.Revision != 4 {
				t.Errorf("first write after the restore at revision %d, expected: 4", r.Revision)
			}
			if err := n.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}

			// Later starts need no flag, and a flag left in place on a
			// single node changes nothing.
			for _, force := range []bool{false, true} {
				cfg := testConfig(dir, store)
				cfg.PeerAddr = addr
				cfg.NodeID = "new"
				cfg.ForceNewCluster = force
				n := openFake(t, cfg, nil)
				waitLeader(t, n)
				if got, rev := readKV(t, n); rev != 4 || got["a"] != "3" || got["c"] != "4" {
					t.Errorf("restart with ForceNewCluster=%v: kv = %v at revision %d, expected: a=3 c=4 at 4", force, got, rev)
				}
				if err := n.Close(); err != nil {
					t.Fatalf("close: %v", err)
				}
			}
		})
	}
}

func TestForceNewClusterRefusesADataDirWithoutState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	cfg.ForceNewCluster = true
	n, err := open(cfg, newFake(nil))
	if err == nil {
		n.Close()
		t.Fatal("force new cluster on an empty data dir: got = no error, expected: nothing to restore")
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "nothing to restore") {
		t.Errorf("got = %v, expected: an error naming %s and saying there is nothing to restore", err, dir)
	}
}

// A node started without Bootstrap waits for a leader to add it, and
// until the leader's configuration entry reaches it, its log may name a
// cluster without it: the check must leave such a node alone.
func TestANodeWaitingToBeAddedIsNotChecked(t *testing.T) {
	t.Parallel()
	dir, _ := seedDataDir(t, "wal")
	cfg := testConfig(dir, "wal")
	cfg.NodeID = "new"
	cfg.Bootstrap = false
	n := openFake(t, cfg, nil)
	if n.IsLeader() {
		t.Error("a node outside the configuration leads, expected: a follower waiting to be added")
	}
}
