package cluster_test

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// An etcd lease keep-alive stream is never ended by a leader change: the
// node it reached relays it to whichever node leads, so the keep-alives
// sent after the change are answered by the new leader on the same
// stream, with the lease's full TTL. An ended stream costs an etcd client
// half a second before it opens another (clientv3's retryConnWait), and a
// stream left on a leader that froze costs it the lease: clientv3 closes
// a lease's keep-alive channel when no answer comes within its TTL.
//
// Through the old leader, the stream waits while that node, cut off,
// knows no leader, and moves once it hears from the new one.
func TestEtcdKeepAliveStreamFollowsTheLeader(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onLeader bool
	}{
		{"through a follower", false},
		{"through the old leader", true},
	} {
		t.Run(tc.name, func(t *testing.T) { testKeepAliveFollowsTheLeader(t, tc.onLeader) })
	}
}

func testKeepAliveFollowsTheLeader(t *testing.T, onLeader bool) {
	const ttl = 5
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	old, followers := leaderAndFollowers(t, c)
	via := followers[0]
	if onLeader {
		via = old
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := etcdConn(t, via)
	leases := pb.NewLeaseClient(conn)
	grant, err := leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: ttl})
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	streamCtx, endStream := context.WithCancel(ctx)
	stream, err := leases.LeaseKeepAlive(streamCtx)
	if err != nil {
		t.Fatalf("keep-alive stream: %v", err)
	}
	answers, ended, done := make(chan *pb.LeaseKeepAliveResponse, 16), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case answers <- resp:
			case <-streamCtx.Done():
			}
		}
	}()
	defer func() {
		endStream()
		<-done
	}()

	// answeredBy sends keep-alives every 100 ms until one is answered by
	// member, and fails the test if the stream ends or an answer does not
	// give the lease its TTL.
	answeredBy := func(what string, member uint64) {
		t.Helper()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: grant.ID}); err != nil {
				t.Fatalf("waiting for %s: send: %v", what, err)
			}
			select {
			case resp := <-answers:
				if resp.ID != grant.ID || resp.TTL != ttl {
					t.Fatalf("waiting for %s: got = lease %x TTL %d, expected: lease %x TTL %d", what, resp.ID, resp.TTL, grant.ID, ttl)
				}
				if resp.Header.MemberId == member {
					return
				}
			case err := <-ended:
				t.Fatalf("waiting for %s: the keep-alive stream ended: %v", what, err)
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-tick.C:
			}
		}
	}
	answeredBy("an answer from the leader", memberOf(ctx, t, old))

	c.Partition(old)
	next := leaderOtherThan(t, c, old)
	if onLeader {
		// Cut off, the old leader learns who leads only once it hears
		// from them again.
		c.Heal()
	}
	answeredBy("an answer from the new leader "+next.ID(), memberOf(ctx, t, next))
	if !onLeader {
		c.Heal()
	}
}

// etcdConn is a gRPC connection to n's etcd API, closed at cleanup.
func etcdConn(t testing.TB, n *cluster.Node) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(n.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// memberOf is n's etcd member ID, as its answers' headers carry it.
func memberOf(ctx context.Context, t testing.TB, n *cluster.Node) uint64 {
	t.Helper()
	st, err := pb.NewMaintenanceClient(etcdConn(t, n)).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatalf("status of %s: %v", n.ID(), err)
	}
	return st.Header.MemberId
}
