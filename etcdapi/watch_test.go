package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/tenurehq/tenure/keyfeed"
	"github.com/tenurehq/tenure/statemachine"
)

// serveWatch is serve with a Watch service of the test's own settings
// beside the KV service.
func serveWatch(t *testing.T, b Backend, ws *watchServer) *clientv3.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterKVServer(gs, newKV(b))
	pb.RegisterWatchServer(gs, ws)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ln.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// watchCreated starts a watch and waits for the server to confirm it, so
// that writes after it are the watch's to see.
func watchCreated(t *testing.T, ctx context.Context, c *clientv3.Client, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	t.Helper()
	wch := c.Watch(ctx, key, append(opts, clientv3.WithCreatedNotify())...)
	if wr := nextWatch(t, wch); !wr.Created {
		t.Fatalf("got = %s, expected: the created response", showWatch(wr))
	}
	return wch
}

func nextWatch(t *testing.T, wch clientv3.WatchChan) clientv3.WatchResponse {
	t.Helper()
	select {
	case wr, ok := <-wch:
		if !ok {
			t.Fatal("the watch channel closed")
		}
		return wr
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response in 10s")
	}
	return clientv3.WatchResponse{}
}

// showWatch prints a response as "@rev: PUT k=v@mod (prev v), DELETE k@mod".
func showWatch(wr clientv3.WatchResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "@%d:", wr.Header.Revision)
	if wr.Created {
		b.WriteString(" created")
	}
	if wr.IsProgressNotify() {
		b.WriteString(" progress")
	}
	if wr.CompactRevision != 0 {
		fmt.Fprintf(&b, " compacted %d", wr.CompactRevision)
	}
	if wr.Canceled {
		b.WriteString(" canceled")
	}
	for i, ev := range wr.Events {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(" " + showEvent(ev))
	}
	return b.String()
}

func showEvent(ev *clientv3.Event) string {
	s := fmt.Sprintf("%s %s", ev.Type, ev.Kv.Key)
	if ev.Type == mvccpb.PUT {
		s += "=" + string(ev.Kv.Value)
	}
	s += fmt.Sprintf("@%d", ev.Kv.ModRevision)
	if ev.PrevKv != nil {
		s += fmt.Sprintf(" (prev %s@%d)", ev.PrevKv.Value, ev.PrevKv.ModRevision)
	}
	return s
}

func expectWatch(t *testing.T, wch clientv3.WatchChan, expected string) clientv3.WatchResponse {
	t.Helper()
	wr := nextWatch(t, wch)
	if got := showWatch(wr); got != expected {
		t.Fatalf("got = %q, expected: %q", got, expected)
	}
	return wr
}

