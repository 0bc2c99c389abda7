package cluster_test

import (
	"bytes"
	"errors"
	"hash/fnv"
	"io"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
	"github.com/tenurehq/tenure/statemachine"
)

// etcdMemberID is the etcd member ID of node ID id.
func etcdMemberID(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// etcd's maintenance calls through each member of a three-node cluster:
// HashKV agrees on every member, a snapshot from a follower holds the
// last write, an alarm raised through one member is obeyed by all, and
// MoveLeader through a follower moves the lead.
func TestEtcdMaintenanceOnEveryMember(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	lead, followers := leaderAndFollowers(t, c)
	ctx := waitCtx(t)
	a := etcdClient(t, followers[0])
	for _, k := range []string{"a", "b", "a", "c"} {
		if _, err := a.Put(ctx, k, "v-"+k); err != nil {
			t.Fatal(err)
		}
	}
	last, err := a.Put(ctx, "last", "x")
	if err != nil {
		t.Fatal(err)
	}

	// A snapshot through the other follower holds the write just made.
	rc, err := etcdClient(t, followers[1]).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	state, err := etcdapi.OpenSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	m := statemachine.New()
	if err := m.Restore(bytes.NewReader(state)); err != nil {
		t.Fatal(err)
	}
	if m.KVRevision() < last.Header.Revision {
		t.Errorf("snapshot through a follower: got = revision %d, expected: at least %d, the last write's", m.KVRevision(), last.Header.Revision)
	}

	var hashes []uint32
	for _, n := range c.Nodes() {
		cl := etcdClient(t, n)
		waitFor(t, ctx, n.ID()+" to apply the last write", func() bool {
			r, err := cl.Get(ctx, "last", clientv3.WithSerializable())
			return err == nil && len(r.Kvs) == 1
		})
		h, err := cl.HashKV(ctx, n.EtcdAddr(), last.Header.Revision)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, h.Hash)
	}
	if hashes[0] != hashes[1] || hashes[1] != hashes[2] {
		t.Errorf("HashKV at %d on the three members: got = %v, expected: equal", last.Header.Revision, hashes)
	}

	// An alarm raised through a follower for the leader: every member
	// lists it and refuses writes, until it is disarmed.
	nospace := &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: etcdMemberID(lead.ID()), Alarm: pb.AlarmType_NOSPACE}
	if _, err := pb.NewMaintenanceClient(a.ActiveConnection()).Alarm(ctx, nospace); err != nil {
		t.Fatalf("alarm activate through a follower: %v", err)
	}
	for _, n := range c.Nodes() {
		cl := etcdClient(t, n)
		waitFor(t, ctx, n.ID()+" to list the alarm", func() bool {
			r, err := cl.AlarmList(ctx)
			return err == nil && len(r.Alarms) == 1 && r.Alarms[0].MemberID == nospace.MemberID
		})
	}
	if _, err := a.Put(ctx, "more", "x"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Errorf("put with the alarm raised: got = %v, expected: %v", err, rpctypes.ErrNoSpace)
	}
	if _, err := a.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: nospace.MemberID, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, "more", "x"); err != nil {
		t.Errorf("put once disarmed: got = %v, expected: success", err)
	}

	// MoveLeader through the follower that is not the target.
	target := followers[1]
	if _, err := a.MoveLeader(ctx, etcdMemberID(target.ID())); err != nil {
		t.Fatalf("move leader to %s through %s: %v", target, followers[0], err)
	}
	if got := leader(t, c); got != target {
		t.Errorf("leader after MoveLeader: got = %s, expected: %s", got, target)
	}
	if _, err := a.MoveLeader(ctx, 12345); !errors.Is(err, rpctypes.ErrBadLeaderTransferee) {
		t.Errorf("move leader to no member: got = %v, expected: %v", err, rpctypes.ErrBadLeaderTransferee)
	}
	// To a member cut off from the others: etcd's timeout, in its words.
	c.Disconnect(lead)
	defer c.Heal()
	_, err = a.MoveLeader(ctx, etcdMemberID(lead.ID()))
	if want := "etcdserver: request timed out, leader transfer took too long"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("move leader to a member cut off: got = %v, expected: %q", err, want)
	}
}

