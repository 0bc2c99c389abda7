package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
)

// validityFactor is the Tenure sessions' validity factor, given
// explicitly because lastAck derives the acknowledged send time from it.
const validityFactor = 0.75

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type tenureConn struct {
	c        *client.Client
	leases   tenurev1connect.LeaseServiceClient   // for grant only
	sessions tenurev1connect.SessionServiceClient // for idleSession only
	http     *http.Transport
}

func dialTenure(ctx context.Context, endpoints []string) (conn, error) {
	c, err := client.New(ctx, endpoints, client.WithLogger(quiet))
	if err != nil {
		return nil, fmt.Errorf("tenure client: %w", err)
	}
	// As many idle connections as the growth workload's fill runs calls
	// at once on a conn, so that none is closed and dialled again.
	tr := &http.Transport{MaxIdleConnsPerHost: fillParallel}
	hc := &http.Client{Transport: tr}
	return &tenureConn{
		c:        c,
		http:     tr,
		leases:   tenurev1connect.NewLeaseServiceClient(hc, "http://"+endpoints[0]),
		sessions: tenurev1connect.NewSessionServiceClient(hc, "http://"+endpoints[0]),
	}, nil
}

func (t *tenureConn) session(ctx context.Context, ttl time.Duration) (session, error) {
	s, err := t.c.NewSession(ctx, client.WithTTL(ttl), client.WithValidityFactor(validityFactor))
	if err != nil {
		return nil, err
	}
	return &tenureSession{s: s, t: t}, nil
}

func (t *tenureConn) get(ctx context.Context, key string) (int64, error) {
	kv, err := t.c.KV().Get(ctx, key)
	if errors.Is(err, client.ErrNotFound) {
		return 0, nil
	}
	return kv.ModRevision, err
}

func (t *tenureConn) cas(ctx context.Context, key string, rev int64, value string) (int64, error) {
	kv, err := t.c.KV().CompareAndSwap(ctx, key, client.ModRevisionIs(rev), value)
	if errors.Is(err, client.ErrCompareFailed) {
		return 0, fmt.Errorf("%w: %w", errCompareFailed, err)
	}
	return kv.ModRevision, err
}

func (t *tenureConn) put(ctx context.Context, key, value string) error {
	_, err := t.c.KV().Put(ctx, key, value)
	return err
}

// idleSession opens a session with the generated API client, not the Go
// client's NewSession, which heartbeats on a stream of its own: the
// server keeps the same session either way, and a million streams are
// the client's cost, not the server's.
func (t *tenureConn) idleSession(ctx context.Context, ttl time.Duration) error {
	_, err := t.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(ttl)}))
	return err
}

func (t *tenureConn) campaigners(ctx context.Context, name string) (int, error) {
	l, err := t.c.Lease(ctx, client.DefaultNamespace, name)
	if errors.Is(err, client.ErrNotFound) {
		return 0, nil
	}
	return len(l.Holders) + len(l.Waiters), err
}

func (t *tenureConn) close() error {
	t.http.CloseIdleConnections()
	return t.c.Close()
}

type tenureSession struct {
	s *client.Session
	t *tenureConn
}

func (s *tenureSession) mutex(name string) locker { return tenureMutex{s.s.Mutex(name)} }

func (s *tenureSession) election(name string) elector { return tenureElection{s.s.Election(name)} }

// grant acquires with the generated API client, not a Mutex: the Go
// client's Mutex keeps a watch open per grant to learn of its end, one
// HTTP/1.1 connection each, and a hundred thousand connections from one
// loopback address do not fit in its ephemeral ports. What the server
// keeps per grant is what grant is for.
func (s *tenureSession) grant(ctx context.Context, name string) error {
	resp, err := s.t.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{
		SessionId: s.s.ID(), Namespace: client.DefaultNamespace, Name: name, Capacity: 1,
	}))
	if err != nil {
		return err
	}
	if !resp.Msg.GetAcquired() {
		return fmt.Errorf("acquire %s: held by %q", name, resp.Msg.GetLease().GetHolderIdentity())
	}
	return nil
}

func (s *tenureSession) lastAck() time.Time {
	return s.s.ValidUntil().Add(-time.Duration(validityFactor * float64(s.s.TTL())))
}

func (s *tenureSession) lost() <-chan struct{} { return s.s.Lost() }

func (s *tenureSession) close(ctx context.Context) error { return s.s.Close(ctx) }

type tenureMutex struct{ m *client.Mutex }

func (m tenureMutex) lock(ctx context.Context) error   { return m.m.Lock(ctx) }
func (m tenureMutex) unlock(ctx context.Context) error { return m.m.Unlock(ctx) }

type tenureElection struct{ e *client.Election }

func (e tenureElection) campaign(ctx context.Context, value string) error {
	return e.e.Campaign(ctx, value)
}
func (e tenureElection) resign(ctx context.Context) error { return e.e.Resign(ctx) }
