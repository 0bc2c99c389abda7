package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
	"github.com/tenurehq/tenure/statemachine"
)

// tcpCluster is n servers in this process that form a cluster over TCP
// as `tenure serve --bootstrap-expect n --join ...` does: each knows the
// others' API addresses only, and they meet, elect and register their
// API addresses by themselves.
type tcpCluster struct {
	t     *testing.T
	nodes []*tcpNode
}

type tcpNode struct {
	id, addr string
	srv      *server.Server // nil once stopped
}

func newTCPCluster(t *testing.T, n int) *tcpCluster {
	t.Helper()
	c := &tcpCluster{t: t}
	lns := make([]net.Listener, n)
	for i := range n {
		lns[i] = testnet.Listen(t)
		c.nodes = append(c.nodes, &tcpNode{id: fmt.Sprintf("n%d", i), addr: lns[i].Addr().String()})
	}
	t.Cleanup(func() {
		for _, node := range c.nodes {
			c.stop(node)
		}
	})
	for i, node := range c.nodes {
		var join []string
		for _, other := range c.nodes {
			if other != node {
				join = append(join, other.addr)
			}
		}
		srv, err := server.Open(server.Config{
			Listener:        lns[i],
			Join:            join,
			BootstrapExpect: n,
			Limits:          testserver.Limits(),
			Logger:          slog.New(slog.DiscardHandler),
			Raft: raftnode.Config{
				NodeID:         node.id,
				DataDir:        t.TempDir(),
				PeerAddr:       testnet.Free(t),
				Bootstrap:      true,
				WALSegmentSize: 1 << 20,
				// Short enough for a failover well under a second, long
				// enough not to start needless elections under -race.
				ElectionTimeout: 200 * time.Millisecond,
			},
		})
		if err != nil {
			t.Fatalf("start %s: %v", node.id, err)
		}
		node.srv = srv
	}
	return c
}

func (c *tcpCluster) stop(n *tcpNode) {
	if n.srv != nil {
		if err := n.srv.Close(); err != nil {
			c.t.Errorf("stop %s: %v", n.id, err)
		}
		n.srv = nil
	}
}

func (c *tcpCluster) node(id string) *tcpNode {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	c.t.Fatalf("no node %s", id)
	return nil
}

