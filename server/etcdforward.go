package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/statemachine"
)

// A follower serves what its own state can answer (serializable reads,
// watches, status) and forwards the rest to the leader's etcd API, as
// the native API forwards: the caller never learns which node leads.
// Unary calls are tried here first and forwarded when they fail for want
// of the leader. Election observation, a stream that needs the leader,
// is forwarded whole when it opens; a lease keep-alive stream is relayed
// to whichever node leads for as long as it lasts (etcdkeepalive.go).

// etcdForwardedKey marks a forwarded call: it is never forwarded again,
// so two nodes that each think the other leads cannot pass a call back
// and forth.
const etcdForwardedKey = "tenure-forwarded-by"

// etcdPrincipalKey is auth.ForwardedPrincipalHeader as gRPC metadata:
// the leader believes it only from a node's certificate.
var etcdPrincipalKey = strings.ToLower(auth.ForwardedPrincipalHeader)

// etcdReplies makes an empty reply of each unary method a follower may
// have to forward.
var etcdReplies = map[string]func() any{
	"/etcdserverpb.KV/Range":               func() any { return new(pb.RangeResponse) },
	"/etcdserverpb.KV/Put":                 func() any { return new(pb.PutResponse) },
	"/etcdserverpb.KV/DeleteRange":         func() any { return new(pb.DeleteRangeResponse) },
	"/etcdserverpb.KV/Txn":                 func() any { return new(pb.TxnResponse) },
	"/etcdserverpb.KV/Compact":             func() any { return new(pb.CompactionResponse) },
	"/etcdserverpb.Maintenance/Alarm":      func() any { return new(pb.AlarmResponse) },
	"/etcdserverpb.Maintenance/MoveLeader": func() any { return new(pb.MoveLeaderResponse) },
	"/etcdserverpb.Cluster/MemberAdd":      func() any { return new(pb.MemberAddResponse) },
	"/etcdserverpb.Cluster/MemberRemove":   func() any { return new(pb.MemberRemoveResponse) },
	"/etcdserverpb.Cluster/MemberUpdate":   func() any { return new(pb.MemberUpdateResponse) },
	"/etcdserverpb.Cluster/MemberPromote":  func() any { return new(pb.MemberPromoteResponse) },
	"/etcdserverpb.Lease/LeaseGrant":       func() any { return new(pb.LeaseGrantResponse) },
	"/etcdserverpb.Lease/LeaseRevoke":      func() any { return new(pb.LeaseRevokeResponse) },
	"/etcdserverpb.Lease/LeaseTimeToLive":  func() any { return new(pb.LeaseTimeToLiveResponse) },
	"/etcdserverpb.Lease/LeaseLeases":      func() any { return new(pb.LeaseLeasesResponse) },
	"/v3lockpb.Lock/Lock":                  func() any { return new(v3lockpb.LockResponse) },
	"/v3lockpb.Lock/Unlock":                func() any { return new(v3lockpb.UnlockResponse) },
	"/v3electionpb.Election/Campaign":      func() any { return new(v3electionpb.CampaignResponse) },
	"/v3electionpb.Election/Proclaim":      func() any { return new(v3electionpb.ProclaimResponse) },
	"/v3electionpb.Election/Leader":        func() any { return new(v3electionpb.LeaderResponse) },
	"/v3electionpb.Election/Resign":        func() any { return new(v3electionpb.ResignResponse) },
}

// etcdLeaderStreams are the streams that need the leader from the start.
var etcdLeaderStreams = map[string]bool{
	"/etcdserverpb.Lease/LeaseKeepAlive": true,
	"/v3electionpb.Election/Observe":     true,
}

// Sync is syncLocal: a follower's etcd watch from a revision is
// answered as of every write acknowledged before it.
func (b etcdBackend) Sync(ctx context.Context) { b.s.syncLocal(ctx) }

func (s *Server) etcdUnaryInterceptors() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{s.etcdUnaryAuth(), s.etcdForwardUnary}
}

func (s *Server) etcdStreamInterceptors() []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{s.etcdStreamAuth(), s.etcdForwardStream}
}

// etcdNoLeaderKey is set in the trailer of a forwarded call's answer
// when the node it reached answered it for want of the leader, so that
// the follower tells that from every other answer, whatever code and
// text etcd gives it for the method (Unavailable for KV, codes.Unknown
// for Lock and Election, as etcd's concurrency errors are). Only nodes
// read it: a client's own calls never get it.
const etcdNoLeaderKey = "tenure-no-leader"

