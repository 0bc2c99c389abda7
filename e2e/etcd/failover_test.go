//go:build linux

package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/proccluster"
)

// A concurrency Session outlives a leader kill in a three-node cluster of
// real processes, so its lease, its lock key and its election key stay;
// the holder keeps the lock and the leadership throughout, and
// contenders from before and after the kill wait until the holder lets
// go. The holder's client either reaches the cluster through the leader,
// and its keep-alive stream, cut off with it, must resume on a survivor,
// or through a follower only, which must forward its keep-alives to the
// new leader.
func TestFailoverSessionKeepsLockAndLeadershipAcrossLeaderKill(t *testing.T) {
	t.Run("ThroughTheLeader", func(t *testing.T) { testFailover(t, true) })
	t.Run("ThroughAFollower", func(t *testing.T) { testFailover(t, false) })
}

func testFailover(t *testing.T, viaLeader bool) {
	const lockName, electionName, fenced = "failover-lock", "failover-election", "failover-fenced"
	// Tenure gives every session a full TTL from the moment a new leader
	// takes over, so the holder's lease would be gone well within 3 TTLs
	// of the kill if its keep-alives did not reach the new leader.
	const ttl = 5
	c := proccluster.Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	waitEtcdWrites(ctx, t, c)
	leader := c.WaitLeader(ctx)
	survivors := []string{c.Nodes[(leader+1)%3].Etcd, c.Nodes[(leader+2)%3].Etcd}
	etcdClient := func(endpoints ...string) *clientv3.Client {
		t.Helper()
		cl, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}

	var holderCli *clientv3.Client
	if viaLeader {
		// The client knows only the leader while it opens its session, so
		// that its keep-alive stream runs through the node about to be
		// killed; then it learns the others, to fail over to.
		holderCli = etcdClient(c.Nodes[leader].Etcd)
	} else {
		holderCli = etcdClient(survivors[0])
	}
	hs := newSession(t, holderCli, ttl)
	hm, he := concurrency.NewMutex(hs, lockName), concurrency.NewElection(hs, electionName)
	if err := hm.Lock(ctx); err != nil {
		t.Fatalf("holder's Lock: %v", err)
	}
	if err := he.Campaign(ctx, "holder"); err != nil {
		t.Fatalf("holder's Campaign: %v", err)
	}
	if viaLeader {
		holderCli.SetEndpoints(c.EtcdEndpoints(leader)...)
	}
	lockKV := getOne(ctx, t, holderCli, hm.Key())

	// A contender on a follower waits for both.
	waiterCli := etcdClient(survivors...)
	ws := newSession(t, waiterCli, ttl)
	wm, we := concurrency.NewMutex(ws, lockName), concurrency.NewElection(ws, electionName)
	locked, elected := make(chan error, 1), make(chan error, 1)
	go func() { locked <- wm.Lock(ctx) }()
	go func() { elected <- we.Campaign(ctx, "waiter") }()
	waitFor(ctx, t, "the waiter's lock and election keys", func() bool {
		return len(keysUnder(t, waiterCli, lockName+"/")) == 2 && len(keysUnder(t, waiterCli, electionName+"/")) == 2
	})

	c.Nodes[leader].Kill()
	killed := time.Now()
	next := c.WaitLeader(ctx, leader)
	t.Logf("killed leader %d; node %d leads after %v", leader, next, time.Since(killed).Round(time.Millisecond))

	checker := etcdClient(survivors...)
	checks := 0
	for time.Since(killed) < 3*ttl*time.Second {
		select {
		case err := <-locked:
			t.Fatalf("the waiter's Lock returned (%v) while the holder's session lives", err)
		case err := <-elected:
			t.Fatalf("the waiter's Campaign returned (%v) while the holder's session lives", err)
		case <-hs.Done():
			t.Fatalf("the holder's session ended %v after the kill", time.Since(killed))
		case <-time.After(250 * time.Millisecond):
		}
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		lock, lerr := checker.Get(cctx, hm.Key())
		leaderResp, eerr := checker.Get(cctx, electionName+"/", clientv3.WithFirstCreate()...)
		ccancel()
		if lerr != nil || eerr != nil {
			t.Logf("%v after the kill: %v, %v", time.Since(killed).Round(time.Millisecond), lerr, eerr)
			continue
		}
		if len(lock.Kvs) != 1 || lock.Kvs[0].CreateRevision != lockKV.CreateRevision || lock.Kvs[0].Lease != int64(hs.Lease()) {
			t.Fatalf("%v after the kill the holder's lock key %s is %v, expected: created at %d on lease %x", time.Since(killed), hm.Key(), lock.Kvs, lockKV.CreateRevision, hs.Lease())
		}
		if len(leaderResp.Kvs) != 1 || string(leaderResp.Kvs[0].Key) != he.Key() || string(leaderResp.Kvs[0].Value) != "holder" {
			t.Fatalf("%v after the kill the election's leader is %v, expected: %s=holder", time.Since(killed), leaderResp.Kvs, he.Key())
		}
		checks++
	}
	if checks == 0 {
		t.Fatalf("no read succeeded in the %ds after the kill", 3*ttl)
	}

	// The holder still holds, through its own client, now on a survivor.
	ttlResp, err := holderCli.TimeToLive(ctx, hs.Lease())
	if err != nil || ttlResp.TTL <= 0 {
		t.Fatalf("TimeToLive of the holder's lease after the failover: got = %v, %v, expected: a positive TTL", ttlResp, err)
	}
	r, err := holderCli.Txn(ctx).If(hm.IsOwner()).Then(clientv3.OpPut(fenced, "holder")).Commit()
	if err != nil || !r.Succeeded {
		t.Fatalf("a write guarded by the holder's IsOwner after the failover: got = %v, %v, expected: succeeded", r, err)
	}
	if err := he.Proclaim(ctx, "holder after failover"); err != nil {
		t.Fatalf("the leader's Proclaim after the failover: %v", err)
	}

	// A contender arriving after the kill is refused or waits too.
	late := newSession(t, etcdClient(c.Nodes[next].Etcd), ttl)
	if err := concurrency.NewMutex(late, lockName).TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock by a contender after the failover: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	lctx, lcancel := context.WithTimeout(ctx, time.Second)
	err = concurrency.NewElection(late, electionName).Campaign(lctx, "late")
	lcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign by a contender after the failover: got = %v, expected: %v", err, context.DeadlineExceeded)
	}

	// Letting go hands both to the waiter, which waited all along.
	if err := hm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := he.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{locked, elected} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("the waiter once the holder let go: %v", err)
			}
		case <-ctx.Done():
			t.Fatalf("the waiter never took over: %v", ctx.Err())
		}
	}
	resp, err := we.Leader(ctx)
	if err != nil || string(resp.Kvs[0].Value) != "waiter" {
		t.Fatalf("leader once the holder resigned: got = %v, %v, expected: waiter", resp, err)
	}
	if kv := getOne(ctx, t, waiterCli, wm.Key()); kv.CreateRevision <= lockKV.CreateRevision {
		t.Fatalf("the waiter's lock key was created at %d, not after the holder's %d", kv.CreateRevision, lockKV.CreateRevision)
	}
}

// etcdClusterVersion is the cluster version the etcd API's writes need
// (statemachine.Version, which this module cannot import: its go.sum
// covers the tests' imports, not the server's).
const etcdClusterVersion = 5

// waitEtcdWrites waits until every node has applied etcdClusterVersion:
// until then a Txn is refused with "etcdserver: not capable", a moment
// after the cluster has a leader and reports ready.
func waitEtcdWrites(ctx context.Context, t *testing.T, c *proccluster.Cluster) {
	t.Helper()
	for _, n := range c.Nodes {
		for {
			st, err := n.Status(ctx)
			if err == nil && st.GetClusterVersion() >= etcdClusterVersion {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("node %d: cluster version %d, waiting for %d: %v", n.Index, st.GetClusterVersion(), etcdClusterVersion, err)
			case <-time.After(25 * time.Millisecond):
			}
		}
	}
}

// getOne reads key, which must exist.
func getOne(ctx context.Context, t *testing.T, c *clientv3.Client, key string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := c.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("get %s: no such key", key)
	}
	return resp.Kvs[0]
}
