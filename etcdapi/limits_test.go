package etcdapi

import (
	"bytes"
	"math"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdEntry is the raft entry etcd writes for a request, with the
// largest header ID, as etcd 3.5's processInternalRaftRequestOnce
// marshals it before comparing it with --max-request-bytes.
func etcdEntry(req any) int {
	r := pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: math.MaxUint64}}
	switch q := req.(type) {
	case *pb.PutRequest:
		r.Put = q
	case *pb.DeleteRangeRequest:
		r.DeleteRange = q
	case *pb.TxnRequest:
		r.Txn = q
	case *pb.CompactionRequest:
		r.Compaction = q
	case *pb.LeaseGrantRequest:
		r.LeaseGrant = q
	default:
		panic("no entry for this request")
	}
	return r.Size()
}

func TestEntrySizeIsEtcds(t *testing.T) {
	putOp := func(key string, n int) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: make([]byte, n)}}}
	}
	getOp := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	for _, tc := range []struct {
		name   string
		req    any
		logged bool
	}{
		{"an empty put", &pb.PutRequest{Key: []byte("k")}, true},
		{"a put of 127 bytes (a 1-byte length)", &pb.PutRequest{Key: []byte("k"), Value: make([]byte, 124)}, true},
		{"a put of 128 bytes (a 2-byte length)", &pb.PutRequest{Key: []byte("k"), Value: make([]byte, 125)}, true},
		{"a put of 300 KB with a lease and prev_kv", &pb.PutRequest{Key: bytes.Repeat([]byte("k"), 2048), Value: make([]byte, 300_000), Lease: 1 << 62, PrevKv: true}, true},
		{"a put of 1.5 MiB", &pb.PutRequest{Key: []byte("k"), Value: make([]byte, DefaultMaxRequestBytes)}, true},
		{"a delete of a range", &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte("b"), PrevKv: true}, true},
		{"a txn of many puts", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("c")}}, Success: []*pb.RequestOp{putOp("a", 100_000), putOp("b", 100_000)}}, true},
		{"a txn with a nested txn", &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{}}}}}, true},
		{"a compaction", &pb.CompactionRequest{Revision: 1 << 40}, true},
		{"a lease grant", &pb.LeaseGrantRequest{TTL: 60, ID: 1 << 62}, true},
		{"a range is never logged", &pb.RangeRequest{Key: []byte("k")}, false},
		{"nor a txn that only reads", &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("c")}}, Success: []*pb.RequestOp{getOp}, Failure: []*pb.RequestOp{getOp}}, false},
	} {
		got, logged := EntrySize(tc.req)
		if logged != tc.logged {
			t.Errorf("%s: logged got = %v, expected: %v", tc.name, logged, tc.logged)
			continue
		}
		if logged {
			if want := etcdEntry(tc.req); got != want {
				t.Errorf("%s: size got = %d, expected: %d (etcd's InternalRaftRequest)", tc.name, got, want)
			}
		}
	}
	// The recipes' calls count their own request, with the same header.
	lock := &v3lockpb.LockRequest{Name: bytes.Repeat([]byte("n"), 1000), Lease: 1}
	if got, logged := EntrySize(lock); !logged || got < lock.Size() || got > lock.Size()+20 {
		t.Errorf("a Lock of %d bytes: size got = %d (logged %v), expected: its size and at most 20 bytes more", lock.Size(), got, logged)
	}
}

// putOfEntry is a Put of key whose entry, as etcd counts it, is size
// bytes.
func putOfEntry(key string, size int) *pb.PutRequest {
	r := &pb.PutRequest{Key: []byte(key), Value: make([]byte, size)}
	for {
		n, _ := EntrySize(r)
		if n == size {
			return r
		}
		r.Value = r.Value[:len(r.Value)-(n-size)]
	}
}

