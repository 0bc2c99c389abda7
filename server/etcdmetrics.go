package server

import (
	"context"
	"crypto/x509"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// The etcd API's calls are requests like the native API's: they go into
// the same tenure_requests_total and tenure_request_duration_seconds,
// with the gRPC full method for a method label ("/etcdserverpb.KV/Range"
// beside "/tenure.v1.KVService/Get") and the code written as the native
// API writes it (connect's names, which are gRPC's codes by number:
// "ok", "permission_denied", ...), so that one query covers both front
// ends. A stream's duration is its lifetime, as for native streams.
//
// They are also counted under the names etcd serves, the
// grpc_server_* series of go-grpc-prometheus (grpc_server_started_total,
// grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code},
// grpc_server_handling_seconds, grpc_server_msg_received_total,
// grpc_server_msg_sent_total), so that dashboards and alerts built for
// etcd work unchanged. They go on the server's registry, as every
// Tenure series does.
//
// A call is counted once, by the node its client called. A follower
// that forwards a call to the leader counts it, and the leader, which
// sees the forwarding mark (from a node: etcdForwardedByNode), does not;
// the follower counts it in tenure_forwarded_calls_total too when the
// leader answered it, as the native API counts what it forwards. The
// follower learns that from the answer itself: every etcd answer's
// header names the member that answered it, so an answer whose member
// is another node's came from the leader. For a stream (LeaseKeepAlive,
// Observe, forwarded whole) the first such answer marks it.

// newEtcdServerMetrics is etcd's grpc_server_* series, with the
// handling-time histogram that etcd serves under --metrics=extensive.
func newEtcdServerMetrics() *grpcprom.ServerMetrics {
	return grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
}

// etcdMetricsUnary counts and times a unary etcd call. It is the first of
// the etcd API's interceptors, so that it sees every call's outcome:
// refused by authentication, answered here, or forwarded.
func (s *Server) etcdMetricsUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.etcdForwardedByNode(ctx) {
		return handler(ctx, req) // counted by the node the client called
	}
	start := time.Now()
	res, err := s.metrics.etcdUnary(ctx, req, info, handler)
	s.metrics.record(info.FullMethod, grpcCodeName(err), start)
	if err == nil && s.answeredElsewhere(res) {
		s.metrics.forwarded.Inc()
	}
	return res, err
}

// etcdMetricsStream is etcdMetricsUnary for streams: the duration is the
// stream's lifetime, the code its end's.
func (s *Server) etcdMetricsStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.etcdForwardedByNode(ss.Context()) {
		return handler(srv, ss)
	}
	start := time.Now()
	if !etcdLeaderStreams[info.FullMethod] {
		err := s.metrics.etcdStream(srv, ss, info, handler)
		s.metrics.record(info.FullMethod, grpcCodeName(err), start)
		return err
	}
	// Only these are forwarded whole: the rest (Watch, Snapshot) never
	// pay for looking at their answers.
	watched := &answerWatcher{ServerStream: ss, s: s}
	err := s.metrics.etcdStream(srv, watched, info, handler)
	s.metrics.record(info.FullMethod, grpcCodeName(err), start)
	if watched.elsewhere.Load() {
		s.metrics.forwarded.Inc()
	}
	return err
}

// etcdForwardedByNode reports whether the etcd call of ctx was forwarded
// here by another node: it carries the forwarding mark and, under a
// policy, comes with a node's certificate, as the leader believes a
// forwarded principal only from one; so a client cannot hide its calls
// from the metrics by claiming the mark. Only a call with the mark pays
// for checking the certificate. Without a policy every caller is
// trusted with everything anyway.
func (s *Server) etcdForwardedByNode(ctx context.Context) bool {
	if !forwardedCall(ctx) {
		return false
	}
	if !s.policyOn() {
		return true
	}
	var chain []*x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			chain = ti.State.PeerCertificates
		}
	}
	return s.auth.authn.AuthenticateEtcd(chain, "", "").Peer
}

// answerWatcher notes whether a stream sent an answer another member
// gave: the stream was forwarded to the leader.
type answerWatcher struct {
	grpc.ServerStream
	s         *Server
	elsewhere atomic.Bool
}

func (w *answerWatcher) SendMsg(m any) error {
	if !w.elsewhere.Load() && w.s.answeredElsewhere(m) {
		w.elsewhere.Store(true)
	}
	return w.ServerStream.SendMsg(m)
}

// answeredElsewhere reports whether res, an etcd answer, was given by
// another member: its header names the member that answered.
func (s *Server) answeredElsewhere(res any) bool {
	h, ok := res.(interface{ GetHeader() *pb.ResponseHeader })
	if !ok || h.GetHeader() == nil || h.GetHeader().MemberId == 0 {
		return false
	}
	return h.GetHeader().MemberId != memberID(s.node.ID())
}

// grpcCodeName is the code of a gRPC call that ended with err, as the
// native API writes codes: "ok", or connect's name of the code, which is
// gRPC's by number. A handler's error that is not a status is what gRPC
// sends for it: a context's error as its code, anything else Unknown.
func grpcCodeName(err error) string {
	c := grpcprom.FromError(err).Code()
	if c == codes.OK {
		return "ok"
	}
	return connect.Code(c).String()
}
