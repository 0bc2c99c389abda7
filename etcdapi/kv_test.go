package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// spyBackend records what the KV service asks of the fake: the
// serializable flag of each Read and each Authorize.
type spyBackend struct {
	*fakeBackend
	mu     sync.Mutex
	reads  []bool
	auths  []string // "r key end" or "w key end"
	denied bool     // refuse every Authorize
	policy bool     // AuthEnabled answers true
}

func (s *spyBackend) AuthEnabled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy
}

func (s *spyBackend) deny(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied = on
}

func (s *spyBackend) Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error {
	s.mu.Lock()
	s.reads = append(s.reads, serializable)
	s.mu.Unlock()
	return s.fakeBackend.Read(ctx, serializable, fn)
}

func (s *spyBackend) Authorize(ctx context.Context, verb Verb, key, end string) error {
	v := "r"
	if verb == VerbWrite {
		v = "w"
	}
	s.mu.Lock()
	s.auths = append(s.auths, fmt.Sprintf("%s %q %q", v, key, end))
	denied := s.denied
	s.mu.Unlock()
	if denied {
		return rpctypes.ErrGRPCPermissionDenied
	}
	return s.fakeBackend.Authorize(ctx, verb, key, end)
}

// take returns what was recorded since the last call, and forgets it.
func (s *spyBackend) take() (reads []bool, auths []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	reads, auths = s.reads, s.auths
	s.reads, s.auths = nil, nil
	return reads, auths
}

// kvTest is a client of the KV service over a fake backend, and a raw
// KV client for requests clientv3 would rewrite.
type kvTest struct {
	t   *testing.T
	ctx context.Context
	f   *fakeBackend
	spy *spyBackend
	c   *clientv3.Client
	raw pb.KVClient
}

func newKVTest(t *testing.T) *kvTest {
	f := newFakeBackend(t)
	spy := &spyBackend{fakeBackend: f}
	c := serve(t, spy)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return &kvTest{t: t, ctx: ctx, f: f, spy: spy, c: c, raw: pb.NewKVClient(c.ActiveConnection())}
}

func (k *kvTest) put(key, val string, opts ...clientv3.OpOption) *clientv3.PutResponse {
	k.t.Helper()
	resp, err := k.c.Put(k.ctx, key, val, opts...)
	if err != nil {
		k.t.Fatalf("put %q: %v", key, err)
	}
	return resp
}

func (k *kvTest) get(key string, opts ...clientv3.OpOption) *clientv3.GetResponse {
	k.t.Helper()
	resp, err := k.c.Get(k.ctx, key, opts...)
	if err != nil {
		k.t.Fatalf("get %q: %v", key, err)
	}
	return resp
}

func (k *kvTest) rng(r *pb.RangeRequest) *pb.RangeResponse {
	k.t.Helper()
	resp, err := k.raw.Range(k.ctx, r)
	if err != nil {
		k.t.Fatalf("range %+v: %v", r, err)
	}
	return resp
}

// rev is the KV revision, read as a client sees it.
func (k *kvTest) rev() int64 {
	k.t.Helper()
	return k.get("\x00", clientv3.WithFromKey(), clientv3.WithCountOnly()).Header.Revision
}

// sameErr reports whether err is etcd's error want (a gRPC status of
// rpctypes, as the raw client returns it, or clientv3's form of it).
func sameErr(err, want error) bool {
	if err == nil {
		return false
	}
	ws := status.Convert(want)
	if s, ok := status.FromError(err); ok {
		return s.Code() == ws.Code() && s.Message() == ws.Message()
	}
	var ee rpctypes.EtcdError
	return errors.As(err, &ee) && ee.Code() == ws.Code() && ee.Error() == ws.Message()
}

func keysOf(kvs []*mvccpb.KeyValue) string {
	var out []string
	for _, kv := range kvs {
		if len(kv.Value) > 0 {
			out = append(out, string(kv.Key)+"="+string(kv.Value))
		} else {
			out = append(out, string(kv.Key))
		}
	}
	return strings.Join(out, " ")
}

