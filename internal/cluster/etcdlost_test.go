package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// TestAWriteLostToALeadershipChangeIsUnavailable: a write made on a
// leader that is cut off is appended there, and fails when the leader
// steps down for want of a quorum: its outcome unknown, since the entry
// may yet commit elsewhere. Through the etcd API the answer is what etcd
// gives a proposal whose leader failed: Unavailable, "etcdserver:
// request timed out, possibly due to previous leader failure" (it was
// codes.Unknown and raftnode's text). Through the native API it is
// Unavailable with the reason leadership_lost. The leader steps down an
// election timeout after it is cut off, so the write reaches it first
// unless the machine stalls for that long: such a round is tried again.
func TestAWriteLostToALeadershipChangeIsUnavailable(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}), cluster.WithRaft(func(rc *raftnode.Config) {
		rc.ElectionTimeout = time.Second
	}))
	for _, frontEnd := range []string{"etcd", "native"} {
		t.Run(frontEnd, func(t *testing.T) {
			for attempt := 0; ; attempt++ {
				if attempt == 5 {
					t.Fatal("the leader stepped down before the write reached it in every round")
				}
				lead := leader(t, c)
				ec := etcdClient(t, lead)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				c.Partition(lead)
				var err error
				if frontEnd == "etcd" {
					_, err = ec.Put(ctx, "k", "v")
				} else {
					_, err = lead.API().KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "v"}))
				}
				cancel()
				c.Heal()
				if errors.Is(err, rpctypes.ErrNoLeader) || isNotLeader(err) {
					continue // stepped down first: nothing was appended
				}
				if frontEnd == "etcd" {
					if !errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) {
						t.Fatalf("etcd Put on a leader cut off: got = %v, expected: %v (Unavailable)", err, rpctypes.ErrTimeoutDueToLeaderFail)
					}
				} else {
					var ce *connect.Error
					if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable || api.Reason(ce.Meta().Get(api.ErrorHeader)) != api.ReasonLeadershipLost {
						t.Fatalf("native Put on a leader cut off: got = %v, expected: unavailable, reason %s", err, api.ReasonLeadershipLost)
					}
				}
				return
			}
		})
	}
}