// TestRequestSizeLimit serves the fake with ServerOptions as the node
// does: a request whose entry is at the limit is taken, one byte more is
// refused with etcd's error, changing nothing, a request past gRPC's
// allowance gets gRPC's, and reads and answers are not bounded by it.
func TestRequestSizeLimit(t *testing.T) {
	k := newKVTest(t)
	// The raw client sends what clientv3 would refuse to (its own limit
	// is 2 MiB), to reach the server's.
	raw := pb.NewKVClient(k.c.ActiveConnection())
	big := []grpc.CallOption{grpc.MaxCallSendMsgSize(math.MaxInt32)}

	at := putOfEntry("at", DefaultMaxRequestBytes)
	for i := range at.Value {
		at.Value[i] = byte('a' + i%26)
	}
	if _, err := raw.Put(k.ctx, at, big...); err != nil {
		t.Fatalf("a put whose entry is %d bytes, the limit: %v", DefaultMaxRequestBytes, err)
	}
	got := k.get("at")
	if len(got.Kvs) != 1 || !bytes.Equal(got.Kvs[0].Value, at.Value) {
		t.Fatalf("the put at the limit did not read back byte for byte")
	}

	before := k.rev()
	over := putOfEntry("over", DefaultMaxRequestBytes+1)
	_, err := raw.Put(k.ctx, over, big...)
	if !sameErr(err, rpctypes.ErrGRPCRequestTooLarge) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("a put one byte over: got = %v, expected: %v", err, rpctypes.ErrGRPCRequestTooLarge)
	}
	// clientv3 maps it to its own sentinel, which etcd's users match.
	if _, err := k.c.Put(k.ctx, "over", string(over.Value)); err == nil || !strings.Contains(err.Error(), rpctypes.ErrRequestTooLarge.Error()) {
		t.Errorf("clientv3 put one byte over: got = %v, expected: %v", err, rpctypes.ErrRequestTooLarge)
	}
	txn := &pb.TxnRequest{Success: []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("t1"), Value: make([]byte, 800<<10)}}},
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("t2"), Value: make([]byte, 800<<10)}}},
	}}
	if _, err := raw.Txn(k.ctx, txn, big...); !sameErr(err, rpctypes.ErrGRPCRequestTooLarge) {
		t.Errorf("a txn of two 800 KiB puts: got = %v, expected: %v", err, rpctypes.ErrGRPCRequestTooLarge)
	}
	// Past the limit and etcd's 512 KiB of gRPC overhead, gRPC refuses
	// the message before any handler, as it does on etcd.
	huge := &pb.PutRequest{Key: []byte("huge"), Value: make([]byte, DefaultMaxRequestBytes+grpcOverheadBytes)}
	if _, err := raw.Put(k.ctx, huge, big...); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a put past gRPC's limit: got = %v, expected: code %v", err, codes.ResourceExhausted)
	}
	if after := k.rev(); after != before {
		t.Errorf("refused requests moved the revision from %d to %d", before, after)
	}
	for _, key := range []string{"over", "t1", "t2", "huge"} {
		if n := len(k.get(key).Kvs); n != 0 {
			t.Errorf("key %q exists after its put was refused", key)
		}
	}

	// A Range is not logged: a key longer than a write may carry still
	// reads, as on etcd.
	long := bytes.Repeat([]byte("r"), DefaultMaxRequestBytes+1000)
	if _, err := raw.Range(k.ctx, &pb.RangeRequest{Key: long}, big...); err != nil {
		t.Errorf("a range of a key longer than the limit: %v", err)
	}
	// Answers are not bounded: five values of 1 MiB come back in one.
	for i := range 5 {
		k.put("m/"+string(rune('a'+i)), strings.Repeat("m", 1<<20))
	}
	if got := k.get("m/", clientv3.WithPrefix()); len(got.Kvs) != 5 {
		t.Errorf("a range of five 1 MiB values: got %d, expected: 5", len(got.Kvs))
	}
}