// etcdAppliedKey is the trailer in which the leader answers a forwarded
// call with its applied index, which covers what the call wrote. The
// follower waits until it has applied that far before it answers, as
// etcd's member waits for its own apply of a write it proposed, so that
// a client's serializable read on the member it wrote through sees the
// write (read your writes on one member). Only nodes read it.
const etcdAppliedKey = "tenure-applied-index"

// forwardedApplyWait bounds that wait: a follower cut off after the
// leader answered still answers, as before this wait.
const forwardedApplyWait = leaderWait

// isNoLeader reports whether err, a handler's answer here, is that of a
// node that needed the leader and is not it: etcdapi's answers keep the
// condition (etcdapi.ErrNotLeader) for the server that sends them.
func isNoLeader(err error) bool { return errors.Is(err, etcdapi.ErrNotLeader) }

func (s *Server) etcdForwardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	newReply, forwardable := etcdReplies[info.FullMethod]
	forwarded := forwardedCall(ctx)
	forwardable = forwardable && !forwarded
	// Right after an election the leader may not be promoted yet, or
	// its etcd address not yet known to its followers: etcd clients do
	// not retry a refused write, so the call waits for the leader a
	// while, as etcd's server waits for one. "no leader" means nothing
	// was done, so trying again is safe.
	deadline := time.Now().Add(leaderWait)
	for {
		res, err := handler(ctx, req)
		if !isNoLeader(err) {
			if forwarded && err == nil {
				_ = grpc.SetTrailer(ctx, metadata.Pairs(etcdAppliedKey, strconv.FormatUint(s.node.AppliedIndex(), 10)))
			}
			return res, err
		}
		if forwardable {
			if conn, cerr := s.etcdLeaderConn(ctx); cerr == nil {
				reply := newReply()
				var trailer metadata.MD
				ferr := conn.Invoke(s.etcdForwardContext(ctx), info.FullMethod, req, reply, grpc.Trailer(&trailer))
				if ferr == nil {
					s.waitForwardedApplied(ctx, trailer)
					return reply, nil
				}
				if len(trailer.Get(etcdNoLeaderKey)) == 0 {
					return nil, ferr // the leader's answer, as it gave it
				}
			}
		}
		if time.Now().After(deadline) {
			return etcdNoLeader(ctx, forwarded, res, err)
		}
		select {
		case <-ctx.Done():
			return etcdNoLeader(ctx, forwarded, res, err)
		case <-s.stopC:
			return etcdNoLeader(ctx, forwarded, res, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitForwardedApplied waits, for at most forwardedApplyWait, until this
// node has applied what the leader said a forwarded call's answer
// covers (etcdAppliedKey); a leader of an older build says nothing.
func (s *Server) waitForwardedApplied(ctx context.Context, trailer metadata.MD) {
	v := trailer.Get(etcdAppliedKey)
	if len(v) == 0 {
		return
	}
	idx, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, forwardedApplyWait)
	defer cancel()
	if err := s.node.WaitApplied(ctx, idx); err != nil {
		s.log.Debug("answering a forwarded etcd call before this node applied it", "index", idx, "err", err)
	}
}

// etcdNoLeader answers a call for want of the leader with the handler's
// answer, res and err, marked as such for the follower that forwarded
// it.
func etcdNoLeader(ctx context.Context, forwarded bool, res any, err error) (any, error) {
	if forwarded {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(etcdNoLeaderKey, "1"))
	}
	return res, err
}

// leaderWait bounds how long an etcd call waits for a leader to serve it:
// about an election and a promotion.
const leaderWait = 3 * time.Second

func (s *Server) etcdForwardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !etcdLeaderStreams[info.FullMethod] {
		return handler(srv, ss)
	}
	if forwardedCall(ss.Context()) {
		err := handler(srv, ss)
		if isNoLeader(err) {
			// The forwarding node waits for the leader and asks again.
			ss.SetTrailer(metadata.Pairs(etcdNoLeaderKey, "1"))
		}
		return err
	}
	if info.FullMethod == etcdKeepAliveMethod {
		return s.etcdRelayKeepAlive(srv, ss, handler)
	}
	if s.leading.Load() {
		return handler(srv, ss)
	}
	conn, err := s.etcdLeaderConn(ss.Context())
	if err != nil {
		return handler(srv, ss) // answered here: it fails as etcd would without a leader
	}
	ctx, cancel := context.WithCancel(s.etcdForwardContext(ss.Context()))
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: info.FullMethod, ServerStreams: info.IsServerStream, ClientStreams: info.IsClientStream}
	up, err := conn.NewStream(ctx, desc, info.FullMethod)
	if err != nil {
		return err
	}
	return pipeStreams(ss, up, info.FullMethod)
}

