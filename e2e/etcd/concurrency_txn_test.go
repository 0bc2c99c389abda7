//go:build linux

package etcd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Concurrent STM transactions increment counters. With the isolation
// levels that check what they read (all but ReadCommitted) workers share
// the counters and a total, and no increment is lost: the counters add up
// to the number of commits, and so does the total. The serializable
// levels read one revision, so every attempt, committed or retried, sees
// counters that add up to the total. ReadCommitted makes no check at all
// (etcd's STM commits its writes unconditionally), so there each worker
// increments a counter of its own.
func testSTM(t *testing.T, tg target, name string, level concurrency.Isolation) {
	const workers, commits, counters = 4, 8, 3
	prefix := "stm/" + name + "/"
	total := prefix + "total"
	counter := func(i int) string { return fmt.Sprintf("%sc%d", prefix, i) }
	shared := level != concurrency.ReadCommitted
	snapshot := level == concurrency.SerializableSnapshot || level == concurrency.Serializable
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var attempts atomic.Int64
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, tg)
		wg.Go(func() {
			errc <- func() error {
				for range commits {
					var skew error
					_, err := concurrency.NewSTM(c, func(stm concurrency.STM) error {
						attempts.Add(1)
						if !shared {
							k := counter(w)
							stm.Put(k, strconv.Itoa(atoi(stm.Get(k))+1))
							return nil
						}
						sum, tot := 0, atoi(stm.Get(total))
						for i := range counters {
							sum += atoi(stm.Get(counter(i)))
						}
						if snapshot && sum != tot {
							skew = fmt.Errorf("an attempt read counters adding up to %d beside a total of %d", sum, tot)
						}
						k := counter(rand.N(counters))
						stm.Put(k, strconv.Itoa(atoi(stm.Get(k))+1))
						stm.Put(total, strconv.Itoa(tot+1))
						return nil
					}, concurrency.WithIsolation(level), concurrency.WithAbortContext(ctx))
					if err != nil {
						return fmt.Errorf("worker %d: STM: %w", w, err)
					}
					if skew != nil {
						return skew
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	c := newClient(t, tg)
	n := counters
	if !shared {
		n = workers
	}
	sum := 0
	for i := range n {
		resp, err := c.Get(ctx, counter(i))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 {
			sum += atoi(string(resp.Kvs[0].Value))
		}
	}
	if sum != workers*commits {
		t.Errorf("counters add up to %d, expected: %d commits", sum, workers*commits)
	}
	if shared {
		resp, err := c.Get(ctx, total)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || atoi(string(resp.Kvs[0].Value)) != workers*commits {
			t.Errorf("total: got = %v, expected: %d", resp.Kvs, workers*commits)
		}
	}
	t.Logf("%d commits in %d attempts", workers*commits, attempts.Load())
}

// atoi reads a counter; an absent key (STM's Get answers "") is 0.
func atoi(s string) int {
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(fmt.Sprintf("counter %q: %v", s, err))
	}
	return n
}

// Compare-and-swap with a plain Txn: concurrent increments conditioned on
// the key's mod revision lose none, a refused one answers the current
// value from its Else branch, and of concurrent creators conditioned on
// create revision 0 exactly one succeeds.
func testTxnCAS(t *testing.T, tg target) {
	const workers, increments = 4, 10
	const key, created = "cas/counter", "cas/created"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var won, refused atomic.Int32
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, tg)
		wg.Go(func() {
			errc <- func() error {
				r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(created), "=", 0)).
					Then(clientv3.OpPut(created, strconv.Itoa(w))).Commit()
				if err != nil {
					return err
				}
				if r.Succeeded {
					won.Add(1)
				}
				resp, err := c.Get(ctx, key)
				if err != nil {
					return err
				}
				value, rev := 0, int64(0)
				if len(resp.Kvs) == 1 {
					value, rev = atoi(string(resp.Kvs[0].Value)), resp.Kvs[0].ModRevision
				}
				for done := 0; done < increments; {
					r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
						Then(clientv3.OpPut(key, strconv.Itoa(value+1))).
						Else(clientv3.OpGet(key)).Commit()
					if err != nil {
						return err
					}
					if r.Succeeded {
						done++
						value, rev = value+1, r.Header.Revision
						continue
					}
					refused.Add(1)
					kvs := r.Responses[0].GetResponseRange().Kvs
					if len(kvs) != 1 || kvs[0].ModRevision == rev {
						return fmt.Errorf("a refused swap's Else read %v, expected: the key at another mod revision than %d", kvs, rev)
					}
					value, rev = atoi(string(kvs[0].Value)), kvs[0].ModRevision
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	if n := won.Load(); n != 1 {
		t.Errorf("creators conditioned on create revision 0 that succeeded: got = %d, expected: 1", n)
	}
	resp, err := newClient(t, tg).Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || atoi(string(resp.Kvs[0].Value)) != workers*increments {
		t.Fatalf("counter: got = %v, expected: %d", resp.Kvs, workers*increments)
	}
	if resp.Kvs[0].Version != workers*increments {
		t.Errorf("counter's version: got = %d, expected: %d", resp.Kvs[0].Version, workers*increments)
	}
	t.Logf("%d swaps, %d refused", workers*increments, refused.Load())
}