func TestKVRangeForms(t *testing.T) {
	k := newKVTest(t)
	if got := k.rev(); got != 1 {
		t.Fatalf("fresh store at revision %d, want 1 as etcd", got)
	}
	for i, key := range []string{"a", "ab", "abc", "b", "c"} {
		if rev := k.put(key, "v"+key).Header.Revision; rev != int64(i+2) {
			t.Fatalf("put %q at revision %d, want %d", key, rev, i+2)
		}
	}
	for _, tc := range []struct {
		name string
		key  string
		opts []clientv3.OpOption
		want string
	}{
		{"one key", "ab", nil, "ab=vab"},
		{"absent key", "aa", nil, ""},
		{"prefix", "a", []clientv3.OpOption{clientv3.WithPrefix()}, "a=va ab=vab abc=vabc"},
		{"range", "ab", []clientv3.OpOption{clientv3.WithRange("b")}, "ab=vab abc=vabc"},
		{"empty range", "b", []clientv3.OpOption{clientv3.WithRange("a")}, ""},
		{"from key", "abc", []clientv3.OpOption{clientv3.WithFromKey()}, "abc=vabc b=vb c=vc"},
		{"whole keyspace", "\x00", []clientv3.OpOption{clientv3.WithFromKey()}, "a=va ab=vab abc=vabc b=vb c=vc"},
	} {
		resp := k.get(tc.key, tc.opts...)
		if got := keysOf(resp.Kvs); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		if h := resp.Header; h.Revision != 6 || h.ClusterId != 1 || h.MemberId != 2 || h.RaftTerm != 1 {
			t.Errorf("%s: header %+v, want revision 6 and the backend's ident", tc.name, h)
		}
	}
	kv := k.get("b").Kvs[0]
	if kv.CreateRevision != 5 || kv.ModRevision != 5 || kv.Version != 1 || kv.Lease != 0 {
		t.Errorf("b is %+v, want created and modified at 5, version 1, no lease", kv)
	}
	if _, err := k.raw.Range(k.ctx, &pb.RangeRequest{}); !sameErr(err, rpctypes.ErrGRPCEmptyKey) {
		t.Errorf("range of an empty key: %v, want %v", err, rpctypes.ErrGRPCEmptyKey)
	}
}

func TestKVRangeOptions(t *testing.T) {
	k := newKVTest(t)
	// Values sort against the keys; "b" is written three times, so its
	// version and mod revision are the highest.
	for _, p := range [][2]string{{"a", "3"}, {"b", "x"}, {"c", "2"}, {"d", "1"}, {"b", "y"}, {"b", "0"}} {
		k.put(p[0], p[1])
	}
	// revisions: a 2, c 4, d 5, b created 3, modified 7 (version 3).
	all := []byte("\x00")
	for _, tc := range []struct {
		name      string
		r         *pb.RangeRequest
		want      string
		count     int64
		more      bool
		keepValue bool
	}{
		{name: "limit", r: &pb.RangeRequest{Limit: 2}, want: "a=3 b=0", count: 4, more: true},
		{name: "limit of all", r: &pb.RangeRequest{Limit: 4}, want: "a=3 b=0 c=2 d=1", count: 4},
		{name: "negative limit is none", r: &pb.RangeRequest{Limit: -1}, want: "a=3 b=0 c=2 d=1", count: 4},
		{name: "count only", r: &pb.RangeRequest{CountOnly: true, Limit: 1}, want: "", count: 4},
		{name: "keys only", r: &pb.RangeRequest{KeysOnly: true, Limit: 3}, want: "a b c", count: 4, more: true},
		{name: "descend by key, limit after sorting",
			r: &pb.RangeRequest{SortOrder: pb.RangeRequest_DESCEND, Limit: 2}, want: "d=1 c=2", count: 4, more: true},
		{name: "ascend by value",
			r: &pb.RangeRequest{SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_VALUE}, want: "b=0 d=1 c=2 a=3", count: 4},
		{name: "descend by version",
			r: &pb.RangeRequest{SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_VERSION, Limit: 1}, want: "b=0", count: 4, more: true},
		{name: "ascend by create",
			r: &pb.RangeRequest{SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_CREATE}, want: "a=3 b=0 c=2 d=1", count: 4},
		{name: "descend by mod",
			r: &pb.RangeRequest{SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_MOD}, want: "b=0 d=1 c=2 a=3", count: 4},
		// etcd: a target without an order sorts ascending, but the
		// limit is then taken first, in key order (limit+1 keys read).
		{name: "target without order",
			r: &pb.RangeRequest{SortTarget: pb.RangeRequest_VALUE}, want: "b=0 d=1 c=2 a=3", count: 4},
		{name: "target without order, limited",
			r: &pb.RangeRequest{SortTarget: pb.RangeRequest_VALUE, Limit: 2}, want: "b=0 c=2", count: 4, more: true},
		{name: "min mod", r: &pb.RangeRequest{MinModRevision: 5}, want: "b=0 d=1", count: 4},
		{name: "max mod", r: &pb.RangeRequest{MaxModRevision: 4}, want: "a=3 c=2", count: 4},
		{name: "min create", r: &pb.RangeRequest{MinCreateRevision: 4}, want: "c=2 d=1", count: 4},
		{name: "max create", r: &pb.RangeRequest{MaxCreateRevision: 3}, want: "a=3 b=0", count: 4},
		{name: "filter then limit", r: &pb.RangeRequest{MinCreateRevision: 3, Limit: 2}, want: "b=0 c=2", count: 4, more: true},
		{name: "filter within limit", r: &pb.RangeRequest{MaxCreateRevision: 3, Limit: 2}, want: "a=3 b=0", count: 4},
	} {
		tc.r.Key, tc.r.RangeEnd = all, all
		resp := k.rng(tc.r)
		if got := keysOf(resp.Kvs); got != tc.want || resp.Count != tc.count || resp.More != tc.more {
			t.Errorf("%s: got %q count %d more %v, want %q count %d more %v",
				tc.name, got, resp.Count, resp.More, tc.want, tc.count, tc.more)
		}
		if resp.Header.Revision != 7 {
			t.Errorf("%s: header revision %d, want 7", tc.name, resp.Header.Revision)
		}
	}
}

