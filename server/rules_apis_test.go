package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/statemachine"
)

// putAsNode writes key through the log as the node itself.
func (n *rulesNode) putAsNode(ctx context.Context, key, value string) error {
	_, err := n.node.Propose(ctx, statemachine.Put{Key: key, Value: value})
	return err
}

// The native API, through its Connect clients.
type nativeRuleAPI struct {
	t *testing.T
	n *rulesNode
}

func newNativeRuleAPI(t *testing.T, n *rulesNode) ruleAPI { return &nativeRuleAPI{t, n} }

func (a *nativeRuleAPI) http(who string) *http.Client {
	tok := a.n.tokens[who]
	tr := &http.Transport{}
	a.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+tok)
		return tr.RoundTrip(r)
	})}
}

func (a *nativeRuleAPI) sessions(who string) tenurev1connect.SessionServiceClient {
	return tenurev1connect.NewSessionServiceClient(a.http(who), a.n.native)
}

func (a *nativeRuleAPI) leases(who string) tenurev1connect.LeaseServiceClient {
	return tenurev1connect.NewLeaseServiceClient(a.http(who), a.n.native)
}

func (a *nativeRuleAPI) kv(who string) tenurev1connect.KVServiceClient {
	return tenurev1connect.NewKVServiceClient(a.http(who), a.n.native)
}

func (a *nativeRuleAPI) OpenSession(ctx context.Context, who string) (int64, error) {
	r, err := a.sessions(who).Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(30 * time.Second)}))
	if err != nil {
		return 0, err
	}
	return r.Msg.GetSession().GetId(), nil
}

func (a *nativeRuleAPI) CloseSession(ctx context.Context, who string, id int64) error {
	_, err := a.sessions(who).Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: id}))
	return err
}

func (a *nativeRuleAPI) PutBound(ctx context.Context, who, key string, id int64) error {
	_, err := a.kv(who).Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: "x", SessionId: id}))
	return err
}

func (a *nativeRuleAPI) Put(ctx context.Context, who, key, value string) error {
	_, err := a.kv(who).Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: value}))
	return err
}

func (a *nativeRuleAPI) PutMethod() string { return tenurev1connect.KVServicePutProcedure }

func nativeLease(name string) (string, string) {
	ns, n, _ := strings.Cut(name, "/")
	return ns, n
}

func (a *nativeRuleAPI) Hold(ctx context.Context, who, name string, id int64) error {
	ns, nm := nativeLease(name)
	r, err := a.leases(who).Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{Namespace: ns, Name: nm, SessionId: id}))
	if err == nil && !r.Msg.GetAcquired() {
		return fmt.Errorf("%s is held by someone else", name)
	}
	return err
}

func (a *nativeRuleAPI) Wait(ctx context.Context, who, name string, id int64) error {
	ns, nm := nativeLease(name)
	_, err := a.leases(who).Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{
		Namespace: ns, Name: nm, SessionId: id, Wait: true, WaitTimeout: durationpb.New(time.Minute),
	}))
	return err
}

// Watch opens the stream on its own goroutine: the server answers its
// headers with the first event, and a refusal ends the stream.
func (a *nativeRuleAPI) Watch(ctx context.Context, who, prefix string) (<-chan string, <-chan error, error) {
	// From the next KV revision, named: a watch from "now" would begin
	// wherever the server happened to open it, and on a loaded machine
	// that was after the put the rule then waited for.
	var next int64
	if err := a.n.read(ctx, false, func(m *statemachine.Machine) error { next = m.KVRevision() + 1; return nil }); err != nil {
		return nil, nil, err
	}
	values, ended := make(chan string, 16), make(chan error, 1)
	go func() {
		stream, err := a.kv(who).Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: prefix, Prefix: true, StartRevision: next}))
		if err != nil {
			ended <- err
			return
		}
		defer stream.Close()
		for stream.Receive() {
			if kv := stream.Msg().GetKv(); kv != nil && stream.Msg().GetType() == tenurev1.WatchEventType_WATCH_EVENT_TYPE_PUT {
				values <- kv.GetValue()
			}
		}
		ended <- stream.Err()
	}()
	return values, ended, nil
}

func (a *nativeRuleAPI) Sees(ctx context.Context, who string, id int64) (bool, bool, error) {
	_, err := a.sessions(who).Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id}))
	alone := err == nil
	if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		return false, false, err
	}
	r, err := a.sessions(who).List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{}))
	if err != nil {
		return false, false, err
	}
	for _, s := range r.Msg.GetSessions() {
		if s.GetId() == id {
			return alone, true, nil
		}
	}
	return alone, false, nil
}