func mustPut(t *testing.T, ctx context.Context, c *clientv3.Client, key, val string, opts ...clientv3.OpOption) int64 {
	t.Helper()
	resp, err := c.Put(ctx, key, val, opts...)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

func TestWatchKeyPrefixAndRangesShareOneStream(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	key := watchCreated(t, ctx, c, "b")
	prefix := watchCreated(t, ctx, c, "p/", clientv3.WithPrefix())
	between := watchCreated(t, ctx, c, "b", clientv3.WithRange("d"))
	from := watchCreated(t, ctx, c, "m", clientv3.WithFromKey())

	var revs []int64
	for _, k := range []string{"a", "b", "c", "d", "m", "p", "p/1", "z"} {
		revs = append(revs, mustPut(t, ctx, c, k, "v"))
	}
	if _, err := c.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	del := revs[len(revs)-1] + 1
	expectWatch(t, key, fmt.Sprintf("@%d: PUT b=v@%d", revs[1], revs[1]))
	expectWatch(t, key, fmt.Sprintf("@%d: DELETE b@%d", del, del))
	expectWatch(t, prefix, fmt.Sprintf("@%d: PUT p/1=v@%d", revs[6], revs[6]))
	expectWatch(t, between, fmt.Sprintf("@%d: PUT b=v@%d", revs[1], revs[1]))
	expectWatch(t, between, fmt.Sprintf("@%d: PUT c=v@%d", revs[2], revs[2]))
	expectWatch(t, between, fmt.Sprintf("@%d: DELETE b@%d", del, del))
	for _, i := range []int{4, 5, 6, 7} {
		expectWatch(t, from, fmt.Sprintf("@%d: PUT %s=v@%d", revs[i], []string{"a", "b", "c", "d", "m", "p", "p/1", "z"}[i], revs[i]))
	}
}

func TestWatchManyWatchesOnOneStream(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	const n = 100
	var chans []clientv3.WatchChan
	var ops []clientv3.Op
	for i := range n {
		k := fmt.Sprintf("k%03d", i)
		chans = append(chans, watchCreated(t, ctx, c, k))
		ops = append(ops, clientv3.OpPut(k, "v"))
	}
	resp, err := c.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision
	for i, wch := range chans {
		expectWatch(t, wch, fmt.Sprintf("@%d: PUT k%03d=v@%d", rev, i, rev))
	}
}

func TestWatchTxnEventsShareOneResponseInOrder(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	mustPut(t, ctx, c, "t/c", "old")
	wch := watchCreated(t, ctx, c, "t/", clientv3.WithPrefix())
	// The last write is not the watch's: the stream learns the command is
	// whole all the same.
	resp, err := c.Txn(ctx).Then(clientv3.OpPut("t/b", "1"), clientv3.OpDelete("t/c"), clientv3.OpPut("t/a", "2"), clientv3.OpPut("u", "3")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Header.Revision
	expectWatch(t, wch, fmt.Sprintf("@%d: PUT t/b=1@%d, DELETE t/c@%d, PUT t/a=2@%d", r, r, r, r))
}

func TestWatchFromARevision(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	r1 := mustPut(t, ctx, c, "k", "1")
	r2 := mustPut(t, ctx, c, "k", "2")
	mustPut(t, ctx, c, "other", "x")
	dresp, err := c.Delete(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	r4 := dresp.Header.Revision

	t.Run("the past comes in one response at the current revision, then the present", func(t *testing.T) {
		wch := c.Watch(ctx, "k", clientv3.WithRev(r1), clientv3.WithPrevKV())
		expectWatch(t, wch, fmt.Sprintf("@%d: PUT k=1@%d, PUT k=2@%d (prev 1@%d), DELETE k@%d (prev 2@%d)", r4, r1, r2, r1, r4, r2))
		r5 := mustPut(t, ctx, c, "k", "3")
		expectWatch(t, wch, fmt.Sprintf("@%d: PUT k=3@%d", r5, r5))
	})
	t.Run("a start revision still to come waits for it", func(t *testing.T) {
		now, err := c.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		start := now.Header.Revision + 2
		wch := c.Watch(ctx, "k", clientv3.WithRev(start))
		mustPut(t, ctx, c, "k", "early")
		r := mustPut(t, ctx, c, "k", "due")
		if r != start {
			t.Fatalf("got = revision %d, expected: %d", r, start)
		}
		expectWatch(t, wch, fmt.Sprintf("@%d: PUT k=due@%d", r, r))
	})
}

// Watches started from past revisions while writes go on see every
// revision once, whether it came from the history or live.
func TestWatchJoinsHistoryAndLiveEventsWithoutGapsOrDuplicates(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := testCtx(t)
	const writes = 2000
	written := make(chan struct{})
	go func() {
		defer close(written)
		for i := range writes {
			f.apply(statemachine.Put{Key: "j", Value: fmt.Sprint(i)})
		}
	}()
	kvRevision := func() int64 {
		var rev int64
		_ = f.Read(ctx, true, func(m *statemachine.Machine) error {
			rev = m.KVRevision()
			return nil
		})
		return rev
	}
	type started struct {
		start int64
		wch   clientv3.WatchChan
	}
	var watches []started
	for i := range 20 {
		start := max(kvRevision()-int64(i%4)*3, 2)
		if i%5 == 4 {
			start = 0 // from now
		}
		watches = append(watches, started{start, c.Watch(ctx, "j", clientv3.WithRev(start))})
		time.Sleep(time.Millisecond) // spread the starts over the writes
	}
	<-written
	// Every watch has this one to see, those from now too.
	last := f.apply(statemachine.Put{Key: "j", Value: "last"}).KVRevision
	for _, w := range watches {
		expected := w.start
		for expected <= last {
			wr := nextWatch(t, w.wch)
			for _, ev := range wr.Events {
				if expected == 0 {
					expected = ev.Kv.ModRevision
				}
				if ev.Kv.ModRevision != expected {
					t.Fatalf("watch from %d: got = revision %d, expected: %d", w.start, ev.Kv.ModRevision, expected)
				}
				expected++
			}
		}
	}
}

// As etcd, a watch catching up gets at most 1000 revisions a response,
// each at the revision current when it was read.
func TestWatchCatchingUpIsSentInBatches(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := testCtx(t)
	for i := range 2500 {
		f.apply(statemachine.Put{Key: "h", Value: fmt.Sprint(i)})
	}
	// More than one read's worth of history the watch has no part in.
	for i := range keyfeed.MaxScan + 1000 {
		f.apply(statemachine.Put{Key: "x", Value: fmt.Sprint(i)})
	}
	last := f.apply(statemachine.Put{Key: "h", Value: "last"}).KVRevision
	wch := c.Watch(ctx, "h", clientv3.WithRev(2))
	var sizes []int
	next := int64(2)
	for next <= last {
		wr := nextWatch(t, wch)
		if wr.Header.Revision != last {
			t.Errorf("got = header revision %d, expected: %d", wr.Header.Revision, last)
		}
		sizes = append(sizes, len(wr.Events))
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision != next {
				t.Fatalf("got = revision %d, expected: %d", ev.Kv.ModRevision, next)
			}
			next = ev.Kv.ModRevision + 1
			if next == 2502 {
				next = last
			}
		}
	}
	if got, expected := fmt.Sprint(sizes), "[1000 1000 500 1]"; got != expected {
		t.Errorf("got = responses of %s events, expected: %s", got, expected)
	}
}

func TestWatchFromACompactedRevisionIsCancelled(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	r1 := mustPut(t, ctx, c, "k", "1")
	r2 := mustPut(t, ctx, c, "k", "2")
	if _, err := c.Compact(ctx, r2); err != nil {
		t.Fatal(err)
	}
	wch := c.Watch(ctx, "k", clientv3.WithRev(r1))
	wr := expectWatch(t, wch, fmt.Sprintf("@0: compacted %d canceled", r2))
	if !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
		t.Errorf("got = %v, expected: %v", wr.Err(), rpctypes.ErrCompacted)
	}
	if _, ok := <-wch; ok {
		t.Error("the channel of a compacted watch stays open")
	}
	// The compact revision itself is still kept.
	expectWatch(t, c.Watch(ctx, "k", clientv3.WithRev(r2)), fmt.Sprintf("@%d: PUT k=2@%d", r2, r2))
}

func TestWatchPrevKVAndFilters(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)
	prev := watchCreated(t, ctx, c, "k", clientv3.WithPrevKV())
	noPut := watchCreated(t, ctx, c, "k", clientv3.WithFilterPut())
	noDelete := watchCreated(t, ctx, c, "k", clientv3.WithFilterDelete())
	r1 := mustPut(t, ctx, c, "k", "1")
	r2 := mustPut(t, ctx, c, "k", "2")
	dresp, err := c.Delete(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	r3 := dresp.Header.Revision
	expectWatch(t, prev, fmt.Sprintf("@%d: PUT k=1@%d", r1, r1))
	expectWatch(t, prev, fmt.Sprintf("@%d: PUT k=2@%d (prev 1@%d)", r2, r2, r1))
	expectWatch(t, prev, fmt.Sprintf("@%d: DELETE k@%d (prev 2@%d)", r3, r3, r2))
	expectWatch(t, noPut, fmt.Sprintf("@%d: DELETE k@%d", r3, r3))
	expectWatch(t, noDelete, fmt.Sprintf("@%d: PUT k=1@%d", r1, r1))
	expectWatch(t, noDelete, fmt.Sprintf("@%d: PUT k=2@%d", r2, r2))
}

func TestWatchCancel(t *testing.T) {
	noLeakAfter(t)
	c := serve(t, newFakeBackend(t))
	ctx := testCtx(t)

	wctx, cancel := context.WithCancel(ctx)
	wch := watchCreated(t, wctx, c, "k")
	cancel()
	for range wch {
	}

	s := rawStream(t, ctx, c)
	s.create(&pb.WatchCreateRequest{Key: []byte("k")}, "@1: id 0 created")
	s.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 0}}})
	s.expect("@1: id 0 canceled")
	// etcd answers nothing for a watch it does not know.
	s.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 7}}})
	s.create(&pb.WatchCreateRequest{Key: []byte("j")}, "@1: id 1 created")
	r := mustPut(t, ctx, c, "k", "1")
	r2 := mustPut(t, ctx, c, "j", "1")
	s.expect(fmt.Sprintf("@%d: id 1 PUT j=1@%d", r2, r2))
	s.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
	s.expect(fmt.Sprintf("@%d: id -1", r+1))
}