func TestKVRangeRevisionAndCompact(t *testing.T) {
	k := newKVTest(t)
	k.put("k", "v1") // 2
	k.put("k", "v2") // 3
	if _, err := k.c.Delete(k.ctx, "k"); err != nil {
		t.Fatal(err)
	} // 4
	k.put("j", "v") // 5
	for rev, want := range map[int64]string{0: "", 1: "", 2: "k=v1", 3: "k=v2", 4: "", 5: ""} {
		resp := k.get("k", clientv3.WithRev(rev))
		if got := keysOf(resp.Kvs); got != want {
			t.Errorf("k at %d: %q, want %q", rev, got, want)
		}
		if resp.Header.Revision != 5 {
			t.Errorf("k at %d: header revision %d, want the current 5", rev, resp.Header.Revision)
		}
	}
	if kv := k.get("k", clientv3.WithRev(3)).Kvs[0]; kv.CreateRevision != 2 || kv.ModRevision != 3 || kv.Version != 2 {
		t.Errorf("k at 3 is %+v, want created 2, modified 3, version 2", kv)
	}
	if _, err := k.c.Get(k.ctx, "k", clientv3.WithRev(6)); !sameErr(err, rpctypes.ErrGRPCFutureRev) {
		t.Errorf("get at a future revision: %v, want %v", err, rpctypes.ErrGRPCFutureRev)
	}

	if _, err := k.c.Compact(k.ctx, 6); !sameErr(err, rpctypes.ErrGRPCFutureRev) {
		t.Errorf("compact at a future revision: %v, want %v", err, rpctypes.ErrGRPCFutureRev)
	}
	resp, err := k.c.Compact(k.ctx, 3, clientv3.WithCompactPhysical())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Revision != 5 {
		t.Errorf("compact: header revision %d, want 5", resp.Header.Revision)
	}
	if _, err := k.c.Compact(k.ctx, 3); !sameErr(err, rpctypes.ErrGRPCCompacted) {
		t.Errorf("compact again at 3: %v, want %v", err, rpctypes.ErrGRPCCompacted)
	}
	if _, err := k.c.Get(k.ctx, "k", clientv3.WithRev(2)); !sameErr(err, rpctypes.ErrGRPCCompacted) {
		t.Errorf("get below the compact revision: %v, want %v", err, rpctypes.ErrGRPCCompacted)
	}
	if got := keysOf(k.get("k", clientv3.WithRev(3)).Kvs); got != "k=v2" {
		t.Errorf("k at the compact revision: %q, want k=v2", got)
	}
	if got := k.rev(); got != 5 {
		t.Errorf("revision %d after compactions, want 5: they change no key", got)
	}
}

