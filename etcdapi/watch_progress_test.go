package etcdapi

import (
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestWatchProgressRequest(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	wch := watchCreated(t, ctx, c, "k")
	r := mustPut(t, ctx, c, "k", "1")
	mustPut(t, ctx, c, "other", "1")
	if err := c.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	// Every event up to the progress revision comes before it.
	expectWatch(t, wch, fmt.Sprintf("@%d: PUT k=1@%d", r, r))
	expectWatch(t, wch, fmt.Sprintf("@%d: progress", r+1))
}

// A progress request for the stream waits for every watch on it: each
// is sent its events up to the revision first, whichever feed is behind.
func TestWatchProgressRequestWaitsForEveryWatch(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := testCtx(t)
	s := rawStream(t, ctx, c)
	s.create(&pb.WatchCreateRequest{Key: []byte("a")}, "@1: id 0 created")
	s.create(&pb.WatchCreateRequest{Key: []byte("b")}, "@1: id 1 created")
	var evs []string
	for i := range 20 {
		k := []string{"a", "b"}[i%2]
		r := mustPut(t, ctx, c, k, fmt.Sprint(i))
		evs = append(evs, fmt.Sprintf("@%d: id %d PUT %s=%d@%d", r, i%2, k, i, r))
	}
	last := mustPut(t, ctx, c, "other", "x")
	s.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
	got := map[string]bool{}
	for range evs {
		wr := s.recv()
		if len(wr.Events) != 1 {
			t.Fatalf("got = a response of %d events (watch %d, revision %d) before every event, expected: the events first", len(wr.Events), wr.WatchId, wr.Header.Revision)
		}
		ev := wr.Events[0]
		got[fmt.Sprintf("@%d: id %d PUT %s=%s@%d", wr.Header.Revision, wr.WatchId, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision)] = true
	}
	for _, e := range evs {
		if !got[e] {
			t.Errorf("got = no %q, expected: it before the progress response", e)
		}
	}
	s.expect(fmt.Sprintf("@%d: id -1", last))
}

func TestWatchProgressNotify(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	ws := newWatch(f)
	ws.progressInterval = 20 * time.Millisecond
	c := serveWatch(t, f, ws)
	ctx := testCtx(t)
	r := mustPut(t, ctx, c, "other", "1")
	wch := c.Watch(ctx, "k", clientv3.WithProgressNotify())
	expectWatch(t, wch, fmt.Sprintf("@%d: progress", r))
}
