package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// etcdClient is etcd's own client of the given nodes' etcd APIs.
func etcdClient(t testing.TB, nodes ...*cluster.Node) *clientv3.Client {
	t.Helper()
	var endpoints []string
	for _, n := range nodes {
		endpoints = append(endpoints, n.EtcdAddr())
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// An etcd client that only knows a follower gets the leader's answers:
// writes, linearizable reads, leases and their keep-alives, and locks are
// forwarded; what the follower answers itself agrees with them.
func TestEtcdThroughAFollowerAnswersAsTheLeader(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	_, followers := leaderAndFollowers(t, c)
	a, b := etcdClient(t, followers[0]), etcdClient(t, followers[1])
	ctx := waitCtx(t)

	for i := range 10 {
		put, err := a.Put(ctx, "k", fmt.Sprint(i))
		if err != nil {
			t.Fatalf("put %d through %s: %v", i, followers[0], err)
		}
		got, err := b.Get(ctx, "k")
		if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != fmt.Sprint(i) {
			t.Fatalf("get through %s right after put %d: got = %v, %v, expected: %d", followers[1], i, got, err, i)
		}
		if got.Header.Revision != put.Header.Revision || got.Kvs[0].ModRevision != put.Header.Revision {
			t.Fatalf("revisions: put answered %d, get answered header %d mod %d, expected: the same", put.Header.Revision, got.Header.Revision, got.Kvs[0].ModRevision)
		}
	}

	lease, err := a.Grant(ctx, 5)
	if err != nil {
		t.Fatalf("grant through a follower: %v", err)
	}
	if _, err := a.Put(ctx, "owned", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	ka, err := a.KeepAliveOnce(ctx, lease.ID)
	if err != nil || ka.TTL <= 0 {
		t.Fatalf("keep-alive through a follower: got = %v, %v, expected: a positive TTL", ka, err)
	}
	ttl, err := b.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL <= 0 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "owned" {
		t.Fatalf("time-to-live through the other follower: got = %+v, %v, expected: TTL > 0 and key owned", ttl, err)
	}

	s1, err := concurrency.NewSession(a, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(b, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	m1, m2 := concurrency.NewMutex(s1, "/locks/job"), concurrency.NewMutex(s2, "/locks/job")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(ctx); err != concurrency.ErrLocked {
		t.Fatalf("TryLock of a held mutex through the other follower: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the unlock: %v", err)
	}

	if _, err := a.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, "owned"); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("the revoked lease's key: got = %v, %v, expected: gone", got, err)
	}
}

// A lease kept alive through etcd's client outlives the leader: the new
// leader gives it a full TTL, and its keys stay.
func TestEtcdLeaseKeptAliveAcrossALeaderStop(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	leader, _ := leaderAndFollowers(t, c)
	cl := etcdClient(t, c.Nodes()...)
	ctx := waitCtx(t)

	lease, err := cl.Grant(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Put(ctx, "mine", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	kaCtx, stop := context.WithCancel(ctx)
	defer stop()
	alive, err := cl.KeepAlive(kaCtx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range alive {
		}
	}()
	if err := c.Stop(leader); err != nil {
		t.Fatal(err)
	}
	// Well past the TTL: only keep-alives through the new leader keep it.
	time.Sleep(5 * time.Second)
	got, err := cl.Get(ctx, "mine")
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the lease's key 5s after the leader stopped: got = %v, %v, expected: still there", got, err)
	}
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
}

// A write through a follower is answered once the follower itself has
// applied it, as etcd's member answers a write it proposed: a
// serializable read on that member right after sees it, every time.
func TestAWriteThroughAFollowerIsReadThereNext(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	_, followers := leaderAndFollowers(t, c)
	cli := etcdClient(t, followers[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 50 {
		key, value := fmt.Sprintf("ryw/%d", i), fmt.Sprint(i)
		put, err := cli.Put(ctx, key, value)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cli.Get(ctx, key, clientv3.WithSerializable())
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != value {
			t.Fatalf("write %d (revision %d): got = %v at revision %d from a serializable read on the follower it went through, expected: %q", i, put.Header.Revision, got.Kvs, got.Header.Revision, value)
		}
	}
}