func TestKVSerializable(t *testing.T) {
	k := newKVTest(t)
	k.spy.take()
	k.get("a", clientv3.WithSerializable())
	k.get("a")
	rangeOp := func(serializable bool) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a"), Serializable: serializable}}}
	}
	for _, r := range []*pb.TxnRequest{
		{Success: []*pb.RequestOp{rangeOp(true)}, Failure: []*pb.RequestOp{rangeOp(true)}},
		{Success: []*pb.RequestOp{rangeOp(true)}, Failure: []*pb.RequestOp{rangeOp(false)}},
		// etcd decides on the outer operations only: a nested Txn is
		// not a serializable range.
		{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{rangeOp(true)}}}}}},
	} {
		if _, err := k.raw.Txn(k.ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	reads, _ := k.spy.take()
	if want := []bool{true, false, true, false, false}; fmt.Sprint(reads) != fmt.Sprint(want) {
		t.Errorf("reads serializable %v, want %v", reads, want)
	}
	k.put("a", "1")
	if reads, _ := k.spy.take(); len(reads) != 0 {
		t.Errorf("a put read %d times, want none: it goes through Propose", len(reads))
	}
}

func TestKVPut(t *testing.T) {
	k := newKVTest(t)
	if resp := k.put("k", "v1"); resp.PrevKv != nil || resp.Header.Revision != 2 {
		t.Errorf("first put: %+v, want no prev_kv at revision 2", resp)
	}
	if resp := k.put("k", "v2"); resp.PrevKv != nil {
		t.Errorf("put without prev_kv returned %+v", resp.PrevKv)
	}
	resp := k.put("k", "v3", clientv3.WithPrevKV())
	if p := resp.PrevKv; p == nil || string(p.Value) != "v2" || p.ModRevision != 3 || p.Version != 2 {
		t.Errorf("prev_kv %+v, want v2 modified at 3, version 2", p)
	}

	sess := k.f.apply(statemachine.OpenSession{Identity: "etcd", TTL: int64(time.Minute), LeaseID: 0x7e57})
	if sess.Err != nil {
		t.Fatal(sess.Err)
	}
	lease := clientv3.LeaseID(sess.Session.EtcdLeaseID())
	k.put("k", "v4", clientv3.WithLease(lease))
	k.put("k", "", clientv3.WithIgnoreValue())
	if kv := k.get("k").Kvs[0]; string(kv.Value) != "v4" || kv.Lease != 0 || kv.Version != 5 {
		t.Errorf("after ignore_value: %+v, want v4 with no lease (a put without one detaches it), version 5", kv)
	}
	k.put("k", "v5", clientv3.WithLease(lease))
	k.put("k", "v6", clientv3.WithIgnoreLease())
	if kv := k.get("k").Kvs[0]; string(kv.Value) != "v6" || kv.Lease != int64(lease) {
		t.Errorf("after ignore_lease: %+v, want v6 still on lease %x", kv, lease)
	}

	before := k.rev()
	for _, tc := range []struct {
		name string
		r    *pb.PutRequest
		want error
	}{
		{"empty key", &pb.PutRequest{Value: []byte("v")}, rpctypes.ErrGRPCEmptyKey},
		{"value with ignore_value", &pb.PutRequest{Key: []byte("k"), Value: []byte("v"), IgnoreValue: true}, rpctypes.ErrGRPCValueProvided},
		{"lease with ignore_lease", &pb.PutRequest{Key: []byte("k"), Lease: int64(lease), IgnoreLease: true}, rpctypes.ErrGRPCLeaseProvided},
		{"ignore_value of an absent key", &pb.PutRequest{Key: []byte("nope"), IgnoreValue: true}, rpctypes.ErrGRPCKeyNotFound},
		{"ignore_lease of an absent key", &pb.PutRequest{Key: []byte("nope"), IgnoreLease: true}, rpctypes.ErrGRPCKeyNotFound},
		{"unknown lease", &pb.PutRequest{Key: []byte("k"), Value: []byte("v"), Lease: 12345}, rpctypes.ErrGRPCLeaseNotFound},
	} {
		if _, err := k.raw.Put(k.ctx, tc.r); !sameErr(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if after := k.rev(); after != before {
		t.Errorf("refused puts moved the revision from %d to %d", before, after)
	}
	if kv := k.get("k").Kvs[0]; string(kv.Value) != "v6" {
		t.Errorf("refused puts changed k to %q", kv.Value)
	}
}

func TestKVPutLeaseRevoke(t *testing.T) {
	k := newKVTest(t)
	chosen := k.f.apply(statemachine.OpenSession{Identity: "etcd", TTL: int64(time.Minute), LeaseID: 0x1234})
	picked := k.f.apply(statemachine.OpenSession{Identity: "etcd", TTL: int64(time.Minute)})
	if chosen.Err != nil || picked.Err != nil {
		t.Fatal(chosen.Err, picked.Err)
	}
	k.put("on/chosen", "1", clientv3.WithLease(0x1234))
	k.put("on/picked", "2", clientv3.WithLease(clientv3.LeaseID(picked.Session.EtcdLeaseID())))
	k.put("free", "3")
	got := map[string]int64{}
	for _, kv := range k.get("\x00", clientv3.WithFromKey()).Kvs {
		got[string(kv.Key)] = kv.Lease
	}
	want := map[string]int64{"on/chosen": 0x1234, "on/picked": picked.Session.ID, "free": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("leases %v, want %v", got, want)
	}
	before := k.rev()
	if res := k.f.apply(statemachine.CloseSession{SessionID: chosen.Session.ID}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if got := keysOf(k.get("\x00", clientv3.WithFromKey()).Kvs); got != "free=3 on/picked=2" {
		t.Errorf("after revoking lease 0x1234: %q, want its key gone", got)
	}
	if after := k.rev(); after != before+1 {
		t.Errorf("revocation moved the revision from %d to %d, want one step", before, after)
	}
	if _, err := k.c.Put(k.ctx, "again", "x", clientv3.WithLease(0x1234)); !sameErr(err, rpctypes.ErrGRPCLeaseNotFound) {
		t.Errorf("put on a revoked lease: %v, want %v", err, rpctypes.ErrGRPCLeaseNotFound)
	}
}

func TestKVDeleteRange(t *testing.T) {
	k := newKVTest(t)
	for _, key := range []string{"a", "ab", "abc", "b", "c", "d"} {
		k.put(key, "v"+key)
	} // revision 7
	resp, err := k.c.Delete(k.ctx, "zz")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Deleted != 0 || resp.Header.Revision != 7 {
		t.Errorf("delete of nothing: %d deleted at revision %d, want 0 at 7 (nothing changed)", resp.Deleted, resp.Header.Revision)
	}
	resp, err = k.c.Delete(k.ctx, "ab", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Deleted != 2 || resp.PrevKvs != nil || resp.Header.Revision != 8 {
		t.Errorf("delete prefix ab: %+v, want 2 deleted, no prev_kvs, revision 8", resp)
	}
	resp, err = k.c.Delete(k.ctx, "a", clientv3.WithRange("c"), clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if keysOf(resp.PrevKvs) != "a=va b=vb" || resp.Deleted != 2 || resp.Header.Revision != 9 {
		t.Errorf("delete [a, c): %+v, want a and b as prev_kvs at revision 9", resp)
	}
	if p := resp.PrevKvs[0]; p.CreateRevision != 2 || p.ModRevision != 2 || p.Version != 1 {
		t.Errorf("prev_kv of a: %+v", p)
	}
	resp, err = k.c.Delete(k.ctx, "c", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Deleted != 2 {
		t.Errorf("delete from c: %d deleted, want 2", resp.Deleted)
	}
	if n := k.get("\x00", clientv3.WithFromKey(), clientv3.WithCountOnly()).Count; n != 0 {
		t.Errorf("%d keys left, want none", n)
	}
	if _, err := k.raw.DeleteRange(k.ctx, &pb.DeleteRangeRequest{}); !sameErr(err, rpctypes.ErrGRPCEmptyKey) {
		t.Errorf("delete of an empty key: %v, want %v", err, rpctypes.ErrGRPCEmptyKey)
	}
}
