package etcdapi

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rawWatch is a Watch stream without clientv3, to see each response as
// the server sends it.
type rawWatch struct {
	pb.Watch_WatchClient
	t *testing.T
}

func rawStream(t *testing.T, ctx context.Context, c *clientv3.Client) rawWatch {
	t.Helper()
	s, err := pb.NewWatchClient(c.ActiveConnection()).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return rawWatch{Watch_WatchClient: s, t: t}
}

func (s rawWatch) send(req *pb.WatchRequest) {
	s.t.Helper()
	if err := s.Send(req); err != nil {
		s.t.Fatal(err)
	}
}

func (s rawWatch) create(cr *pb.WatchCreateRequest, expected string) {
	s.t.Helper()
	s.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}})
	s.expect(expected)
}

func (s rawWatch) recv() *pb.WatchResponse {
	s.t.Helper()
	wr, err := s.Recv()
	if err != nil {
		s.t.Fatal(err)
	}
	return wr
}

// expect checks the next response, shown as
// "@rev: id N created canceled (reason) PUT k=v@mod".
func (s rawWatch) expect(expected string) {
	s.t.Helper()
	wr := s.recv()
	got := fmt.Sprintf("@%d: id %d", wr.Header.Revision, wr.WatchId)
	if wr.Created {
		got += " created"
	}
	if wr.Canceled {
		got += " canceled"
	}
	if wr.CancelReason != "" {
		got += " (" + wr.CancelReason + ")"
	}
	for _, ev := range wr.Events {
		got += " " + showEvent((*clientv3.Event)(ev))
	}
	if got != expected {
		s.t.Fatalf("got = %q, expected: %q", got, expected)
	}
}

// Each watch holds one of the caller's and the node's open-watch slots,
// as a native watch does: past the limit a create is refused, and a
// cancelled watch or a closed stream gives its slot back.
func TestWatchHoldsAWatchSlot(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	f.maxWatches = 2
	c := serve(t, f)
	ctx := testCtx(t)
	ctxA, cancelA := context.WithCancel(ctx)
	watchCreated(t, ctxA, c, "a")
	watchCreated(t, ctx, c, "b")
	wch := c.Watch(ctx, "c", clientv3.WithCreatedNotify())
	wr := nextWatch(t, wch)
	if !wr.Canceled || wr.Err() == nil || !strings.Contains(wr.Err().Error(), "too many watches") {
		t.Fatalf("a third watch over a limit of 2: got = %s (%v), expected: cancelled, naming the limit", showWatch(wr), wr.Err())
	}
	cancelA()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		n := f.watches
		f.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open watches after one was cancelled: got = %d, expected: 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	watchCreated(t, ctx, c, "d")
}
