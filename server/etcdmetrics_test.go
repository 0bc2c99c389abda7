package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/testnet"
)

// series is the sum of the counters, or the histograms' sample counts,
// named name whose labels include labels.
func series(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// TestEtcdCallsAreCountedAsRequests: a node whose only clients speak
// etcd has request series for their calls, in the native API's
// tenure_requests_total and tenure_request_duration_seconds with the
// gRPC method for a label and the code as the native API writes it,
// refusals included, and a client's call that claims a node's forwarding
// mark too; and etcd's own grpc_server_handled_total counts the same
// calls with etcd's labels.
func TestEtcdCallsAreCountedAsRequests(t *testing.T) {
	es := startEtcdAuthServer(t)
	reg := es.cfg.Registry
	alice := es.client(t, "alice", "alice-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type want struct {
		method, code string
		n            float64
	}
	wants := []want{
		{"/etcdserverpb.KV/Put", "ok", 1},
		{"/etcdserverpb.KV/Put", "permission_denied", 1},
		{"/etcdserverpb.KV/Put", "invalid_argument", 2}, // an empty key, a request too large
		{"/etcdserverpb.KV/Range", "ok", 2},
		{"/etcdserverpb.KV/Txn", "ok", 1},
		{"/etcdserverpb.Lease/LeaseGrant", "ok", 1},
	}
	grpcCode := map[string]string{"ok": "OK", "permission_denied": "PermissionDenied", "invalid_argument": "InvalidArgument"}
	before := map[want]float64{}
	for _, w := range wants {
		before[w] = series(t, reg, "tenure_requests_total", map[string]string{"method": w.method, "code": w.code})
		svc, m, _ := strings.Cut(strings.TrimPrefix(w.method, "/"), "/")
		before[want{"grpc " + w.method, w.code, 0}] = series(t, reg, "grpc_server_handled_total", map[string]string{"grpc_service": svc, "grpc_method": m, "grpc_code": grpcCode[w.code]})
	}
	watchesBefore := series(t, reg, "tenure_request_duration_seconds", map[string]string{"method": "/etcdserverpb.Watch/Watch"})

	// A watch open while the calls are made, closed after.
	wctx, wcancel := context.WithCancel(ctx)
	events := alice.Watch(wctx, "app/", clientv3.WithPrefix())
	if _, err := alice.Put(ctx, "app/a", "1"); err != nil {
		t.Fatal(err)
	}
	if resp := <-events; resp.Err() != nil || len(resp.Events) != 1 {
		t.Fatalf("watch: got = %+v, expected: the put", resp)
	}
	if _, err := alice.Put(ctx, "other/x", "1"); status.Code(err) != codes.PermissionDenied && !strings.Contains(fmt.Sprint(err), "permission denied") {
		t.Fatalf("put outside alice's keys: got = %v, expected: permission denied", err)
	}
	if _, err := alice.Put(ctx, "", "1"); err == nil {
		t.Fatal("put of an empty key: accepted, expected: key is not provided")
	}
	// Refused by etcd's size check, before any other interceptor: still
	// counted.
	big := strings.Repeat("x", es.cfg.Limits.EtcdMaxRequestBytes+1)
	if _, err := alice.Put(ctx, "app/big", big); !strings.Contains(fmt.Sprint(err), "request is too large") {
		t.Fatalf("put past --etcd-max-request-bytes: got = %v, expected: request is too large", err)
	}
	if _, err := alice.Get(ctx, "app/a"); err != nil {
		t.Fatal(err)
	}
	// A client that claims the mark of a node's forwarded call is no
	// node: its call is counted all the same.
	if _, err := alice.Get(metadata.AppendToOutgoingContext(ctx, etcdForwardedKey, "node9"), "app/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Txn(ctx).Then(clientv3.OpGet("app/a")).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Grant(ctx, 10); err != nil {
		t.Fatal(err)
	}
	wcancel()

	for _, w := range wants {
		got := series(t, reg, "tenure_requests_total", map[string]string{"method": w.method, "code": w.code}) - before[w]
		if got != w.n {
			t.Errorf("tenure_requests_total{method=%q,code=%q} rose by: got = %v, expected: %v", w.method, w.code, got, w.n)
		}
		svc, m, _ := strings.Cut(strings.TrimPrefix(w.method, "/"), "/")
		labels := map[string]string{"grpc_type": "unary", "grpc_service": svc, "grpc_method": m, "grpc_code": grpcCode[w.code]}
		if got := series(t, reg, "grpc_server_handled_total", labels) - before[want{"grpc " + w.method, w.code, 0}]; got != w.n {
			t.Errorf("grpc_server_handled_total%v rose by: got = %v, expected: %v", labels, got, w.n)
		}
	}
	if got := series(t, reg, "tenure_request_duration_seconds", map[string]string{"method": "/etcdserverpb.KV/Put"}); got < 3 {
		t.Errorf("tenure_request_duration_seconds{method=Put} counts %v calls, expected: the 3 puts at least", got)
	}
	// The watch stream is counted when it ends, its lifetime its
	// duration.
	deadline := time.Now().Add(10 * time.Second)
	for series(t, reg, "tenure_request_duration_seconds", map[string]string{"method": "/etcdserverpb.Watch/Watch"}) == watchesBefore {
		if time.Now().After(deadline) {
			t.Fatal("the closed watch stream was never counted in tenure_request_duration_seconds")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := series(t, reg, "grpc_server_handled_total", map[string]string{"grpc_type": "bidi_stream", "grpc_service": "etcdserverpb.Watch", "grpc_method": "Watch"}); got < 1 {
		t.Errorf("grpc_server_handled_total of the Watch stream: got = %v, expected: at least 1", got)
	}
	if got := series(t, reg, "grpc_server_started_total", map[string]string{"grpc_service": "etcdserverpb.KV", "grpc_method": "Put"}); got < 3 {
		t.Errorf("grpc_server_started_total of Put: got = %v, expected: at least 3", got)
	}
}

// TestEtcdAnswerCapIsTheServersLimit: --etcd-max-response-bytes reaches
// the etcd API: a Range whose answer is past it is refused with gRPC's
// error naming it, one under it answers.
func TestEtcdAnswerCapIsTheServersLimit(t *testing.T) {
	limits := testLimits()
	limits.EtcdMaxResponseBytes = 256 << 10
	ts := startServer(t, t.TempDir(), limits)
	ln := testnet.Listen(t)
	ts.cfg.Etcd = EtcdConfig{Listener: ln, Advertise: ln.Addr().String()}
	if err := ts.startEtcd(); err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ln.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	value := strings.Repeat("v", 64<<10)
	for i := range 5 {
		if _, err := c.Put(ctx, fmt.Sprintf("k/%d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := c.Get(ctx, "k/", clientv3.WithPrefix(), clientv3.WithLimit(3)); err != nil || len(resp.Kvs) != 3 {
		t.Errorf("3 of the 64 KiB values: got = %v, expected: answered", err)
	}
	_, err = c.Get(ctx, "k/", clientv3.WithPrefix())
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.HasSuffix(st.Message(), fmt.Sprintf(" vs. %d)", 256<<10)) {
		t.Errorf("5 values of 64 KiB: got = %v, expected: ResourceExhausted \"grpc: trying to send message larger than max (N vs. %d)\"", err, 256<<10)
	}
	// The raw client, for the status as gRPC gives it.
	raw := pb.NewKVClient(c.ActiveConnection())
	if _, err := raw.Range(ctx, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), KeysOnly: true}); err != nil {
		t.Errorf("keys only: got = %v, expected: answered", err)
	}
}

// TestNativeCallClaimingTheForwardedHeaderIsCounted: the native API,
// too, leaves a forwarded call to the node that took it only when a node
// forwarded it: under a policy a client that sets Tenure-Forwarded-By
// is counted all the same.
func TestNativeCallClaimingTheForwardedHeaderIsCounted(t *testing.T) {
	as := startAuthServer(t)
	c := as.clients(t, "token:team-a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	get := map[string]string{"method": "/tenure.v1.KVService/Get"}
	before := series(t, as.cfg.Registry, "tenure_requests_total", get)
	for _, forged := range []bool{false, true} {
		req := connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/k"})
		if forged {
			req.Header().Set(ForwardedHeader, "node9")
		}
		_, _ = c.kv.Get(ctx, req) // not found: any answer is counted
	}
	if got := series(t, as.cfg.Registry, "tenure_requests_total", get) - before; got != 2 {
		t.Errorf("tenure_requests_total of Get rose by: got = %v, expected: 2, the call with a forged header too", got)
	}
}
