package etcdapi

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tenurehq/tenure/statemachine"
)

// cappedBackend bounds answers at max bytes, as the server does with
// --etcd-max-response-bytes.
type cappedBackend struct {
	*fakeBackend
	max int
}

func (c cappedBackend) MaxResponseBytes() int { return c.max }

var _ Backend = cappedBackend{}

// answerTest is a raw KV client of a fake backend whose answers are
// capped at max (0: the default).
func answerTest(t *testing.T, max int) (context.Context, *fakeBackend, pb.KVClient) {
	f := newFakeBackend(t)
	var b Backend = f
	if max > 0 {
		b = cappedBackend{f, max}
	}
	c := serve(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx, f, pb.NewKVClient(c.ActiveConnection())
}

// putValues writes n keys prefix000.. with values of size bytes straight
// into the fake.
func putValues(t *testing.T, f *fakeBackend, prefix string, n, size int) {
	t.Helper()
	for i := range n {
		key := fmt.Sprintf("%s%03d", prefix, i)
		value := strings.Repeat(string(rune('a'+i%26)), size)
		if res := f.apply(statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: key, Value: value}}}); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
}

func rangeOp(key, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(end)}}}
}

func nestedTxn(then ...*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: then}}}
}

func repeatOp(op *pb.RequestOp, n int) []*pb.RequestOp {
	ops := make([]*pb.RequestOp, n)
	for i := range ops {
		ops[i] = op
	}
	return ops
}

// sentBytes is what the keys and values of kvs take in the encoded
// answer, each as a field of a repeated message.
func sentBytes(resp *pb.RangeResponse) int64 {
	var n int64
	for _, kv := range resp.Kvs {
		n += int64(1 + protowire.SizeBytes(kv.Size()))
	}
	return n
}

// tooLarge reports whether err is gRPC's refusal of an answer larger
// than max, and the size it names.
func tooLarge(err error, max int64) (int64, bool) {
	st, _ := status.FromError(err)
	var n, m int64
	if st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	if _, serr := fmt.Sscanf(st.Message(), "grpc: trying to send message larger than max (%d vs. %d)", &n, &m); serr != nil || m != max {
		return 0, false
	}
	return n, n > max
}

// allocatedDuring is how many bytes the process allocated while fn ran,
// and how much the heap in use grew across it, each after a GC.
func allocatedDuring(fn func()) (alloc, heapGrowth int64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc), int64(after.HeapInuse) - int64(before.HeapInuse)
}

// TestTxnOperationsCountOverEveryLevel: issue 29's Txn of 4 nested Txns
// of 124 Ranges over 512 KiB of keys, which etcd's per-level count
// takes and which built a 260 MB answer, is refused as too many
// operations before anything is read, and so is nesting 64 deep.
func TestTxnOperationsCountOverEveryLevel(t *testing.T) {
	ctx, f, kv := answerTest(t, 0)
	putValues(t, f, "own/", 8, 64<<10) // 512 KiB of the caller's keys
	all, one := rangeOp("own/", "own0"), rangeOp("absent", "")

	deep := &pb.TxnRequest{Success: repeatOp(all, 64)}
	for range 63 {
		deep = &pb.TxnRequest{Success: append(repeatOp(all, 63), &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: deep}})}
	}
	chain := &pb.TxnRequest{Success: []*pb.RequestOp{all}}
	for range 200 {
		chain = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: chain}}}}
	}
	for _, tc := range []struct {
		name string
		r    *pb.TxnRequest
		ok   bool
	}{
		{"issue 29's 4 nested Txns of 124 Ranges", &pb.TxnRequest{Success: repeatOp(nestedTxn(repeatOp(all, 124)...), 4)}, false},
		{"nesting 64 deep with 64 operations a level", deep, false},
		{"a chain of 200 nested Txns of one operation each", chain, false},
		{"2 nested Txns of 63 Ranges: 128 in all", &pb.TxnRequest{Success: repeatOp(nestedTxn(repeatOp(one, 63)...), 2)}, true},
		{"2 nested Txns of 64 Ranges: 130 in all", &pb.TxnRequest{Success: repeatOp(nestedTxn(repeatOp(all, 64)...), 2)}, false},
		{"128 compares and a nested Txn of 127 in each branch", &pb.TxnRequest{
			Compare: make128Compares(),
			Success: []*pb.RequestOp{nestedTxn(repeatOp(one, 127)...)},
			Failure: []*pb.RequestOp{nestedTxn(repeatOp(one, 127)...)},
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc, _ := allocatedDuring(func() { _, err = kv.Txn(ctx, tc.r) })
			if tc.ok {
				if err != nil {
					t.Fatalf("got = %v, expected: accepted", err)
				}
				return
			}
			if !sameErr(err, rpctypes.ErrGRPCTooManyOps) || status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got = %v, expected: %v (InvalidArgument)", err, rpctypes.ErrGRPCTooManyOps)
			}
			// Refused before any key is read: what the call allocated
			// is the request's few KB and gRPC's own, far below one
			// Range's 512 KiB of values.
			t.Logf("the call allocated %d KiB", alloc>>10)
			if alloc > 64<<20 {
				t.Errorf("the refused Txn allocated %d MiB, expected: far less than its answer would take", alloc>>20)
			}
		})
	}
}

