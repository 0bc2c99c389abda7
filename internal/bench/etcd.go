package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Key prefixes of the etcd recipes: the concurrency package keeps a
// lock's or election's contenders as keys under a prefix, one per
// session.
const (
	etcdLockPrefix     = "/bench/lock/"
	etcdElectionPrefix = "/bench/election/"
	etcdHeldPrefix     = "/bench/held/"
)

type etcdConn struct {
	c    *clientv3.Client
	acks *ackTracker // nil unless dialled with trackAcks
}

func dialEtcd(ctx context.Context, endpoints []string, o dialOptions) (conn, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		Context:     ctx,
	}
	var acks *ackTracker
	if o.trackAcks {
		acks = &ackTracker{sent: map[int64][]time.Time{}, acked: map[int64]time.Time{}}
		cfg.DialOptions = []grpc.DialOption{grpc.WithChainStreamInterceptor(acks.intercept)}
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return &etcdConn{c: c, acks: acks}, nil
}

func (e *etcdConn) session(ctx context.Context, ttl time.Duration) (session, error) {
	secs := int(ttl / time.Second)
	if secs < 1 || ttl%time.Second != 0 {
		return nil, fmt.Errorf("etcd lease TTLs are whole seconds, not %v", ttl)
	}
	opened := time.Now()
	// The session's keep-alives run under ctx, so that ending the
	// workload ends them even if close is never reached.
	s, err := concurrency.NewSession(e.c, concurrency.WithTTL(secs), concurrency.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	return &etcdSession{s: s, e: e, opened: opened}, nil
}

func (e *etcdConn) get(ctx context.Context, key string) (int64, error) {
	resp, err := e.c.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

func (e *etcdConn) cas(ctx context.Context, key string, rev int64, value string) (int64, error) {
	resp, err := e.c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, value)).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: %s is not at revision %d", errCompareFailed, key, rev)
	}
	return resp.Header.Revision, nil
}

func (e *etcdConn) put(ctx context.Context, key, value string) error {
	_, err := e.c.Put(ctx, key, value)
	return err
}

// idleSession grants a lease and keeps nothing alive: LeaseGrant alone.
func (e *etcdConn) idleSession(ctx context.Context, ttl time.Duration) error {
	_, err := e.c.Grant(ctx, int64(ttl/time.Second))
	return err
}

func (e *etcdConn) campaigners(ctx context.Context, name string) (int, error) {
	resp, err := e.c.Get(ctx, etcdElectionPrefix+name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// close closes the client, which stops the keep-alives of its sessions
// without revoking their leases.
func (e *etcdConn) close() error { return e.c.Close() }

type etcdSession struct {
	s      *concurrency.Session
	e      *etcdConn
	opened time.Time // before the lease was granted
}

func (s *etcdSession) mutex(name string) locker {
	return etcdMutex{concurrency.NewMutex(s.s, etcdLockPrefix+name)}
}

func (s *etcdSession) election(name string) elector {
	return etcdElection{concurrency.NewElection(s.s, etcdElectionPrefix+name)}
}

// grant locks a free Mutex: one transaction, like Tenure's one Acquire.
func (s *etcdSession) grant(ctx context.Context, name string) error {
	return concurrency.NewMutex(s.s, etcdHeldPrefix+name).Lock(ctx)
}

func (s *etcdSession) lastAck() time.Time {
	if s.e.acks == nil {
		return s.opened
	}
	if t := s.e.acks.last(int64(s.s.Lease())); t.After(s.opened) {
		return t
	}
	return s.opened
}

func (s *etcdSession) lost() <-chan struct{} { return s.s.Done() }

// close is Session.Close, as a user calls it: it stops the keep-alives
// and revokes the lease, bounded by a TTL (ctx is not its to take).
func (s *etcdSession) close(context.Context) error { return s.s.Close() }

type etcdMutex struct{ m *concurrency.Mutex }

func (m etcdMutex) lock(ctx context.Context) error   { return m.m.Lock(ctx) }
func (m etcdMutex) unlock(ctx context.Context) error { return m.m.Unlock(ctx) }

type etcdElection struct{ e *concurrency.Election }

func (e etcdElection) campaign(ctx context.Context, value string) error {
	return e.e.Campaign(ctx, value)
}
func (e etcdElection) resign(ctx context.Context) error { return e.e.Resign(ctx) }

// ackTracker learns, from the gRPC stream that carries an etcd client's
// lease keep-alives, the send time of each lease's newest acknowledged
// keep-alive: the same thing Tenure's client tracks for its validity,
// which etcd's client keeps to itself. Keep-alives of one lease are
// answered in order on the stream, so each answer is credited to the
// oldest unanswered send.
type ackTracker struct {
	mu    sync.Mutex // guards sent and acked
	sent  map[int64][]time.Time
	acked map[int64]time.Time
}

func (a *ackTracker) last(lease int64) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acked[lease]
}

func (a *ackTracker) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	st, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
		return st, err
	}
	return &ackStream{ClientStream: st, a: a}, nil
}

type ackStream struct {
	grpc.ClientStream
	a *ackTracker
}

func (s *ackStream) SendMsg(m any) error {
	if req, ok := m.(*pb.LeaseKeepAliveRequest); ok {
		now := time.Now()
		s.a.mu.Lock()
		s.a.sent[req.ID] = append(s.a.sent[req.ID], now)
		s.a.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *ackStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if resp, ok := m.(*pb.LeaseKeepAliveResponse); ok && err == nil {
		s.a.mu.Lock()
		if q := s.a.sent[resp.ID]; len(q) > 0 {
			// A TTL of 0 says the lease is gone: an answer, not a renewal.
			if resp.TTL > 0 {
				s.a.acked[resp.ID] = q[0]
			}
			s.a.sent[resp.ID] = q[1:]
		}
		s.a.mu.Unlock()
	}
	return err
}