func TestWatchCreateRequestsEtcdRefuses(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := testCtx(t)
	s := rawStream(t, ctx, c)
	s.create(&pb.WatchCreateRequest{Key: []byte("a"), WatchId: 1}, "@1: id 1 created")
	s.create(&pb.WatchCreateRequest{Key: []byte("b"), WatchId: 1}, "@1: id -1 created canceled (mvcc: duplicate watch ID provided on the WatchStream)")
	// The server picks the lowest IDs not taken.
	s.create(&pb.WatchCreateRequest{Key: []byte("b")}, "@1: id 0 created")
	s.create(&pb.WatchCreateRequest{Key: []byte("b")}, "@1: id 2 created")
	s.create(&pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("a")}, "@1: id -1 created canceled (mvcc: watcher range is empty)")
	s.create(&pb.WatchCreateRequest{Key: []byte("b"), StartRevision: -1}, "@1: id -1 created canceled (etcdserver: mvcc: required revision has been compacted)")
	f.deny = true
	s.create(&pb.WatchCreateRequest{Key: []byte("b")}, "@1: id -1 created canceled ("+rpctypes.ErrGRPCPermissionDenied.Error()+")")
}

func TestWatchFragments(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	ws := newWatch(f)
	ws.maxResponseBytes = 300
	c := serveWatch(t, f, ws)
	ctx := testCtx(t)
	s := rawStream(t, ctx, c)
	s.create(&pb.WatchCreateRequest{Key: []byte("f/"), RangeEnd: []byte("f0"), Fragment: true}, "@1: id 0 created")
	s.create(&pb.WatchCreateRequest{Key: []byte("f/"), RangeEnd: []byte("f0")}, "@1: id 1 created")
	big := strings.Repeat("v", 100)
	var ops []clientv3.Op
	for i := range 5 {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("f/%d", i), big))
	}
	if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for {
		wr := s.recv()
		if wr.WatchId != 0 {
			if len(wr.Events) != 5 || wr.Fragment {
				t.Errorf("got = %d events (fragment %v) for the watch without fragment, expected: 5 in one response", len(wr.Events), wr.Fragment)
			}
			continue
		}
		sizes = append(sizes, len(wr.Events))
		if !wr.Fragment {
			break
		}
	}
	if got, expected := fmt.Sprint(sizes), "[2 2 1]"; got != expected {
		t.Errorf("got = fragments of %s events, expected: %s", got, expected)
	}
	// clientv3 puts the fragments back together.
	wch := c.Watch(ctx, "f/", clientv3.WithPrefix(), clientv3.WithRev(2), clientv3.WithFragment())
	if wr := nextWatch(t, wch); len(wr.Events) != 5 {
		t.Errorf("got = %d events, expected: 5", len(wr.Events))
	}
}