func make128Compares() []*pb.Compare {
	cmps := make([]*pb.Compare, 128)
	for i := range cmps {
		cmps[i] = &pb.Compare{Key: []byte("own/000"), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER}
	}
	return cmps
}

// TestAnswerPastTheCapIsRefusedNotBuilt: a Txn whose Ranges read the
// same 2.5 MiB of keys 127 times would answer 318 MiB, past the default
// cap of 128 MiB: it is refused with gRPC's error for a message over its
// limit, naming the answer's size and the cap, and what the call
// allocated stays far below the answer it would have built. The cap is
// one budget over every Range of the Txn, nested ones included.
func TestAnswerPastTheCapIsRefusedNotBuilt(t *testing.T) {
	ctx, f, kv := answerTest(t, 0)
	putValues(t, f, "own/", 40, 64<<10) // 2.5 MiB
	all := rangeOp("own/", "own0")
	for _, tc := range []struct {
		name string
		r    *pb.TxnRequest
	}{
		{"127 Ranges", &pb.TxnRequest{Success: repeatOp(all, 127)}},
		{"2 nested Txns of 63 Ranges", &pb.TxnRequest{Success: repeatOp(nestedTxn(repeatOp(all, 63)...), 2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc, growth := allocatedDuring(func() { _, err = kv.Txn(ctx, tc.r) })
			n, ok := tooLarge(err, DefaultMaxResponseBytes)
			if !ok {
				t.Fatalf("got = %v, expected: ResourceExhausted \"grpc: trying to send message larger than max (N vs. %d)\"", err, DefaultMaxResponseBytes)
			}
			if n < 250<<20 {
				t.Errorf("the refusal names an answer of %d bytes, expected: every Range's 2.5 MiB counted, over 250 MiB", n)
			}
			t.Logf("a refused answer of %d MiB: the call allocated %d KiB, the heap grew by %d KiB", n>>20, alloc>>10, growth>>10)
			if alloc > 48<<20 || growth > 48<<20 {
				t.Errorf("the refused Txn allocated %d MiB and grew the heap by %d MiB, expected: far below its %d MiB answer", alloc>>20, growth>>20, n>>20)
			}
		})
	}
}

// TestAnswerCapCountsWhatIsSent: the cap counts the bytes an answer
// sends, to the byte: an answer exactly at the cap is sent, one byte
// under it is refused naming the answer's size; limit and keys_only
// count only what they send, so a Range over more than the cap passes
// with either; count_only sends no key. A DeleteRange's prev_kvs and a
// Txn's Ranges count the same way.
func TestAnswerCapCountsWhatIsSent(t *testing.T) {
	// What the Range of every key sends, from a server without a cap.
	ctx, f, kv := answerTest(t, 0)
	putValues(t, f, "k/", 16, 64<<10) // 1 MiB
	whole, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0")})
	if err != nil {
		t.Fatal(err)
	}
	size := sentBytes(whole)
	if len(whole.Kvs) != 16 || size < 1<<20 {
		t.Fatalf("the whole range: %d keys, %d bytes, expected: 16 keys over 1 MiB", len(whole.Kvs), size)
	}

	for _, tc := range []struct {
		name    string
		max     int64
		r       *pb.RangeRequest
		wantN   int  // keys sent
		refused bool // with size named
	}{
		{"the whole range at a cap of its size", size, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0")}, 16, false},
		{"the whole range at a cap one byte under", size - 1, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0")}, 0, true},
		{"sorted by value, descending, one byte under", size - 1, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_VALUE}, 0, true},
		{"limit 4 under a cap of a quarter", size / 4, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), Limit: 4}, 4, false},
		{"limit 4, sorted by mod revision descending, under a cap of a quarter", size / 4, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), Limit: 4, SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_MOD}, 4, false},
		{"keys_only under a cap of 1 KiB", 1 << 10, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), KeysOnly: true}, 16, false},
		{"count_only under a cap of 1 KiB", 1 << 10, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), CountOnly: true}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, f, kv := answerTest(t, int(tc.max))
			putValues(t, f, "k/", 16, 64<<10)
			resp, err := kv.Range(ctx, tc.r)
			if tc.refused {
				if n, ok := tooLarge(err, tc.max); !ok || n != size {
					t.Fatalf("got = %v, expected: larger than max (%d vs. %d)", err, size, tc.max)
				}
				return
			}
			if err != nil {
				t.Fatalf("got = %v, expected: %d keys", err, tc.wantN)
			}
			if len(resp.Kvs) != tc.wantN || resp.Count != 16 {
				t.Errorf("got = %d keys, count %d, expected: %d keys, count 16", len(resp.Kvs), resp.Count, tc.wantN)
			}
			if got := sentBytes(resp); got > tc.max {
				t.Errorf("sent %d bytes of keys and values, expected: at most the cap %d", got, tc.max)
			}
		})
	}

	t.Run("a Txn's Ranges and a DeleteRange's prev_kvs", func(t *testing.T) {
		ctx, f, kv := answerTest(t, int(size))
		putValues(t, f, "k/", 16, 64<<10)
		all := rangeOp("k/", "k0")
		if _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{all}}); err != nil {
			t.Errorf("a Txn of one Range at the cap: got = %v, expected: answered", err)
		}
		if _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{all, nestedTxn(rangeOp("k/000", ""))}}); err == nil {
			t.Error("a Txn of the Range and a nested one of one key more: answered, expected: refused")
		} else if _, ok := tooLarge(err, size); !ok {
			t.Errorf("a Txn past the cap: got = %v, expected: larger than max (N vs. %d)", err, size)
		}
		if resp, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), PrevKv: true}); err != nil || len(resp.PrevKvs) != 16 {
			t.Errorf("a DeleteRange whose prev_kvs are at the cap: got = %v, %v, expected: 16 prev_kvs", resp, err)
		}
	})
}

