package etcdapi

import (
	"context"
	"errors"
	"io"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// maxLeaseTTL is etcd's own bound on a lease's TTL in seconds
// (lease.MaxLeaseTTL); the Backend's SessionTTL may bound it lower.
const maxLeaseTTL = 9_000_000_000

// leaseLabels mark the sessions the etcd API opened, for the native
// API's listings; every session is an etcd lease all the same.
var leaseLabels = map[string]string{"api": "etcd"}

// leaseServer serves etcd's Lease service. An etcd lease is a session:
// grant opens one, revoke closes it (which deletes its keys in the same
// log entry), keep-alive renews it through the leader's lessor as a
// heartbeat does, and its expiry follows Tenure's rules.
type leaseServer struct {
	pb.UnimplementedLeaseServer
	b Backend
}

func newLease(b Backend) *leaseServer { return &leaseServer{b: b} }

// LeaseGrant opens a session. etcd refuses a TTL above its maximum and
// raises one below its minimum; the Backend's SessionTTL sets both
// here, and a TTL above its maximum gets etcd's same "too large lease
// TTL" error, since that is what etcd clients know to expect.
func (ls *leaseServer) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	id, ttl, rev, err := grantLease(ctx, ls.b, r.TTL, r.ID)
	if err != nil {
		return nil, err
	}
	return &pb.LeaseGrantResponse{Header: header(ls.b, rev), ID: id, TTL: ttl}, nil
}

// grantLease opens a session for an etcd lease of ttl seconds with
// etcd lease ID id (0: the server picks) and returns the lease's ID, the
// TTL granted in seconds and the KV revision after it.
func grantLease(ctx context.Context, b Backend, ttl, id int64) (leaseID, granted, rev int64, err error) {
	if id < 0 {
		// etcd takes any nonzero ID; Tenure's state machine names leases
		// by positive IDs only.
		return 0, 0, 0, status.Errorf(codes.InvalidArgument, "etcdserver: lease ID %d is negative: Tenure takes positive lease IDs", id)
	}
	if ttl > maxLeaseTTL {
		return 0, 0, 0, rpctypes.ErrGRPCLeaseTTLTooLarge
	}
	minTTL, maxTTL := b.SessionTTL()
	// Whole seconds, rounded up, so that the TTL the response names is
	// the session's own and never longer than it.
	if floor := int64((minTTL + time.Second - 1) / time.Second); ttl < floor {
		ttl = floor
	}
	if time.Duration(ttl)*time.Second > maxTTL {
		return 0, 0, 0, rpctypes.ErrGRPCLeaseTTLTooLarge
	}
	res, err := b.Propose(ctx, statemachine.OpenSession{
		Identity: b.Identity(ctx),
		TTL:      int64(time.Duration(ttl) * time.Second),
		Labels:   leaseLabels,
		LeaseID:  id,
	})
	if err != nil {
		return 0, 0, 0, toGRPC(err)
	}
	if res.Session == nil {
		return 0, 0, 0, status.Error(codes.Internal, "etcdserver: opening the lease's session returned no session")
	}
	return res.Session.EtcdLeaseID(), ttl, res.KVRevision, nil
}

// LeaseRevoke closes the session of the lease; the caller needs write
// access to every key attached to it, as in etcd.
func (ls *leaseServer) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	s, keys, _, err := ls.lookup(ctx, false, r.ID)
	if err != nil {
		return nil, err
	}
	if err := authorizeKeys(ctx, ls.b, VerbWrite, keys); err != nil {
		return nil, err
	}
	res, err := ls.b.Propose(ctx, statemachine.CloseSession{SessionID: s.ID})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.LeaseRevokeResponse{Header: header(ls.b, res.KVRevision)}, nil
}

// lookup finds the session of etcd lease id and the keys attached to it,
// with the KV revision of the read; rpctypes.ErrGRPCLeaseNotFound when
// no session answers to it.
func (ls *leaseServer) lookup(ctx context.Context, serializable bool, id int64) (statemachine.Session, []string, int64, error) {
	var (
		s     statemachine.Session
		found bool
		keys  []string
		rev   int64
	)
	err := ls.b.Read(ctx, serializable, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		if s, found = m.SessionByLease(id); found {
			keys = m.SessionKeys(s.ID)
		}
		return nil
	})
	if err != nil {
		return s, nil, 0, toGRPC(err)
	}
	if !found {
		return s, nil, rev, rpctypes.ErrGRPCLeaseNotFound
	}
	return s, keys, rev, nil
}

