package raftnode

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/tenurehq/tenure/statemachine"
)

// testCluster is fake-state nodes in one process on an in-memory
// network, each on its own data dir, so that a partition is a function
// call. The server's harness (internal/cluster) does the same with whole
// servers; this one sits below it, as raftnode's tests cannot import the
// server.
type testCluster struct {
	t     testing.TB
	nodes []*Node
	net   *MemNetwork
	ids   []string
}

// newTestCluster starts size nodes, n1…nsize, all bootstrapped with the
// same configuration, and closes them when the test ends. tweaks change
// every node's Config before it opens.
func newTestCluster(t testing.TB, size int, tweaks ...func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, net: NewMemNetwork()}
	voters := make([]Peer, size)
	for i := range size {
		id := fmt.Sprintf("n%d", i+1)
		voters[i] = Peer{ID: id, Address: id}
		c.ids = append(c.ids, id)
	}
	for i := range size {
		cfg := testConfig(t.TempDir(), "")
		cfg.PeerAddr = ""
		cfg.NodeID = voters[i].ID
		cfg.Network = c.net
		cfg.WALSegmentSize = 1 << 20
		cfg.InitialVoters = voters
		for _, tweak := range tweaks {
			tweak(&cfg)
		}
		c.nodes = append(c.nodes, openFake(t, cfg, nil))
	}
	return c
}

// heal connects every node to every other.
func (c *testCluster) heal() {
	for _, a := range c.ids {
		for _, b := range c.ids {
			if a != b {
				c.net.Connect(a, b)
			}
		}
	}
}

// isolate cuts n off from every other node, both ways.
func (c *testCluster) isolate(n *Node) { c.net.Isolate(n.Addr()) }

// leader waits until exactly one of among believes it leads, and returns
// it. A partitioned old leader may believe so for a while too, so callers
// that partitioned one pass the other side.
func (c *testCluster) leader(among ...*Node) *Node {
	c.t.Helper()
	if len(among) == 0 {
		among = c.nodes
	}
	var leader *Node
	waitFor(c.t, "one leader", func() bool {
		leader = nil
		for _, n := range among {
			if n.IsLeader() {
				if leader != nil {
					return false
				}
				leader = n
			}
		}
		return leader != nil
	})
	return leader
}

// others returns the nodes but n.
func (c *testCluster) others(n *Node) []*Node {
	var out []*Node
	for _, m := range c.nodes {
		if m != n {
			out = append(out, m)
		}
	}
	return out
}

func TestANewLeaderServesTheOldLeadersAcknowledgedWrites(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3)
	old := c.leader()
	r := put(t, old, "a", "1")

	c.isolate(old)
	next := c.leader(c.others(old)...)
	got, rev := readKV(t, next)
	if got["a"] != "1" || rev != r.Revision {
		t.Errorf("new leader reads %v at revision %d, expected: a=1 at %d", got, rev, r.Revision)
	}
	if r2 := put(t, next, "b", "2"); r2.Revision != r.Revision+1 {
		t.Errorf("write on the new leader at revision %d, expected: %d", r2.Revision, r.Revision+1)
	}
}

// TestAPartitionedLeaderCommitsNothing is the deposed-leader rule at the
// log's level: on the minority side a leader can neither acknowledge a
// write nor serve a linearizable read, and once healed it holds the
// majority's state, not its own.
func TestAPartitionedLeaderCommitsNothing(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3)
	old := c.leader()
	put(t, old, "a", "1")

	c.isolate(old)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Whether it still believes it leads (the entry is appended, then
	// dropped when it steps down) or has already stepped down, the answer
	// must not be an acknowledgement.
	if _, err := old.Propose(ctx, statemachine.Put{Key: "lost", Value: "x"}); err == nil {
		t.Error("propose on a partitioned leader: got = acknowledged, expected: an error")
	} else if !errors.Is(err, ErrLeadershipLost) && !errors.Is(err, ErrNotLeader) {
		t.Errorf("propose on a partitioned leader: got = %v, expected: ErrLeadershipLost or ErrNotLeader", err)
	}
	if err := old.Read(ctx, func(*statemachine.Machine) error { return nil }); err == nil {
		t.Error("linearizable read on a partitioned leader: got = no error, expected: an error")
	}

	next := c.leader(c.others(old)...)
	want := put(t, next, "b", "2")
	c.heal()
	waitFor(t, "the old leader to catch up", func() bool { return old.AppliedIndex() >= next.AppliedIndex() })
	got, rev := localKV(t, old)
	if _, ok := got["lost"]; ok || got["b"] != "2" || rev != want.Revision {
		t.Errorf("old leader after healing: kv = %v at revision %d, expected: a=1, b=2 and no lost key at %d", got, rev, want.Revision)
	}
}