// TestALargeRangeUnderTheDefaultCapIsAnswered: the default cap leaves
// room for the lists clients make: 32 MiB of values in one Range are
// answered whole, as etcd answers them.
func TestALargeRangeUnderTheDefaultCapIsAnswered(t *testing.T) {
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	putValues(t, f, "big/", 32, 1<<20)
	resp, err := c.Get(ctx, "big/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("a Range of 32 MiB: got = %v, expected: answered", err)
	}
	if len(resp.Kvs) != 32 || len(resp.Kvs[31].Value) != 1<<20 {
		t.Errorf("got = %d keys, expected: all 32 with their 1 MiB values", len(resp.Kvs))
	}
}

// TestLeaseTimeToLiveKeysUnderTheCap: a lease may carry more keys than
// one answer may hold; TimeToLive with its keys is then refused with
// gRPC's error naming the size, before the answer is built, and without
// the keys it is answered.
func TestLeaseTimeToLiveKeysUnderTheCap(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, cappedBackend{f, 1 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return fmt.Sprintf("%s%03d", strings.Repeat("k", 97), i) }
	for i := range 9 { // 9 × 102 bytes: within 1 KiB
		putWithLease(t, f, key(i), g.ID)
	}
	resp, err := c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil || len(resp.Keys) != 9 {
		t.Fatalf("9 keys of 100 bytes under a 1 KiB cap: got = %v, %v, expected: the 9 keys", resp, err)
	}
	putWithLease(t, f, key(9), g.ID) // 10 × 102 bytes: 1,020, and one more is past it
	putWithLease(t, f, key(10), g.ID)
	_, err = c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if n, ok := tooLarge(err, 1<<10); !ok || n != 11*102 {
		t.Fatalf("11 keys of 100 bytes under a 1 KiB cap: got = %v, expected: ResourceExhausted naming %d bytes over %d", err, 11*102, 1<<10)
	}
	if plain, err := c.TimeToLive(ctx, g.ID); err != nil || plain.TTL <= 0 || len(plain.Keys) != 0 {
		t.Errorf("without keys: got = %v, %v, expected: its TTL and no keys", plain, err)
	}
}