// authorizeKeys checks verb on each key, as etcd's auth store checks a
// lease's keys one by one.
func authorizeKeys(ctx context.Context, b Backend, verb Verb, keys []string) error {
	for _, k := range keys {
		if err := b.Authorize(ctx, verb, k, ""); err != nil {
			return toGRPC(err)
		}
	}
	return nil
}

// LeaseKeepAlive renews leases for as long as the client sends. As in
// etcd, a lease that is gone is answered with TTL 0 rather than an
// error, and the stream ends when the client's context does or the
// node stops.
func (ls *leaseServer) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	// Recv does not watch the node's stop, so the loop runs apart and the
	// handler returns on whichever comes first; returning ends the stream,
	// which ends a Recv in progress.
	errc := make(chan error, 1)
	go func() { errc <- ls.keepAlive(stream) }()
	select {
	case err := <-errc:
		return err
	case <-stream.Context().Done():
		return toGRPC(stream.Context().Err())
	case <-ls.b.Done():
		return rpctypes.ErrGRPCStopped
	}
}

func (ls *leaseServer) keepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		// The header is read before the renewal, as etcd does, so that
		// its revision is never past one at which the lease was revoked.
		s, keys, rev, err := ls.lookup(ctx, true, req.ID)
		if errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
			// This node may not have applied the grant yet (a client
			// keeps a lease alive right after granting it): only the
			// leader's state tells that the lease is gone.
			s, keys, _, err = ls.lookup(ctx, false, req.ID)
		}
		resp := &pb.LeaseKeepAliveResponse{Header: header(ls.b, rev), ID: req.ID}
		switch {
		case errors.Is(err, rpctypes.ErrGRPCLeaseNotFound):
		case err != nil:
			return err
		default:
			if err := authorizeKeys(ctx, ls.b, VerbWrite, keys); err != nil {
				return err
			}
			ttl, err := ls.b.Renew(ctx, s.ID)
			switch {
			case errors.Is(err, statemachine.ErrSessionNotFound):
			case err != nil:
				return toGRPC(err)
			default:
				resp.TTL = int64(ttl / time.Second)
			}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// LeaseTimeToLive reports a lease's remaining and granted TTL in whole
// seconds, rounded down as etcd does, and its keys when asked (which
// needs read access to each). A lease that is gone is answered with
// TTL -1, not an error, as etcd does.
func (ls *leaseServer) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	s, keys, rev, err := ls.lookup(ctx, false, r.ID)
	gone := &pb.LeaseTimeToLiveResponse{Header: header(ls.b, rev), ID: r.ID, TTL: -1}
	if errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
		return gone, nil
	}
	if err != nil {
		return nil, err
	}
	if !ls.b.MaySee(ctx, s) {
		return gone, nil // another principal's lease is no one's here
	}
	if r.Keys {
		if err := authorizeKeys(ctx, ls.b, VerbRead, keys); err != nil {
			return nil, err
		}
		// A lease may carry more keys than an answer may: refused, as
		// a Range past the cap is, before the answer is built.
		if b := newAnswerBudget(maxResponseBytes(ls.b)); !b.takeKeys(keys) {
			return nil, b.err()
		}
	}
	left, err := ls.b.Remaining(ctx, s.ID)
	if errors.Is(err, statemachine.ErrSessionNotFound) {
		return gone, nil
	}
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := &pb.LeaseTimeToLiveResponse{
		Header:     header(ls.b, rev),
		ID:         r.ID,
		TTL:        int64(left.Seconds()),
		GrantedTTL: int64(time.Duration(s.TTL) / time.Second),
	}
	if r.Keys {
		resp.Keys = make([][]byte, len(keys))
		for i, k := range keys {
			resp.Keys[i] = []byte(k)
		}
	}
	return resp, nil
}

// LeaseLeases lists every session the caller may see (Backend.MaySee),
// whichever API opened it, by its etcd lease ID. As in etcd, the caller
// needs read access to every key attached to any of them.
func (ls *leaseServer) LeaseLeases(ctx context.Context, _ *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	var (
		leases []*pb.LeaseStatus
		keys   []string
		rev    int64
	)
	err := ls.b.Read(ctx, false, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		for _, s := range m.Sessions() {
			if !ls.b.MaySee(ctx, s) {
				continue
			}
			leases = append(leases, &pb.LeaseStatus{ID: s.EtcdLeaseID()})
			keys = append(keys, m.SessionKeys(s.ID)...)
		}
		return nil
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	if err := authorizeKeys(ctx, ls.b, VerbRead, keys); err != nil {
		return nil, err
	}
	if leases == nil {
		leases = []*pb.LeaseStatus{}
	}
	return &pb.LeaseLeasesResponse{Header: header(ls.b, rev), Leases: leases}, nil
}
