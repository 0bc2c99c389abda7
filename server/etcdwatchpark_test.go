package server

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// pumpGoroutines counts the goroutines of this process that serve one
// etcd watch each (etcdapi's pump).
func pumpGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("etcdapi.(*watchStream).pump("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestIdleEtcdWatchesHoldNoGoroutine: an etcd watch with nothing to send
// keeps no goroutine on the server (one each cost about 4 KiB of stack,
// more than the rest of the watch), and still gets every event of its
// key as it comes, a prefix watch beside it every event of its keys in
// order, and each of them a progress notification when the client asks.
func TestIdleEtcdWatchesHoldNoGoroutine(t *testing.T) {
	_, c := etcdNode(t, t.TempDir())
	ctx := ctxT(t)
	const n = 300
	watches := make([]clientv3.WatchChan, n)
	for i := range n {
		watches[i] = c.Watch(ctx, fmt.Sprintf("idle/%03d", i), clientv3.WithCreatedNotify())
		if r := <-watches[i]; !r.Created {
			t.Fatalf("watch %d: got = %+v, expected: created", i, r)
		}
	}
	prefix := c.Watch(ctx, "idle/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-prefix
	waitFor(t, "every idle watch to park", func() bool { return pumpGoroutines() == 0 })

	next := func(ch clientv3.WatchChan, what string) clientv3.WatchResponse {
		t.Helper()
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("%s: the watch ended", what)
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing in 10 s", what)
		}
		panic("unreachable")
	}
	for round := range 3 {
		for i := 0; i < n; i += 7 {
			if _, err := c.Put(ctx, fmt.Sprintf("idle/%03d", i), fmt.Sprint(round)); err != nil {
				t.Fatal(err)
			}
		}
		var last int64
		for i := 0; i < n; i += 7 {
			key, value := fmt.Sprintf("idle/%03d", i), fmt.Sprint(round)
			r := next(watches[i], key)
			if len(r.Events) != 1 || string(r.Events[0].Kv.Key) != key || string(r.Events[0].Kv.Value) != value {
				t.Fatalf("watch of %s, round %d: got = %+v, expected: one put of %q", key, round, r.Events, value)
			}
			r = next(prefix, "the prefix watch")
			if len(r.Events) != 1 || string(r.Events[0].Kv.Key) != key || r.Events[0].Kv.ModRevision <= last {
				t.Fatalf("prefix watch, round %d: got = %+v, expected: the put of %s, after revision %d", round, r.Events, key, last)
			}
			last = r.Events[0].Kv.ModRevision
		}
		waitFor(t, "the watches to park again", func() bool { return pumpGoroutines() == 0 })
	}

	// A progress request is answered through every watch of the stream,
	// parked ones too.
	if err := c.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 7, n - 1} {
		if r := next(watches[i], fmt.Sprintf("progress on watch %d", i)); !r.IsProgressNotify() {
			t.Fatalf("watch %d: got = %+v, expected: a progress notification", i, r)
		}
	}
}
