package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// Requests as large as etcd takes (1.5 MiB) on three tenure processes:
// puts at the limit sent to a follower are forwarded, commit and reach
// every node over the peer transport; a linearizable Range through a
// follower brings back more than gRPC's default 4 MiB; a request a byte
// over the limit is refused by the follower, changing nothing; and a
// node restarted behind the leader's log catches up from a snapshot
// holding many such values, every byte of them.
func TestEtcdRequestsOfEtcdsSizeOnAClusterOfProcesses(t *testing.T) {
	skipShort(t)
	// A snapshot every 8 entries, keeping 2 behind it: a node down for
	// a few writes is sent the snapshot, not the log.
	c := proccluster.Start(t, 3, "--snapshot-threshold", "8", "--catch-up-entries", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader := c.WaitLeader(ctx)
	follower, other := c.Nodes[(leader+1)%3], c.Nodes[(leader+2)%3]
	fc := etcdClientOf(t, follower)
	r := rand.NewChaCha8([32]byte{28, 5})
	limit := etcdapi.DefaultMaxRequestBytes

	want := map[string]string{}
	put := func(key string, entry int) {
		t.Helper()
		value := valueOfEntry(r, key, entry)
		// With one of three nodes down and 1.5 MiB entries synced on a
		// loaded machine, an election can come between two puts: the
		// put is retried as a client would (it is the same value, so a
		// put whose outcome was unknown is retried safely).
		for {
			_, err := fc.Put(ctx, key, value)
			if err == nil {
				break
			}
			if !errors.Is(err, rpctypes.ErrNoLeader) && !errors.Is(err, rpctypes.ErrLeaderChanged) || ctx.Err() != nil {
				t.Fatalf("put of %s (an entry of %d bytes) through follower %d: %v", key, entry, follower.Index, err)
			}
			t.Logf("put of %s: %v; retrying", key, err)
			time.Sleep(100 * time.Millisecond)
		}
		want[key] = value
	}
	readAll := func(cl *clientv3.Client, opts ...clientv3.OpOption) {
		t.Helper()
		resp, err := cl.Get(ctx, "/big/", append(opts, clientv3.WithPrefix())...)
		if err != nil {
			t.Fatalf("range of /big/: %v", err)
		}
		if len(resp.Kvs) != len(want) {
			t.Fatalf("range of /big/: got %d keys, expected: %d", len(resp.Kvs), len(want))
		}
		for _, kv := range resp.Kvs {
			if string(kv.Value) != want[string(kv.Key)] {
				t.Fatalf("range of /big/: %s did not read back byte for byte", kv.Key)
			}
		}
	}

	for i := range 4 {
		put(fmt.Sprintf("/big/%02d", i), limit)
	}
	// 6 MiB in one answer, forwarded from the leader.
	readAll(fc)
	rev, err := fc.Get(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Put(ctx, "/big/over", valueOfEntry(r, "/big/over", limit+1)); !errors.Is(err, rpctypes.ErrRequestTooLarge) {
		t.Fatalf("a put a byte over the limit through follower %d: got = %v, expected: %v", follower.Index, err, rpctypes.ErrRequestTooLarge)
	}
	c.WaitCaughtUp(ctx)
	for _, n := range c.Nodes {
		cl := etcdClientOf(t, n)
		readAll(cl, clientv3.WithSerializable())
		got, err := cl.Get(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
		if err != nil || got.Header.Revision != rev.Header.Revision {
			t.Fatalf("node %d: revision got = %v (%v), expected: %d, the refused put changing nothing", n.Index, got, err, rev.Header.Revision)
		}
	}

	// Node other misses 12 writes, more than a snapshot's worth and far
	// more than the 2 entries kept behind it: it is sent a snapshot of
	// some 24 MiB.
	other.Kill()
	for i := 4; i < 16; i++ {
		put(fmt.Sprintf("/big/%02d", i), limit)
	}
	other.Restart(ctx)
	c.WaitCaughtUp(ctx)
	readAll(etcdClientOf(t, other), clientv3.WithSerializable())
}

func etcdClientOf(t *testing.T, n *proccluster.Node) *clientv3.Client {
	t.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{n.Etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// valueOfEntry is a random value that makes a put of key an entry of
// size bytes, as etcd counts it against --max-request-bytes.
func valueOfEntry(r *rand.ChaCha8, key string, size int) string {
	n := size
	for {
		got, _ := etcdapi.EntrySize(&pb.PutRequest{Key: []byte(key), Value: make([]byte, n)})
		if got == size {
			b := make([]byte, n)
			_, _ = r.Read(b)
			return string(b)
		}
		n -= got - size
	}
}