// etcd's member calls through a follower: a learner added for a node
// that never starts is listed unstarted, cannot be promoted, takes a new
// peer URL and goes; a voter is removed.
func TestEtcdMemberChangesThroughAFollower(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	lead, followers := leaderAndFollowers(t, c)
	ctx := waitCtx(t)
	a := etcdClient(t, followers[0])
	registered(t, lead)

	added, err := a.MemberAddAsLearner(ctx, []string{"http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	id := added.Member.ID
	if id != etcdMemberID("127.0.0.1:1") || !added.Member.IsLearner || len(added.Members) != 4 {
		t.Fatalf("member add: got = %v, expected: learner %x of four members", added, etcdMemberID("127.0.0.1:1"))
	}
	if _, err := a.MemberAddAsLearner(ctx, []string{"http://127.0.0.1:1"}); !errors.Is(err, rpctypes.ErrPeerURLExist) {
		t.Errorf("member add of the same URL: got = %v, expected: %v", err, rpctypes.ErrPeerURLExist)
	}
	list, err := a.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list.Members {
		if m.ID == id && (m.Name != "" || !m.IsLearner || len(m.ClientURLs) != 0) {
			t.Errorf("the new member in member list: got = %v, expected: an unstarted learner (no name, no client URL), as etcd lists it", m)
		}
	}
	if _, err := a.MemberPromote(ctx, id); !errors.Is(err, rpctypes.ErrMemberLearnerNotReady) {
		t.Errorf("promote of a learner that never started: got = %v, expected: %v", err, rpctypes.ErrMemberLearnerNotReady)
	}
	if _, err := a.MemberPromote(ctx, etcdMemberID(followers[1].ID())); !errors.Is(err, rpctypes.ErrMemberNotLearner) {
		t.Errorf("promote of a voter: got = %v, expected: %v", err, rpctypes.ErrMemberNotLearner)
	}
	if _, err := a.MemberUpdate(ctx, id, []string{"http://127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	list, err = a.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list.Members {
		if m.ID == id && (len(m.PeerURLs) != 1 || m.PeerURLs[0] != "http://127.0.0.1:2" || !m.IsLearner) {
			t.Errorf("the member updated: got = %v, expected: still a learner, at http://127.0.0.1:2", m)
		}
	}
	if _, err := a.MemberRemove(ctx, id); err != nil {
		t.Fatal(err)
	}
	removed, err := a.MemberRemove(ctx, etcdMemberID(followers[1].ID()))
	if err != nil {
		t.Fatal(err)
	}
	if len(removed.Members) != 2 {
		t.Errorf("members after two removes: got = %v, expected: 2", removed.Members)
	}
	if _, err := a.MemberRemove(ctx, id); !errors.Is(err, rpctypes.ErrMemberNotFound) {
		t.Errorf("remove again: got = %v, expected: %v", err, rpctypes.ErrMemberNotFound)
	}
	if _, err := a.Put(ctx, "k", "v"); err != nil {
		t.Errorf("put on the two members left: %v", err)
	}
}

// As etcd's strict reconfiguration check: no member change may leave
// fewer voters that have started than a quorum. Learners do not count.
func TestEtcdMemberChangesKeepAQuorumOfStartedVoters(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	lead, followers := leaderAndFollowers(t, c)
	ctx := waitCtx(t)
	a := etcdClient(t, followers[0])
	registered(t, lead)
	for _, url := range []string{"http://127.0.0.1:1", "http://127.0.0.1:2"} {
		if _, err := a.MemberAdd(ctx, []string{url}); err != nil {
			t.Fatalf("add voter %s (3 started voters stay a quorum): %v", url, err)
		}
	}
	if _, err := a.MemberAdd(ctx, []string{"http://127.0.0.1:3"}); !errors.Is(err, rpctypes.ErrMemberNotEnoughStarted) {
		t.Errorf("a sixth voter with three started: got = %v, expected: %v", err, rpctypes.ErrMemberNotEnoughStarted)
	}
	if _, err := a.MemberAddAsLearner(ctx, []string{"http://127.0.0.1:3"}); err != nil {
		t.Errorf("a learner is not counted: got = %v, expected: success", err)
	}
	if _, err := a.MemberRemove(ctx, etcdMemberID(followers[1].ID())); !errors.Is(err, rpctypes.ErrMemberNotEnoughStarted) {
		t.Errorf("removing a started voter of five, three started: got = %v, expected: %v", err, rpctypes.ErrMemberNotEnoughStarted)
	}
	for _, id := range []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"} {
		if _, err := a.MemberRemove(ctx, etcdMemberID(id)); err != nil {
			t.Errorf("remove %s, never started: %v", id, err)
		}
	}
	if _, err := a.Put(ctx, "k", "v"); err != nil {
		t.Errorf("put on the three members left: %v", err)
	}
}

// registered waits until the leader lead knows every other member's API
// address (it lists its own whether registered or not): each node
// registers it through the log soon after it starts, and etcd's checks
// count only the members that have.
func registered(t *testing.T, lead *cluster.Node) {
	t.Helper()
	waitFor(t, waitCtx(t), "every node to register", func() bool {
		for _, m := range members(t, lead).GetMembers() {
			if m.GetApiAddress() == "" {
				return false
			}
		}
		return true
	})
}
