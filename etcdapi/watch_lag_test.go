package etcdapi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

func TestWatchLeaseRevokeAndExpiryAreDeletes(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := testCtx(t)
	open := func() *statemachine.Session {
		res := f.apply(statemachine.OpenSession{Identity: "etcd", TTL: int64(time.Minute)})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		return res.Session
	}
	revoked, expired := open(), open()
	mustPut(t, ctx, c, "l/a", "1", clientv3.WithLease(clientv3.LeaseID(revoked.EtcdLeaseID())))
	mustPut(t, ctx, c, "l/b", "1", clientv3.WithLease(clientv3.LeaseID(revoked.EtcdLeaseID())))
	mustPut(t, ctx, c, "l/c", "1", clientv3.WithLease(clientv3.LeaseID(expired.EtcdLeaseID())))
	if res := f.apply(statemachine.Put{Key: "l/ttl", Value: "1", TTL: int64(time.Minute)}); res.Err != nil {
		t.Fatal(res.Err)
	}
	wch := watchCreated(t, ctx, c, "l/", clientv3.WithPrefix())

	res := f.apply(statemachine.CloseSession{SessionID: revoked.ID})
	r := res.KVRevision
	expectWatch(t, wch, fmt.Sprintf("@%d: DELETE l/a@%d, DELETE l/b@%d", r, r, r))
	f.expire(expired.ID)
	r++
	expectWatch(t, wch, fmt.Sprintf("@%d: DELETE l/c@%d", r, r))
	kv, _ := f.m.Key("l/ttl")
	f.apply(statemachine.ExpireKeys{Epoch: f.m.Epoch(), Keys: []statemachine.KeyTTL{{Key: "l/ttl", ModRevision: kv.ModRevision}}})
	r++
	expectWatch(t, wch, fmt.Sprintf("@%d: DELETE l/ttl@%d", r, r))
}

// A watcher the hub drops events for reads them from the history
// instead: nothing is lost, nothing comes twice.
func TestWatchThatLagsResyncsFromTheHistory(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	f.hub = watch.NewHub(4)
	c := serve(t, f)
	ctx := testCtx(t)
	wch := watchCreated(t, ctx, c, "g/", clientv3.WithPrefix())
	// One command of 10 events overruns the 4 the hub keeps.
	var ops []clientv3.Op
	var expected []string
	resp, err := c.Txn(ctx).Then(func() []clientv3.Op {
		for i := range 10 {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("g/%d", i), "v"))
		}
		return ops
	}()...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Header.Revision
	for i := range 10 {
		expected = append(expected, fmt.Sprintf("PUT g/%d=v@%d", i, r))
	}
	expectWatch(t, wch, fmt.Sprintf("@%d: %s", r, strings.Join(expected, ", ")))
	r2 := mustPut(t, ctx, c, "g/x", "v")
	expectWatch(t, wch, fmt.Sprintf("@%d: PUT g/x=v@%d", r2, r2))
}

// A watcher that lags past the compacted history is cancelled with the
// compact revision, as a watch from a compacted revision is.
func TestWatchThatLagsPastACompactionIsCancelled(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	f.hub = watch.NewHub(4)
	c := serve(t, f)
	ctx := testCtx(t)
	wch := watchCreated(t, ctx, c, "g/", clientv3.WithPrefix())
	// The compaction lands before the stream can read the history again.
	f.mu.Lock()
	var ops []statemachine.TxnOp
	for i := range 10 {
		ops = append(ops, statemachine.TxnOp{Type: statemachine.OpPut, Key: fmt.Sprintf("g/%d", i), Value: "v"})
	}
	var last statemachine.Result
	for _, cmd := range []statemachine.Command{
		statemachine.Txn{Success: ops},
		statemachine.Put{Key: "after", Value: "v"},
	} {
		last = f.m.Apply(time.Now().UnixNano(), cmd)
		f.hub.Publish(last.Events)
	}
	compacted := f.m.Apply(time.Now().UnixNano(), statemachine.Compact{Revision: last.KVRevision})
	f.mu.Unlock()
	if last.Err != nil || compacted.Err != nil {
		t.Fatal(last.Err, compacted.Err)
	}
	wr := expectWatch(t, wch, fmt.Sprintf("@0: compacted %d canceled", last.KVRevision))
	if !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
		t.Errorf("got = %v, expected: %v", wr.Err(), rpctypes.ErrCompacted)
	}
}

// stoppingBackend is a fake whose node stops when the test says.
type stoppingBackend struct {
	*fakeBackend
	stop chan struct{}
}

func (b stoppingBackend) Done() <-chan struct{} { return b.stop }

func TestWatchStreamsEndWhenTheNodeStops(t *testing.T) {
	noLeakAfter(t)
	b := stoppingBackend{fakeBackend: newFakeBackend(t), stop: make(chan struct{})}
	c := serve(t, b)
	ctx := testCtx(t)
	s := rawStream(t, ctx, c)
	s.create(&pb.WatchCreateRequest{Key: []byte("k")}, "@1: id 0 created")
	close(b.stop)
	_, err := s.Recv()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "etcdserver: server stopped") {
		t.Errorf("got = %v, expected: %v", err, rpctypes.ErrGRPCStopped)
	}
}
