package cluster_test

import (
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// An etcd call through a follower is counted once, by the follower its
// client called, and marked as forwarded there; the leader that answered
// it does not count it again. A stream forwarded whole (a lease
// keep-alive) is counted the same way.
func TestEtcdCallThroughAFollowerIsCountedOnceThere(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	lead, followers := leaderAndFollowers(t, c)
	f := followers[0]
	cli := etcdClient(t, f)
	ctx := waitCtx(t)

	put := map[string]string{"method": "/etcdserverpb.KV/Put", "code": "ok"}
	grant := map[string]string{"method": "/etcdserverpb.Lease/LeaseGrant", "code": "ok"}
	keepAlive := map[string]string{"method": "/etcdserverpb.Lease/LeaseKeepAlive"}
	grpcPut := map[string]string{"grpc_service": "etcdserverpb.KV", "grpc_method": "Put", "grpc_code": "OK"}
	type probe struct {
		node   *cluster.Node
		name   string
		labels map[string]string
		want   float64 // rise
	}
	probes := []probe{
		{f, "tenure_requests_total", put, 1},
		{lead, "tenure_requests_total", put, 0},
		{f, "grpc_server_handled_total", grpcPut, 1},
		{lead, "grpc_server_handled_total", grpcPut, 0},
		{f, "tenure_requests_total", grant, 1},
		{lead, "tenure_requests_total", grant, 0},
		{f, "tenure_requests_total", keepAlive, 1},
		{lead, "tenure_requests_total", keepAlive, 0},
		{f, "tenure_forwarded_calls_total", nil, 3},
		{lead, "tenure_forwarded_calls_total", nil, 0},
	}
	before := make([]float64, len(probes))
	for i, p := range probes {
		before[i] = counter(t, p.node, p.name, p.labels)
	}

	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put through %s: %v", f, err)
	}
	lease, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatalf("grant through %s: %v", f, err)
	}
	// KeepAliveOnce opens a stream, which the follower forwards whole,
	// and closes it once answered.
	if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("keep-alive through %s: %v", f, err)
	}

	// The stream is counted when it ends, which the client's close
	// reaches the follower a moment after KeepAliveOnce returns.
	for {
		if counter(t, f, "tenure_requests_total", keepAlive)-before[6] >= 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the keep-alive stream's end was never counted on the follower")
		case <-time.After(10 * time.Millisecond):
		}
	}
	for i, p := range probes {
		if got := counter(t, p.node, p.name, p.labels) - before[i]; got != p.want {
			role := "the follower"
			if p.node == lead {
				role = "the leader"
			}
			t.Errorf("%s%v on %s rose by: got = %v, expected: %v", p.name, p.labels, role, got, p.want)
		}
	}
}
