package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/cluster"
)

// TestKVWatchResumesAcrossItsNodesRestartWhileWritesGoOn: a Go client's
// KV.Watch from a revision while writes go on; its node stops and starts
// again on its data dir, and the watch reconnects on its own while the
// writes resume. Every write is delivered once, in order, each with its
// own revision and value.
//
// A restarted node replays its log only as far as the commit index it
// wrote down at its last election, and learns the rest once it has
// elected itself again: for an election timeout or more its state is
// from before cluster version 5 was raised, when keys took the global
// revision, and the watch, back within its client's 10ms retry, was
// served on the global clock: from the wrong event, each labelled with
// its global revision. Sessions and grants move the global revision and
// not the keys', so the two clocks differ here as in any cluster that
// does more than write keys.
func TestKVWatchResumesAcrossItsNodesRestartWhileWritesGoOn(t *testing.T) {
	c := cluster.New(t, 1)
	n := c.Node(0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Keys take the KV revision from cluster version 5, which the leader
	// raises a moment after the members register.
	waitFor(t, ctx, "cluster version 5", func() bool {
		st, err := n.API().Cluster.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
		return err == nil && st.Msg.GetClusterVersion() >= 5
	})
	s := openSession(t, n, time.Minute)
	for i := range 3 {
		acquire(t, n, s, fmt.Sprint("grant-", i))
	}
	start, err := n.API().KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "w/start", Value: "-"}))
	if err != nil {
		t.Fatal(err)
	}
	wc, pc := retrying(t, n), retrying(t, n)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := wc.KV().Watch(wctx, "w/k", client.WithRevision(start.Msg.GetRevision()+1))

	// The writer: one write at a time, each revision kept for the check.
	const total = 90
	type write struct {
		rev   int64
		value string
	}
	writes := make(chan write, total)
	writerErr := make(chan error, 1)
	pause := make(chan struct{}) // closed once the node has stopped
	go func() {
		defer close(writes)
		for i := range total {
			if i == total/3 {
				select {
				case <-pause:
				case <-ctx.Done():
					writerErr <- ctx.Err()
					return
				}
			}
			v := fmt.Sprint(i)
			rev, err := pc.KV().Put(ctx, "w/k", v)
			if err != nil {
				writerErr <- fmt.Errorf("put %d: %w", i, err)
				return
			}
			writes <- write{rev, v}
		}
		writerErr <- nil
	}()

	i := 0
	check := func(w write) {
		t.Helper()
		var ev client.WatchEvent
		select {
		case ev = <-events:
		case <-ctx.Done():
			t.Fatalf("event %d: got = none before the test's deadline, expected: PUT at revision %d value %q", i, w.rev, w.value)
		}
		if ev.Err != nil || ev.Type != client.EventPut || ev.Revision != w.rev || ev.KV.ModRevision != w.rev || ev.KV.Value != w.value {
			t.Fatalf("event %d: got = %v at revision %d (mod revision %d) value %q, err %v; expected: PUT at revision %d value %q",
				i, ev.Type, ev.Revision, ev.KV.ModRevision, ev.KV.Value, ev.Err, w.rev, w.value)
		}
		i++
	}
	for range total / 3 {
		check(<-writes)
	}

	// The node goes, the writes wait for it, and it comes back.
	if err := c.Stop(n); err != nil {
		t.Fatal(err)
	}
	close(pause)
	if err := c.Restart(n); err != nil {
		t.Fatal(err)
	}
	for w := range writes {
		check(w)
	}
	if err := <-writerErr; err != nil {
		t.Fatal(err)
	}
	if i != total {
		t.Fatalf("got = %d events, expected: %d", i, total)
	}
}

// retrying is a Go client of n that retries every 10ms for 10s: it
// rides out a restart, and is back as soon as the node listens again.
func retrying(t testing.TB, n *cluster.Node) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), []string{n.URL()}, client.WithRetry(1000, 10*time.Millisecond), client.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