// etcd's API, through clientv3, logged in with each principal's token.
type etcdRuleAPI struct {
	t       *testing.T
	n       *rulesNode
	mu      sync.Mutex // guards clients: rules call from many goroutines
	clients map[string]*clientv3.Client
}

func newEtcdRuleAPI(t *testing.T, n *rulesNode) ruleAPI {
	return &etcdRuleAPI{t: t, n: n, clients: map[string]*clientv3.Client{}}
}

func (a *etcdRuleAPI) client(who string) *clientv3.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.clients[who]; c != nil {
		return c
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{a.n.etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		panic(fmt.Sprintf("etcd client of %s: %v", who, err)) // not t.Fatal: called off the test's goroutine too
	}
	a.t.Cleanup(func() { _ = c.Close() })
	a.clients[who] = c
	return c
}

func (a *etcdRuleAPI) ctx(ctx context.Context, who string) context.Context {
	return withToken(ctx, a.n.tokens[who])
}

func (a *etcdRuleAPI) OpenSession(ctx context.Context, who string) (int64, error) {
	r, err := a.client(who).Grant(a.ctx(ctx, who), 30)
	if err != nil {
		return 0, err
	}
	return int64(r.ID), nil
}

func (a *etcdRuleAPI) CloseSession(ctx context.Context, who string, id int64) error {
	_, err := a.client(who).Revoke(a.ctx(ctx, who), clientv3.LeaseID(id))
	return err
}

func (a *etcdRuleAPI) PutBound(ctx context.Context, who, key string, id int64) error {
	_, err := a.client(who).Put(a.ctx(ctx, who), key, "x", clientv3.WithLease(clientv3.LeaseID(id)))
	return err
}

func (a *etcdRuleAPI) Put(ctx context.Context, who, key, value string) error {
	_, err := a.client(who).Put(a.ctx(ctx, who), key, value)
	return err
}

func (a *etcdRuleAPI) PutMethod() string { return "/etcdserverpb.KV/Put" }

func (a *etcdRuleAPI) Hold(ctx context.Context, who, name string, id int64) error {
	_, err := v3lockpb.NewLockClient(a.client(who).ActiveConnection()).Lock(a.ctx(ctx, who), &v3lockpb.LockRequest{Name: []byte(name), Lease: id})
	return err
}

func (a *etcdRuleAPI) Wait(ctx context.Context, who, name string, id int64) error {
	_, err := v3lockpb.NewLockClient(a.client(who).ActiveConnection()).Lock(a.ctx(ctx, who), &v3lockpb.LockRequest{Name: []byte(name), Lease: id})
	if err == nil {
		return fmt.Errorf("%s was free", name)
	}
	return err
}

// Watch speaks etcd's watch protocol itself, one stream a watch: a
// cancellation's reason reaches clientv3's users only at creation.
func (a *etcdRuleAPI) Watch(ctx context.Context, who, prefix string) (<-chan string, <-chan error, error) {
	stream, err := pb.NewWatchClient(a.client(who).ActiveConnection()).Watch(a.ctx(ctx, who))
	if err != nil {
		return nil, nil, err
	}
	end := []byte(clientv3.GetPrefixRangeEnd(prefix))
	if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(prefix), RangeEnd: end}}}); err != nil {
		return nil, nil, err
	}
	created, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	if created.Canceled {
		return nil, nil, &watchCanceled{created.CancelReason}
	}
	values, ended := make(chan string, 16), make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			if r.Canceled {
				ended <- &watchCanceled{r.CancelReason}
				return
			}
			for _, e := range r.Events {
				if e.Type == mvccpb.PUT {
					values <- string(e.Kv.Value)
				}
			}
		}
	}()
	return values, ended, nil
}

func (a *etcdRuleAPI) Sees(ctx context.Context, who string, id int64) (bool, bool, error) {
	c := a.client(who)
	ttl, err := c.TimeToLive(a.ctx(ctx, who), clientv3.LeaseID(id))
	if err != nil {
		return false, false, err
	}
	list, err := c.Leases(a.ctx(ctx, who))
	if err != nil {
		return false, false, err
	}
	listed := false
	for _, l := range list.Leases {
		listed = listed || int64(l.ID) == id
	}
	return ttl.TTL > 0, listed, nil
}
