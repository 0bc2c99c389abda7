package etcdapi

import (
	"context"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tenurehq/tenure/statemachine"
)

// Request sizes, bounded as etcd bounds them. etcd bounds no key or value
// on its own: it refuses a request whose raft entry (the request and a
// header) would be larger than its --max-request-bytes, 1.5 MiB by
// default, with "etcdserver: request is too large", and lets gRPC read a
// message up to that plus 512 KiB, so that a request a little too large
// gets etcd's error rather than gRPC's. So a key may be as long, and a
// value as large, as the request that carries it allows, and a Txn's
// operations share one request's bytes. etcd checks only what it puts
// in its log: a Range, or a Txn that only reads, is bounded by gRPC's
// limit alone.
//
// Answers are bounded in bytes where etcd leaves them to gRPC's largest
// message (2 GiB): see answerBudget.

// DefaultMaxRequestBytes is etcd's default --max-request-bytes.
const DefaultMaxRequestBytes = 1572864 // 1.5 MiB

const (
	// grpcOverheadBytes is etcd's: what gRPC reads beyond the limit,
	// so that a request a little over it is read and refused with
	// etcd's error.
	grpcOverheadBytes = 512 * 1024
	// raftHeaderBytes is what etcd's entry adds to a request: its
	// RequestHeader (field 100: a 2-byte tag, a length, and an ID of up
	// to 10 bytes with its tag). etcd's IDs carry the member ID in
	// their top bits, so the largest is counted: Tenure refuses a
	// request no later than any etcd member would. An etcd user name,
	// which etcd adds under auth, is not counted.
	raftHeaderBytes = 2 + 1 + 1 + 10
)

// ServerOptions are etcd's gRPC server settings for requests of at most
// maxRequestBytes: gRPC reads up to 512 KiB more, a request whose entry
// would be larger is refused with etcd's "request is too large"
// (InvalidArgument) before it reaches a handler, changing nothing, and
// answers may be as large as gRPC allows. Their interceptor is the
// first of the server's: it runs before authentication and before a
// follower forwards the call, so a request too large is refused by the
// node it reaches.
func ServerOptions(maxRequestBytes int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRequestBytes + grpcOverheadBytes),
		grpc.MaxSendMsgSize(math.MaxInt32),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if n, logged := EntrySize(req); logged && n > maxRequestBytes {
				return nil, rpctypes.ErrGRPCRequestTooLarge
			}
			return handler(ctx, req)
		}),
	}
}

// EntrySize is the size of the raft entry etcd would write for req, as
// etcd measures it against --max-request-bytes, and whether etcd writes
// one at all: not for a Range, nor for a Txn that only reads. A Put,
// DeleteRange or Txn counts exactly as etcd's InternalRaftRequest does
// (with the largest header); the recipes' calls (Lock, Campaign,
// Proclaim) count their own request, where etcd counts the Txn its
// recipe makes of it, which holds a lock's name seven times.
func EntrySize(req any) (int, bool) {
	switch r := req.(type) {
	case *pb.RangeRequest:
		return 0, false
	case *pb.TxnRequest:
		if txnReadOnly(r) {
			return 0, false
		}
	}
	m, ok := req.(interface{ Size() int })
	if !ok {
		return 0, false
	}
	n := m.Size()
	// The request is one field of the entry: a tag (1 byte for the KV,
	// lease and compaction requests, numbered below 16) and a length.
	return raftHeaderBytes + 1 + protowire.SizeVarint(uint64(n)) + n, true
}

// txnReadOnly is etcd's isTxnReadonly: every operation of both branches
// is a Range (a nested Txn counts as a write).
func txnReadOnly(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if op.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}

// Txn operations. etcd's --max-txn-ops (128) bounds each level of a Txn
// on its own: the largest of its compares and each branch, a nested Txn
// getting what its level left. So a Txn of 4 nested Txns of 124 Ranges
// each passes, and nesting 64 deep with 64 operations a level, and each
// of those Ranges may return the whole keyspace: one 36 KB request built
// a 260 MB answer. Tenure counts one Txn against one limit, over every
// level: a level counts as etcd counts it (the largest of its compares
// and its branches), but a branch counts its own operations and, for
// each nested Txn in it, that Txn's count. A Txn without nesting is
// refused exactly when etcd refuses it; a nested one may be refused
// where etcd would take it (100 puts and a nested Txn of 28 in one
// branch), which no client we know of sends. Nesting is bounded by the
// same count, since each level is an operation of the one above: a Txn
// nested more than 127 deep is too many operations.

// maxTxnOps is etcd's default --max-txn-ops: the most compares and
// operations a Txn may have, counted over all its levels (txnOps).
const maxTxnOps = 128

