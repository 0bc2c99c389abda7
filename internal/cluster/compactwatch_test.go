package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// TestAWatchFromBeforeACompactionRightAfterItIsRefusedOnAFollower: once
// Compact has answered, a watch from a revision it compacted is refused
// on every node, at once, as etcd refuses it: through the etcd API with
// its compacted response (canceled, compact_revision set), through the
// native API with ErrLagged. A follower applies the compaction only when
// the leader tells it the entry committed, which may come after the
// answer, and served such watches its history until then, events and
// all (a third of the rounds here). The compaction is made through the
// leader and through the follower itself (which forwards it), in turn,
// and each front end watches in turn, many times, as the race needs.
func TestAWatchFromBeforeACompactionRightAfterItIsRefusedOnAFollower(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	lead, followers := leaderAndFollowers(t, c)
	f := followers[0]
	compactors := []*clientv3.Client{etcdClient(t, lead), etcdClient(t, f)}
	fc, native := etcdClient(t, f), dial(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for i := range 120 {
		var rev int64
		for j := range 3 {
			p, err := compactors[0].Put(ctx, "k", fmt.Sprint(i, j))
			if err != nil {
				t.Fatal(err)
			}
			rev = p.Header.Revision
		}
		compacted, from := rev-1, rev-2
		if _, err := compactors[i%2].Compact(ctx, compacted); err != nil {
			t.Fatalf("round %d: compact %d: %v", i, compacted, err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		if i/2%2 == 0 {
			resp := <-fc.Watch(wctx, "k", clientv3.WithRev(from))
			if !resp.Canceled || resp.CompactRevision != compacted || len(resp.Events) != 0 {
				wcancel()
				t.Fatalf("round %d: etcd watch from %d right after compact %d: got = canceled %v, compact_revision %d, %d events (err %v); expected: canceled, compact_revision %d, no events",
					i, from, compacted, resp.Canceled, resp.CompactRevision, len(resp.Events), resp.Err(), compacted)
			}
		} else {
			ev := <-native.KV().Watch(wctx, "k", client.WithRevision(from))
			if !errors.Is(ev.Err, client.ErrLagged) {
				wcancel()
				t.Fatalf("round %d: native watch from %d right after compact %d: got = %v at revision %d (err %v), expected: ErrLagged",
					i, from, compacted, ev.Type, ev.Revision, ev.Err)
			}
		}
		wcancel()
	}
}