// pipeStreams copies the caller's messages to the leader and the
// leader's back until either side ends; the leader's error is the
// caller's.
func pipeStreams(down grpc.ServerStream, up grpc.ClientStream, method string) error {
	newReq, newRes := streamMessages(method)
	upDone := make(chan error, 1)
	go func() {
		for {
			m := newReq()
			if err := down.RecvMsg(m); err != nil {
				_ = up.CloseSend()
				if errors.Is(err, io.EOF) {
					err = nil
				}
				upDone <- err
				return
			}
			if err := up.SendMsg(m); err != nil {
				upDone <- nil // the leader's side ends the call with its error
				return
			}
		}
	}()
	for {
		m := newRes()
		if err := up.RecvMsg(m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := down.SendMsg(m); err != nil {
			return err
		}
	}
}

func streamMessages(method string) (req, res func() any) {
	switch method {
	case "/v3electionpb.Election/Observe":
		return func() any { return new(v3electionpb.LeaderRequest) }, func() any { return new(v3electionpb.LeaderResponse) }
	}
	panic(fmt.Sprintf("server: no messages known for stream %s", method))
}

// forwardedCall reports whether another node forwarded the call. It
// looks up the one key: FromIncomingContext copies every header of the
// call, which every etcd call paid twice (here and in the metrics), 7 %
// of the server's allocation at 64 goroutines through etcd's client.
func forwardedCall(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, etcdForwardedKey)) > 0
}

// etcdForwardContext is the outgoing context of a forwarded call: the
// caller's credentials, this node's mark, and the principal it
// authenticated, which the leader takes only from a node's certificate.
func (s *Server) etcdForwardContext(ctx context.Context) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for _, k := range []string{rpctypes.TokenFieldNameGRPC, "authorization"} {
		if v := in.Get(k); len(v) > 0 {
			out.Set(k, v...)
		}
	}
	out.Set(etcdForwardedKey, s.node.ID())
	if c, ok := callerOf(ctx); ok && c.Principal != "" && c.Err == nil {
		out.Set(etcdPrincipalKey, c.Principal)
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// etcdConns holds one connection per leader etcd address.
type etcdConns struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func (c *etcdConns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

// etcdLeaderConn is a connection to the leader's etcd API.
func (s *Server) etcdLeaderConn(ctx context.Context) (*grpc.ClientConn, error) {
	_, id := s.node.Leader()
	return s.etcdConn(id)
}

// etcdLeaderConnOf is etcdLeaderConn with the ID of the leader it
// reaches; ok is false when no other node is known to lead, or the
// leader serves no etcd API yet.
func (s *Server) etcdLeaderConnOf() (conn *grpc.ClientConn, leader string, ok bool) {
	_, leader = s.node.Leader()
	conn, err := s.etcdConn(leader)
	return conn, leader, err == nil
}

// etcdConn is a connection to the etcd API of node id.
func (s *Server) etcdConn(id string) (*grpc.ClientConn, error) {
	if id == "" || id == s.node.ID() {
		return nil, errors.New("no other node leads")
	}
	var addr string
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		addr, _ = m.MemberEtcdAddress(id)
		return nil
	})
	if addr == "" {
		return nil, fmt.Errorf("the leader %s serves no etcd API", id)
	}
	s.etcdPeers.mu.Lock()
	defer s.etcdPeers.mu.Unlock()
	if conn, ok := s.etcdPeers.conns[addr]; ok {
		return conn, nil
	}
	creds := insecure.NewCredentials()
	if s.cfg.PeerAPITLS != nil {
		creds = credentials.NewTLS(s.cfg.PeerAPITLS.Clone())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), etcdForwardSizes)
	if err != nil {
		return nil, err
	}
	if s.etcdPeers.conns == nil {
		s.etcdPeers.conns = map[string]*grpc.ClientConn{}
	}
	s.etcdPeers.conns[addr] = conn
	return conn, nil
}
