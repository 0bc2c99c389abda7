package cluster_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// TestEtcdLockAndElectionThroughAFollower: etcd's Lock and Election
// services through a follower work as on the leader: the follower
// forwards them, and hands back the leader's answers as it gave them,
// etcd's concurrency errors (codes.Unknown with their texts) included.
// The recipes answer "no leader" as etcd's do, codes.Unknown, so the
// forwarding, which looked for Unavailable, took a follower's own "no
// leader" for an answer and never asked the leader. A follower that
// knows no leader still answers "no leader" in etcd's form, once it has
// waited for one.
func TestEtcdLockAndElectionThroughAFollower(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	_, followers := leaderAndFollowers(t, c)
	f := followers[0]
	ec := etcdClient(t, f)
	conn := ec.ActiveConnection()
	locks, elections := v3lockpb.NewLockClient(conn), v3electionpb.NewElectionClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := ec.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	id := int64(lease.ID)

	lock, err := locks.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("job"), Lease: id})
	if err != nil {
		t.Fatalf("Lock through a follower: %v", err)
	}
	if _, err := locks.Unlock(ctx, &v3lockpb.UnlockRequest{Key: lock.Key}); err != nil {
		t.Fatalf("Unlock through a follower: %v", err)
	}
	camp, err := elections.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte("chief"), Lease: id, Value: []byte("a")})
	if err != nil {
		t.Fatalf("Campaign through a follower: %v", err)
	}
	if _, err := elections.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: camp.Leader, Value: []byte("b")}); err != nil {
		t.Fatalf("Proclaim through a follower: %v", err)
	}

	// The leader's own answers, as etcd gives them.
	wrong := *camp.Leader
	wrong.Key = append([]byte(nil), wrong.Key...)
	wrong.Key[len(wrong.Key)-1]++
	_, err = elections.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: &wrong, Value: []byte("c")})
	expectStatus(t, "Proclaim by a campaigner that does not lead", err, codes.Unknown, "election: not leader")
	_, err = locks.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("job"), Lease: id + 1})
	expectStatus(t, "Lock on a lease that does not exist", err, codes.Unknown, "etcdserver: requested lease not found")
	if _, err := elections.Resign(ctx, &v3electionpb.ResignRequest{Leader: camp.Leader}); err != nil {
		t.Fatalf("Resign through a follower: %v", err)
	}

	// A follower that knows no leader says so.
	c.Partition(f)
	waitFor(t, ctx, f.ID()+" to know no leader", func() bool {
		st, err := f.API().Cluster.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
		return err == nil && st.Msg.GetLeaderId() == ""
	})
	_, err = locks.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("job"), Lease: id})
	expectStatus(t, "Lock through a follower cut off from the others", err, codes.Unknown, "etcdserver: no leader")
	c.Heal()
}

// expectStatus fails the test unless err is a gRPC status with code and
// message.
func expectStatus(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != code || st.Message() != msg {
		t.Fatalf("%s: got = %v, expected: %v %q", what, err, code, msg)
	}
}