// settledMembers waits until n members are listed, every one reachable,
// registered and ready, and returns them; or fails the test once ctx
// ends. Members register their API addresses and become ready on their
// own after the cluster forms.
func settledMembers(t *testing.T, ctx context.Context, cl *client.Client, n int) []client.Member {
	t.Helper()
	for {
		members, err := cl.Members(ctx)
		settled := err == nil && len(members) == n
		for _, m := range members {
			settled = settled && m.Reachable() && m.Ready
		}
		if settled {
			return members
		}
		if ctx.Err() != nil {
			t.Fatalf("members never settled: got = %+v (%v), expected: %d, each reachable and ready", members, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leaderOf returns the member that leads, by every member's own account.
func leaderOf(t *testing.T, members []client.Member) client.Member {
	t.Helper()
	for _, m := range members {
		if m.Leader {
			return m
		}
	}
	t.Fatalf("no leader in %+v", members)
	return client.Member{}
}

func TestMembersListsEveryServerWithItsOwnStatus(t *testing.T) {
	c := newTCPCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	asked := c.nodes[1]
	cl := newClient(t, asked.addr)

	members := settledMembers(t, ctx, cl, 3)
	leader := leaderOf(t, members)
	for _, m := range members {
		node := c.node(m.ID)
		if m.APIAddress != node.addr || m.PeerAddress == "" || !m.Voter {
			t.Errorf("member %s: got = api %q peer %q voter %v, expected: api %q, a peer address, a voter", m.ID, m.APIAddress, m.PeerAddress, m.Voter, node.addr)
		}
		wantRole := "follower"
		if m.ID == leader.ID {
			wantRole = "leader"
		}
		if m.Role != wantRole || m.LeaderID != leader.ID || m.LeaderAPIAddress != leader.APIAddress {
			t.Errorf("member %s: got = role %q leader %q at %q, expected: role %q, leader %s at %s", m.ID, m.Role, m.LeaderID, m.LeaderAPIAddress, wantRole, leader.ID, leader.APIAddress)
		}
		if m.Term == 0 || m.CommitIndex == 0 || m.AppliedIndex == 0 || m.LastLogIndex == 0 {
			t.Errorf("member %s: status got = %+v, expected: a term and raft indexes", m.ID, m.MemberStatus)
		}
		if m.ID == leader.ID && m.LastContact != 0 {
			t.Errorf("leader %s: last contact got = %v, expected: 0", m.ID, m.LastContact)
		}
	}
	// The answering node is the only Self; the client follows the leader
	// after the first call, so which node answered varies.
	selves := 0
	for _, m := range members {
		if m.Self {
			selves++
		}
	}
	if selves != 1 {
		t.Errorf("members marked self: got = %d, expected: 1", selves)
	}

	// A member that is down is listed still, as unreachable.
	var down *tcpNode
	for _, n := range c.nodes {
		if n.id != leader.ID {
			down = n
		}
	}
	c.stop(down)
	members, err := cl.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Fatalf("members with %s down: got = %+v, expected: 3", down.id, members)
	}
	for _, m := range members {
		switch {
		case m.ID == down.id && (m.Reachable() || m.Role != "" || m.Term != 0):
			t.Errorf("stopped member %s: got = %+v, expected: unreachable, with no status", m.ID, m)
		case m.ID != down.id && !m.Reachable():
			t.Errorf("running member %s: got = unreachable (%s), expected: its status", m.ID, m.Err)
		}
	}
}

func TestTransferLeadershipReturnsTheNewLeader(t *testing.T) {
	c := newTCPCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := newClient(t, c.nodes[0].addr)
	old := leaderOf(t, settledMembers(t, ctx, cl, 3))

	got, err := cl.TransferLeadership(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if got == "" || got == old.ID {
		t.Fatalf("transfer, raft picking: new leader got = %q, expected: a voter other than %s", got, old.ID)
	}
	if now := leaderOf(t, settledMembers(t, ctx, cl, 3)); now.ID != got {
		t.Fatalf("leader after the transfer: got = %s, expected: %s, the one returned", now.ID, got)
	}

	got, err = cl.TransferLeadership(ctx, old.ID)
	if err != nil || got != old.ID {
		t.Fatalf("transfer to %s: got = %q, %v, expected: %s", old.ID, got, err, old.ID)
	}
	got, err = cl.TransferLeadership(ctx, old.ID)
	if err != nil || got != old.ID {
		t.Fatalf("transfer to %s, which leads: got = %q, %v, expected: %s, and nothing moved", old.ID, got, err, old.ID)
	}
	if _, err := cl.TransferLeadership(ctx, "nobody"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("transfer to a member that does not exist: got = %v, expected: ErrNotFound", err)
	}
}

func TestRemoveMemberTakesAServerOut(t *testing.T) {
	c := newTCPCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := newClient(t, c.nodes[0].addr)
	leader := leaderOf(t, settledMembers(t, ctx, cl, 3))
	var gone string
	for _, n := range c.nodes {
		if n.id != leader.ID {
			gone = n.id
		}
	}

	if err := cl.RemoveMember(ctx, "nobody"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("remove a member that does not exist: got = %v, expected: ErrNotFound", err)
	}
	if err := cl.RemoveMember(ctx, gone); err != nil {
		t.Fatal(err)
	}
	c.stop(c.node(gone))
	members := settledMembers(t, ctx, cl, 2)
	for _, m := range members {
		if m.ID == gone {
			t.Errorf("members after removing %s: got = %+v, expected: it gone", gone, members)
		}
	}
	if err := cl.RemoveMember(ctx, gone); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("remove %s again: got = %v, expected: ErrNotFound", gone, err)
	}
}

// A snapshot is asked of a follower, which names the leader; then again
// through the same client after leadership has moved. Either way it is
// the whole state, holding every write acknowledged before.
func TestSnapshotFollowsTheLeaderAndHoldsEveryWrite(t *testing.T) {
	c := newTCPCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	probe := newClient(t, c.nodes[0].addr)
	leader := leaderOf(t, settledMembers(t, ctx, probe, 3))
	var follower string
	for _, n := range c.nodes {
		if n.id != leader.ID {
			follower = n.addr
		}
	}
	cl := newClient(t, follower) // its first call goes to the follower

	rev1, err := probe.KV().Put(ctx, "snap/k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rev, err := cl.Snapshot(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, buf.Bytes(), rev, rev1, "v1")

	if _, err := probe.TransferLeadership(ctx, ""); err != nil {
		t.Fatal(err)
	}
	rev2, err := probe.KV().Put(ctx, "snap/k", "v2")
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if rev, err = cl.Snapshot(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, buf.Bytes(), rev, rev2, "v2")
}

func checkSnapshot(t *testing.T, snap []byte, rev, wantRev int64, wantValue string) {
	t.Helper()
	m := statemachine.New()
	if err := m.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("restore the snapshot: %v", err)
	}
	// The snapshot's revision is the global one; the write's is the
	// keys' (KV) revision, which the snapshot must have reached too.
	// Before cluster version 5 keys took the global revision.
	keys := m.KVRevision()
	if keys == 0 {
		keys = m.Revision()
	}
	if keys < wantRev {
		t.Errorf("snapshot's key revision got = %d, expected: at least %d, the last write's", keys, wantRev)
	}
	if m.Revision() != rev {
		t.Errorf("restored revision got = %d, expected: %d, the one Snapshot returned", m.Revision(), rev)
	}
	if kv, ok := m.Key("snap/k"); !ok || kv.Value != wantValue {
		t.Errorf("restored snap/k got = %+v %v, expected: %q", kv, ok, wantValue)
	}
}