// txnOps counts r's compares and operations as checkTxn bounds them:
// the largest of its compares and each branch, a branch being its
// operations plus the count of each Txn nested in it. It stops counting
// once the count passes limit, and then returns a count over limit, so
// that neither a huge nor a deep request costs more than limit steps of
// recursion.
func txnOps(r *pb.TxnRequest, limit int) int {
	n := len(r.Compare)
	if n > limit {
		return n
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		branch := len(ops)
		for _, op := range ops {
			if branch > limit {
				break
			}
			if t := op.GetRequestTxn(); t != nil {
				branch += txnOps(t, limit-branch)
			}
		}
		n = max(n, branch)
		if n > limit {
			break
		}
	}
	return n
}

// Answers. etcd's gRPC server sends answers up to gRPC's largest message
// (math.MaxInt32) and its clients take them (clientv3's
// MaxCallRecvMsgSize defaults to the same): a Range of a large keyspace
// is answered whole, built whole in memory first, twice (the messages
// and their encoding). So is a Txn's, whose Ranges may each read the
// same keys again. Tenure bounds the bytes of one answer's keys and
// values by a cap, --etcd-max-response-bytes, and counts them as it
// reads, so that an answer over the cap is refused without being built:
// with the error etcd's clients get from gRPC for a message over its
// send limit, ResourceExhausted "grpc: trying to send message larger
// than max (N vs. M)", N the bytes of the keys and values the answer
// would hold, M the cap.
//
// DefaultMaxResponseBytes, 128 MiB, is sized for Kubernetes, the
// largest etcd client: kube-apiserver lists from etcd in pages of
// 10,000 objects (its cacher's storageWatchListPageSize; clients' own
// lists are paged by 500 by default), which fit at 13 KiB an object,
// several times the size of a typical Pod or Node as kube-apiserver
// stores them (protobuf). An answer costs about three times its size
// while it is sent (the messages, their encoding, the transport's
// frames), so 128 MiB keeps one call under half a GiB; issue 29's Txn
// of 496 Ranges of the same 512 KiB (248 MiB) is refused. A cluster
// whose pages are larger raises the flag; one whose memory is tight
// lowers it.

// DefaultMaxResponseBytes is the default --etcd-max-response-bytes.
const DefaultMaxResponseBytes = 128 << 20

// maxResponseBytes is b's cap on an answer's keys and values
// (Backend.MaxResponseBytes; 0 is DefaultMaxResponseBytes).
func maxResponseBytes(b Backend) int64 {
	if n := b.MaxResponseBytes(); n > 0 {
		return int64(n)
	}
	return DefaultMaxResponseBytes
}

// answerBudget counts the bytes of the keys and values one answer
// carries, a Range's or a Txn's over all its Ranges and prev_kvs,
// against the cap. Its user asks take before it converts a key into
// the answer, and converts nothing once over() is true, nor at all while
// the budget is sizing (a first pass that only counts, for answers
// built in parts, a Txn's); it goes on counting, so that the error says
// how large the answer would have been. One goroutine uses it.
type answerBudget struct {
	max    int64
	used   int64
	sizing bool
}

func newAnswerBudget(max int64) *answerBudget { return &answerBudget{max: max} }

// building reports whether the answer is being built: not sizing, and
// within the cap so far.
func (b *answerBudget) building() bool { return !b.sizing && !b.over() }

// take counts the bytes kv takes in an answer (without its value for
// keys_only) and reports whether the answer is still within the cap.
func (b *answerBudget) take(kv *statemachine.KeyValue, keysOnly bool) bool {
	b.used += int64(kvBytes(kv, keysOnly))
	return !b.over()
}

func (b *answerBudget) over() bool { return b.used > b.max }

// takeKeys counts keys as a repeated bytes field of an answer takes
// them (LeaseTimeToLive's keys) and reports whether the answer is still
// within the cap.
func (b *answerBudget) takeKeys(keys []string) bool {
	for _, k := range keys {
		b.used += int64(1 + protowire.SizeBytes(len(k)))
	}
	return !b.over()
}

// err is gRPC's refusal of an answer over its send limit, as etcd's
// clients know it, with the cap for the limit.
func (b *answerBudget) err() error {
	return status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", b.used, b.max)
}

// kvBytes is what kv takes in an answer: its mvccpb.KeyValue as encoded
// in a repeated field (a tag, a length, and the message), without the
// value when keysOnly. It is the answer's size within the few bytes of
// its header and counts.
func kvBytes(kv *statemachine.KeyValue, keysOnly bool) int {
	n := 0
	bytesField := func(l int) {
		if l > 0 {
			n += 1 + protowire.SizeBytes(l)
		}
	}
	intField := func(v int64) {
		if v != 0 {
			n += 1 + protowire.SizeVarint(uint64(v))
		}
	}
	bytesField(len(kv.Key))
	intField(kv.CreateRevision)
	intField(kv.ModRevision)
	intField(kv.Version)
	if !keysOnly {
		bytesField(len(kv.Value))
	}
	intField(kv.EtcdLease())
	return 1 + protowire.SizeBytes(n)
}
