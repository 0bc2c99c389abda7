package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/linearizability"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// The etcd API's keys are as linearizable as the native API's: etcd's
// own client, on every node's etcd endpoint (so most calls reach a
// follower and are forwarded), puts, reads and compare-and-swaps
// through Txn while leaders are killed and nodes cut off, and porcupine
// checks the history.
func TestEtcdKVIsLinearizableAcrossLeaderKillsAndPartitions(t *testing.T) {
	skipShort(t)
	rounds := faultRounds(t, 2)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(rounds)*30*time.Second)
	defer cancel()

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	r := startEtcdRecorders(loadCtx, t, c, 8, 4)
	r.waitOps(ctx, t, 50)
	for round := 1; round <= rounds; round++ {
		leader := c.WaitLeader(ctx)
		c.Nodes[leader].Kill()
		next := c.WaitLeader(ctx, leader)
		r.waitOps(ctx, t, 50)
		c.Nodes[leader].Restart(ctx)

		c.Isolate(next)
		c.WaitLeader(ctx, next)
		r.waitOps(ctx, t, 50)
		c.Heal()
		r.waitOps(ctx, t, 50)
		t.Logf("round %d: killed leader %d, then cut off leader %d; %d operations so far", round, leader, next, r.ops.Load())
	}
	stopLoad()
	r.wg.Wait()
	ops := r.h.Operations()
	t.Logf("%d operations, %d of unknown outcome", len(ops), r.unknown.Load())
	dir, err := os.MkdirTemp("", "tenure-linearizability-")
	if err != nil {
		t.Fatal(err)
	}
	if res := linearizability.Check(linearizability.KVModel.ToModel(), ops, time.Minute, filepath.Join(dir, "etcd-kv.html")); res != porcupine.Ok {
		t.Fatalf("etcd API history of %d operations: got = %s, expected: Ok (see %s/etcd-kv.html)", len(ops), res, dir)
	}
	os.RemoveAll(dir)
}

type etcdRecorders struct {
	h       *linearizability.History
	wg      sync.WaitGroup
	ops     atomic.Int64
	unknown atomic.Int64
}

func startEtcdRecorders(ctx context.Context, t *testing.T, c *proccluster.Cluster, workers, keys int) *etcdRecorders {
	r := &etcdRecorders{h: linearizability.NewHistory()}
	for i := range workers {
		cl, err := clientv3.New(clientv3.Config{
			Endpoints:   c.EtcdEndpoints(i % len(c.Nodes)),
			DialTimeout: 3 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		key := fmt.Sprintf("etcd-lin/%d", i%keys)
		r.wg.Go(func() { r.run(ctx, cl, i, key) })
	}
	return r
}

func (r *etcdRecorders) run(ctx context.Context, cl *clientv3.Client, id int, key string) {
	last := ""
	for seq := 0; ctx.Err() == nil; seq++ {
		value := fmt.Sprintf("%d.%d", id, seq)
		callCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		switch rand.N(3) {
		case 0:
			done := r.h.Call(id, linearizability.KVInput{Op: linearizability.Put, Key: key, Value: value})
			_, err := cl.Put(callCtx, key, value)
			r.done(done, err, linearizability.KVOutput{})
		case 1:
			done := r.h.Call(id, linearizability.KVInput{Op: linearizability.Get, Key: key})
			res, err := cl.Get(callCtx, key)
			if err == nil {
				out := linearizability.KVOutput{}
				if len(res.Kvs) == 1 {
					out = linearizability.KVOutput{Found: true, Value: string(res.Kvs[0].Value)}
					last = out.Value
				}
				done(out)
				r.ops.Add(1)
			}
		case 2:
			done := r.h.Call(id, linearizability.KVInput{Op: linearizability.CompareAndSwap, Key: key, Expect: last, Value: value})
			res, err := cl.Txn(callCtx).
				If(clientv3.Compare(clientv3.Value(key), "=", last)).
				Then(clientv3.OpPut(key, value)).
				Else(clientv3.OpGet(key)).
				Commit()
			switch {
			case err == nil && res.Succeeded:
				done(linearizability.KVOutput{Swapped: true})
				r.ops.Add(1)
			case err == nil:
				if kvs := res.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
					last = string(kvs[0].Value)
				}
				done(linearizability.KVOutput{})
				r.ops.Add(1)
			default:
				r.done(done, err, linearizability.KVOutput{Swapped: true})
			}
		}
		cancel()
		pause(ctx, time.Duration(rand.N(10))*time.Millisecond)
	}
}

// done records a write: ok, or of unknown outcome for any error, since
// an etcd client cannot tell a write that was never applied from one
// whose answer was lost.
func (r *etcdRecorders) done(done func(any), err error, ok linearizability.KVOutput) {
	if err == nil {
		done(ok)
		r.ops.Add(1)
		return
	}
	r.unknown.Add(1)
	done(linearizability.KVOutput{Unknown: true})
}

// waitOps waits for more operations to succeed.
func (r *etcdRecorders) waitOps(ctx context.Context, t *testing.T, more int64) {
	t.Helper()
	want := r.ops.Load() + more
	for r.ops.Load() < want {
		if ctx.Err() != nil {
			t.Fatalf("the etcd workload made no progress: %d operations, waiting for %d", r.ops.Load(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
