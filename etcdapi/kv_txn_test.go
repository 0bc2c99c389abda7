package etcdapi

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/statemachine"
)

func TestKVTxn(t *testing.T) {
	k := newKVTest(t)
	k.put("cfg/a", "1") // 2
	k.put("cfg/b", "2") // 3
	k.put("x", "old")   // 4
	sess := k.f.apply(statemachine.OpenSession{Identity: "etcd", TTL: int64(time.Minute), LeaseID: 99})
	if sess.Err != nil {
		t.Fatal(sess.Err)
	}
	k.put("leased", "l", clientv3.WithLease(99)) // 5

	holds := []clientv3.Cmp{
		clientv3.Compare(clientv3.Version("cfg/").WithPrefix(), ">", 0),
		clientv3.Compare(clientv3.CreateRevision("cfg/a"), "=", 2),
		clientv3.Compare(clientv3.ModRevision("cfg/b"), "<", 4),
		clientv3.Compare(clientv3.Value("x"), "!=", "new"),
		clientv3.Compare(clientv3.Value("x"), ">", "abc"),
		clientv3.Compare(clientv3.LeaseValue("leased"), "=", 99),
		clientv3.Compare(clientv3.Version("absent"), "=", 0),
		clientv3.Compare(clientv3.CreateRevision("cfg/a").WithRange("cfg/c"), "<", 4),
	}
	fails := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision("cfg/").WithPrefix(), ">", 2),
		clientv3.Compare(clientv3.Value("absent"), "=", ""),
		clientv3.Compare(clientv3.LeaseValue("x"), "!=", 0),
	}
	for i, c := range holds {
		resp, err := k.c.Txn(k.ctx).If(c).Commit()
		if err != nil || !resp.Succeeded {
			t.Errorf("compare %d should hold: %v %v", i, err, resp)
		}
	}
	for i, c := range fails {
		resp, err := k.c.Txn(k.ctx).If(c).Commit()
		if err != nil || resp.Succeeded {
			t.Errorf("compare %d should fail: %v %v", i, err, resp)
		}
	}
	if got := k.rev(); got != 5 {
		t.Fatalf("compare-only txns moved the revision to %d", got)
	}

	// Success branch, with a nested Txn taking its failure branch.
	resp, err := k.c.Txn(k.ctx).If(holds...).Then(
		clientv3.OpGet("cfg/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpPut("x", "new", clientv3.WithPrevKV()),
		clientv3.OpGet("x"),
		clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value("x"), "=", "new")}, // fails: compares see the state before the Txn
			[]clientv3.Op{clientv3.OpPut("then", "t")},
			[]clientv3.Op{clientv3.OpDelete("cfg/", clientv3.WithPrefix(), clientv3.WithPrevKV()), clientv3.OpPut("else", "e")},
		),
		clientv3.OpGet("\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly()),
	).Else(clientv3.OpPut("never", "n")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded || resp.Header.Revision != 6 || len(resp.Responses) != 5 {
		t.Fatalf("txn: succeeded %v at %d with %d responses, want success at 6 with 5", resp.Succeeded, resp.Header.Revision, len(resp.Responses))
	}
	r0 := resp.Responses[0].GetResponseRange()
	if r0.Count != 2 || len(r0.Kvs) != 0 || r0.Header.Revision != 5 {
		t.Errorf("count of cfg/: %+v, want 2 at revision 5 (before any write)", r0)
	}
	r1 := resp.Responses[1].GetResponsePut()
	if r1.PrevKv == nil || string(r1.PrevKv.Value) != "old" || r1.Header.Revision != 6 {
		t.Errorf("put x: %+v, want prev_kv old at revision 6", r1)
	}
	if r2 := resp.Responses[2].GetResponseRange(); keysOf(r2.Kvs) != "x=new" || r2.Kvs[0].ModRevision != 6 || r2.Header.Revision != 6 {
		t.Errorf("get x after the put: %+v, want new at 6", r2)
	}
	r3 := resp.Responses[3].GetResponseTxn()
	if r3.Succeeded || len(r3.Responses) != 2 || r3.Header.Revision != 0 {
		t.Fatalf("nested txn: %+v, want its failure branch, and an empty header as etcd", r3)
	}
	if d := r3.Responses[0].GetResponseDeleteRange(); d.Deleted != 2 || keysOf(d.PrevKvs) != "cfg/a=1 cfg/b=2" {
		t.Errorf("nested delete: %+v", d)
	}
	if got := keysOf(resp.Responses[4].GetResponseRange().Kvs); got != "else leased x" {
		t.Errorf("keys after the nested txn: %q, want else leased x", got)
	}
	for _, key := range []string{"else", "x"} {
		if kv := k.get(key).Kvs[0]; kv.ModRevision != 6 {
			t.Errorf("%s modified at %d, want 6: one revision per txn", key, kv.ModRevision)
		}
	}

	// Failure branch, from a range compare that no longer holds.
	resp, err = k.c.Txn(k.ctx).If(holds[0]).Then(clientv3.OpPut("never", "n")).Else(
		clientv3.OpPut("x", "newer"),
		clientv3.OpDelete("absent"),
		clientv3.OpGet("x", clientv3.WithRev(5)),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded || resp.Header.Revision != 7 || len(resp.Responses) != 3 {
		t.Fatalf("txn: %+v, want its failure branch at 7", resp)
	}
	if p := resp.Responses[0].GetResponsePut(); p.PrevKv != nil {
		t.Errorf("put without prev_kv in a txn returned %+v", p.PrevKv)
	}
	if d := resp.Responses[1].GetResponseDeleteRange(); d.Deleted != 0 || d.Header.Revision != 7 {
		t.Errorf("delete of nothing after a put: %+v, want revision 7", d)
	}
	if g := resp.Responses[2].GetResponseRange(); keysOf(g.Kvs) != "x=old" || g.Header.Revision != 7 {
		t.Errorf("get x at 5: %+v, want old", g)
	}
	if len(k.get("never").Kvs) != 0 {
		t.Error("a branch that did not run wrote")
	}

	// A txn whose only write, a delete, finds nothing leaves the revision.
	resp, err = k.c.Txn(k.ctx).Then(clientv3.OpDelete("absent"), clientv3.OpGet("x")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Revision != 7 || resp.Responses[1].GetResponseRange().Header.Revision != 7 {
		t.Errorf("txn that changes nothing: %+v, want revision 7", resp)
	}
}

func TestKVTxnRefused(t *testing.T) {
	k := newKVTest(t)
	k.put("k", "v")
	put := func(key string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte("x")}}}
	}
	del := func(key, end string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(key), RangeEnd: []byte(end)}}}
	}
	get := func(key string, rev int64) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key), Revision: rev}}}
	}
	txn := func(then, els []*pb.RequestOp) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: then, Failure: els}}}
	}
	puts := func(prefix string, n int) []*pb.RequestOp {
		var ops []*pb.RequestOp
		for i := range n {
			ops = append(ops, put(fmt.Sprintf("%s%03d", prefix, i)))
		}
		return ops
	}
	ops := func(o ...*pb.RequestOp) []*pb.RequestOp { return o }
	bigPut := func(key string, size int) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: bytes.Repeat([]byte("v"), size)}}}
	}
	cmps := make([]*pb.Compare, 129)
	for i := range cmps {
		cmps[i] = &pb.Compare{Key: []byte("k")}
	}
	for _, tc := range []struct {
		name string
		r    *pb.TxnRequest
		want error // nil: accepted
	}{
		{"put twice", &pb.TxnRequest{Success: ops(put("a"), put("a"))}, rpctypes.ErrGRPCDuplicateKey},
		{"put and delete", &pb.TxnRequest{Success: ops(put("a"), del("a", ""))}, rpctypes.ErrGRPCDuplicateKey},
		{"put in a deleted range", &pb.TxnRequest{Success: ops(del("a", "c"), put("b"))}, rpctypes.ErrGRPCDuplicateKey},
		{"put and nested put", &pb.TxnRequest{Success: ops(put("a"), txn(ops(put("a")), nil))}, rpctypes.ErrGRPCDuplicateKey},
		{"nested put in a deleted range", &pb.TxnRequest{Success: ops(del("a", "c"), txn(nil, ops(put("b"))))}, rpctypes.ErrGRPCDuplicateKey},
		{"put in a range nested deletes", &pb.TxnRequest{Success: ops(put("b"), txn(ops(del("a", "c")), nil))}, rpctypes.ErrGRPCDuplicateKey},
		{"two nested txns put", &pb.TxnRequest{Success: ops(txn(ops(put("a")), nil), txn(nil, ops(put("a"))))}, rpctypes.ErrGRPCDuplicateKey},
		{"deep nesting", &pb.TxnRequest{Failure: ops(put("a"), txn(ops(txn(ops(put("a")), nil)), nil))}, rpctypes.ErrGRPCDuplicateKey},
		{"both nested branches put", &pb.TxnRequest{Success: ops(txn(ops(put("a")), ops(put("a"))))}, nil},
		{"both outer branches put", &pb.TxnRequest{Success: ops(put("a")), Failure: ops(put("a"))}, nil},
		{"overlapping deletes", &pb.TxnRequest{Success: ops(del("a", "c"), del("b", ""))}, nil},
		{"put next to a deleted range", &pb.TxnRequest{Success: ops(del("a", "c"), put("c"))}, nil},
		// etcd's check sees the end "\x00" as a string, not as "every
		// key from a on", and lets this through; so does Tenure.
		{"put and delete from key", &pb.TxnRequest{Success: ops(put("b"), del("a", "\x00"))}, nil},

		{"129 operations", &pb.TxnRequest{Success: puts("p", 129)}, rpctypes.ErrGRPCTooManyOps},
		{"129 compares", &pb.TxnRequest{Compare: cmps}, rpctypes.ErrGRPCTooManyOps},
		{"128 operations", &pb.TxnRequest{Failure: puts("p", 128)}, nil},
		{"nested over what is left", &pb.TxnRequest{Success: append(puts("p", 100), txn(ops(put("n")), puts("n", 29)))}, rpctypes.ErrGRPCTooManyOps},
		{"nested within what is left", &pb.TxnRequest{Success: append(puts("p", 100), txn(ops(put("n")), puts("n", 27)))}, nil},
		{"empty compare key", &pb.TxnRequest{Compare: []*pb.Compare{{}}}, rpctypes.ErrGRPCEmptyKey},
		{"empty put key", &pb.TxnRequest{Failure: ops(put(""))}, rpctypes.ErrGRPCEmptyKey},
		{"empty range key", &pb.TxnRequest{Success: ops(get("", 0))}, rpctypes.ErrGRPCEmptyKey},
		{"empty nested delete key", &pb.TxnRequest{Success: ops(txn(nil, ops(del("", ""))))}, rpctypes.ErrGRPCEmptyKey},
		{"empty operation", &pb.TxnRequest{Success: ops(&pb.RequestOp{})}, rpctypes.ErrGRPCKeyNotFound},
		{"range at a future revision", &pb.TxnRequest{Success: ops(put("a"), get("k", 100))}, rpctypes.ErrGRPCFutureRev},
		{"put on an unknown lease", &pb.TxnRequest{Success: ops(put("a"), &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte("b"), Lease: 77}}})}, rpctypes.ErrGRPCLeaseNotFound},
		{"ignore_value of an absent key", &pb.TxnRequest{Success: ops(put("a"), &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte("absent"), IgnoreValue: true}}})}, rpctypes.ErrGRPCKeyNotFound},
		// As in etcd, only the whole request is bounded (1.5 MiB):
		// not a key, nor a value, nor how the puts share it.
		{"a key past the native API's 512 bytes", &pb.TxnRequest{Success: ops(put(strings.Repeat("k", 2048)))}, nil},
		{"a nested value past the native API's 64 KiB", &pb.TxnRequest{Failure: ops(txn(ops(bigPut("big", 300_000)), nil))}, nil},
		{"puts that fill the request", &pb.TxnRequest{Success: ops(bigPut("b1", 700<<10), bigPut("b2", 700<<10))}, nil},
		{"puts that together pass the request's size", &pb.TxnRequest{Success: ops(bigPut("b1", 800<<10), bigPut("b2", 800<<10))}, rpctypes.ErrGRPCRequestTooLarge},
		{"a nested value past the request's size", &pb.TxnRequest{Failure: ops(txn(ops(bigPut("big", DefaultMaxRequestBytes)), nil))}, rpctypes.ErrGRPCRequestTooLarge},
	} {
		before := k.rev()
		_, err := k.raw.Txn(k.ctx, tc.r)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: %v, want it accepted", tc.name, err)
		case tc.want != nil && !sameErr(err, tc.want):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		case tc.want != nil:
			if after := k.rev(); after != before {
				t.Errorf("%s: refused, yet the revision moved from %d to %d", tc.name, before, after)
			}
		}
	}
}
