package etcdapi

import (
	"context"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
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
// limit alone. Answers are unbounded (gRPC's largest message), as etcd
// sends them: a Range may return many values of a megabyte.

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