// TestGivenNetworkAndStoresOutliveTheNode: Close leaves what the caller
// gave open, and a node opened again on the same stores carries on from
// their state, as a restarted process on the same files would.
func TestGivenNetworkAndStoresOutliveTheNode(t *testing.T) {
	t.Parallel()
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(t.TempDir(), "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the nodes' own cleanups, so it runs after them.
	t.Cleanup(func() { bolt.Close() })
	cfg := testConfig(t.TempDir(), "")
	cfg.DataDir, cfg.PeerAddr, cfg.NodeID = "", "", "n1"
	cfg.Network = NewMemNetwork()
	cfg.Stores = Stores{Log: bolt, Stable: bolt, Snapshots: raft.NewInmemSnapshotStore()}

	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	if n.Addr() != "n1" {
		t.Errorf("Addr = %q, expected: its ID on the network, n1", n.Addr())
	}
	put(t, n, "a", "1")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := bolt.LastIndex(); err != nil {
		t.Errorf("store after the node closed: %v, expected: still open", err)
	}

	n = openFake(t, cfg, nil)
	waitLeader(t, n)
	if got, rev := readKV(t, n); got["a"] != "1" || rev != 1 {
		t.Errorf("reopened on the same stores: kv = %v at revision %d, expected: a=1 at 1", got, rev)
	}
}

func TestOpenRefusesPlugsThatContradictEachOther(t *testing.T) {
	t.Parallel()
	store := raft.NewInmemStore()
	voters := []Peer{{ID: "n1"}, {ID: "n2", Address: "n2"}}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"stores must be given all together", func(c *Config) {
			c.Stores = Stores{Log: store, Stable: store}
		}, "all of Log, Stable and Snapshots"},
		{"a node without stores needs a data dir", func(c *Config) {
			c.DataDir = ""
		}, "DataDir is required"},
		{"a node without a transport needs a peer address", func(c *Config) {
			c.PeerAddr = ""
		}, "PeerAddr is required"},
		{"a given network has its own address", func(c *Config) {
			c.Network = NewMemNetwork()
		}, "must be empty when a Network is given"},
		{"an election timeout too short to tick", func(c *Config) {
			c.ElectionTimeout = time.Millisecond
		}, "ElectionTimeout 1ms is below 10ms"},
		{"initial voters are for bootstrapping", func(c *Config) {
			c.Bootstrap, c.NodeID, c.InitialVoters = false, "n1", voters
		}, "only used with Bootstrap"},
		{"initial voters must list this node", func(c *Config) {
			c.NodeID, c.InitialVoters = "n3", []Peer{{ID: "n1", Address: "n1"}, {ID: "n2", Address: "n2"}}
		}, "does not list this node, n3"},
		{"initial voters are listed once", func(c *Config) {
			c.NodeID, c.InitialVoters = "n1", append(voters, Peer{ID: "n2", Address: "x"})
		}, "lists n2 twice"},
		{"other initial voters need an address", func(c *Config) {
			c.NodeID, c.InitialVoters = "n1", []Peer{{ID: "n1"}, {ID: "n2"}}
		}, "lists n2 without an address"},
		{"this node's listed address must be its own", func(c *Config) {
			c.NodeID, c.InitialVoters = "n1", []Peer{{ID: "n1", Address: "127.0.0.1:1"}, {ID: "n2", Address: "n2"}}
		}, "but its address is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir(), "wal")
			tc.change(&cfg)
			n, err := open(cfg, newFake(nil))
			if err == nil {
				n.Close()
				t.Fatalf("got = no error, expected: an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got = %v, expected: an error containing %q", err, tc.want)
			}
		})
	}
}
