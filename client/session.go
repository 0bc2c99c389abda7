package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Session is a liveness contract with the cluster: while its heartbeats
// are acknowledged it keeps what it holds; when they stop for a TTL the
// server releases everything. A session is safe for concurrent use. The
// caller should call Close when finished, which releases everything at
// once.
//
// The client is pessimistic (DESIGN safety rule 5): Valid is true only
// until the send time of the last acknowledged heartbeat plus 0.75×TTL on
// the local monotonic clock, well before the server can expire the
// session, and Lost fires when that passes or the server says the session
// is gone. A lost session stays lost.
type Session struct {
	c        *Client
	id       int64
	identity string
	ttl      time.Duration
	opts     sessionOptions

	validity *validity

	ctx      context.Context
	cancel   context.CancelCauseFunc
	lostOnce sync.Once
	lost     chan struct{}

	stop      chan struct{} // closed by Close to end the heartbeat loop
	done      chan struct{} // closed when the heartbeat loop has ended
	gaveUp    atomic.Bool   // the heartbeat loop ended the lost session on the server
	closeOnce sync.Once

	mu    sync.Mutex // guards gates
	gates map[LeaseName]chan struct{}
}

type sessionOptions struct {
	ttl            time.Duration
	identity       string
	labels         map[string]string
	validityFactor float64
	interval       time.Duration
}

// SessionOption configures a Session.
type SessionOption func(*sessionOptions)

// WithTTL sets the session TTL (default 10s; the server allows 2s..24h).
func WithTTL(d time.Duration) SessionOption { return func(o *sessionOptions) { o.ttl = d } }

// WithIdentity sets the holder identity shown on leases (default
// hostname_pid_random; with credentials, WithToken or a client
// certificate, the server's default: the principal's name, since a
// server with a policy only lets a principal use the identities it
// allows, by default its name and "name/anything").
func WithIdentity(id string) SessionOption { return func(o *sessionOptions) { o.identity = id } }

// WithSessionLabels labels the session.
func WithSessionLabels(l map[string]string) SessionOption {
	return func(o *sessionOptions) { o.labels = l }
}

// WithValidityFactor sets the fraction of the TTL after the last
// acknowledged heartbeat's send time during which Valid is true (default
// 0.75). Lower is safer against clock drift and pauses; it must be below 1.
func WithValidityFactor(f float64) SessionOption {
	return func(o *sessionOptions) { o.validityFactor = f }
}

// WithHeartbeatInterval sets how often heartbeats are sent (default
// TTL/3).
func WithHeartbeatInterval(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.interval = d }
}

// DefaultIdentity is hostname_pid_random.
func DefaultIdentity() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s_%d_%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// NewSession opens a session and starts its heartbeats.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: 10 * time.Second, validityFactor: 0.75}
	for _, opt := range opts {
		opt(&o)
	}
	if o.identity == "" && !c.opts.credentials() {
		o.identity = DefaultIdentity()
	}
	if o.ttl <= 0 {
		return nil, &Error{Op: "NewSession", Kind: ErrInvalidArgument, Cause: fmt.Errorf("TTL %v must be positive (leave WithTTL out for the 10s default)", o.ttl)}
	}
	if o.validityFactor <= 0 || o.validityFactor >= 1 {
		return nil, &Error{Op: "NewSession", Kind: ErrInvalidArgument, Cause: fmt.Errorf("validity factor %v must be in (0, 1)", o.validityFactor)}
	}
	if o.interval <= 0 {
		o.interval = o.ttl / 3
	}
	// The open request counts as the first heartbeat: the server started
	// the TTL no earlier than it was sent.
	validity := newValidity(time.Duration(float64(o.ttl) * o.validityFactor))
	var resp *connect.Response[tenurev1.OpenSessionResponse]
	// Opening twice would leave an orphan session that lingers for a TTL,
	// so Open is retried only when the server provably did not take it.
	err := c.do(ctx, "OpenSession", once, func(ctx context.Context, ep *endpoint) (err error) {
		resp, err = ep.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{
			Identity: o.identity, Ttl: durationpb.New(o.ttl), Labels: o.labels,
		}))
		return err
	})
	if err != nil {
		return nil, err
	}
	msg := resp.Msg.GetSession()
	s := &Session{
		c:        c,
		id:       msg.GetId(),
		identity: msg.GetIdentity(),
		ttl:      msg.GetTtl().AsDuration(),
		opts:     o,
		validity: validity,
		lost:     make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		gates:    map[LeaseName]chan struct{}{},
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	go s.heartbeat()
	return s, nil
}

// ID is the session's ID on the server.
func (s *Session) ID() int64 { return s.id }

// Identity is the holder identity shown on leases.
func (s *Session) Identity() string { return s.identity }

// TTL is the session's TTL.
func (s *Session) TTL() time.Duration { return s.ttl }

// Client is the client the session was opened through.
func (s *Session) Client() *Client { return s.c }

// Valid reports whether everything the session holds is still certainly
// held: true until the last acknowledged heartbeat's send time plus the
// validity factor times the TTL, and never again once the session is lost.
func (s *Session) Valid() bool {
	select {
	case <-s.lost:
		return false
	default:
	}
	return s.validity.valid()
}

// ValidUntil is the local time until which Valid is true, if nothing
// else is acknowledged.
func (s *Session) ValidUntil() time.Time {
	return s.validity.deadline()
}

// Lost is closed when the session is lost: its validity ran out, the
// server said it is gone, or it was closed.
func (s *Session) Lost() <-chan struct{} { return s.lost }

// Context is cancelled when the session is lost; context.Cause says why.
func (s *Session) Context() context.Context { return s.ctx }

// Err says why the session was lost, or nil while it is not.
func (s *Session) Err() error {
	// s.ctx is cancelled first when the session is lost, and waits that
	// follow it check Err as soon as they see it: looking at s.lost,
	// closed a moment later, could still say nil.
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	return nil
}

func (s *Session) markLost(cause error) {
	s.lostOnce.Do(func() {
		s.cancel(cause)
		close(s.lost)
		if !errors.Is(cause, errClosed) {
			s.c.opts.logger.Warn("tenure: session lost", "session", s.id, "identity", s.identity, "cause", cause)
		}
	})
}

// errClosed is the cause of a session ended by Close: not worth a warning.
var errClosed = errors.New("closed by its owner")

// heartbeat keeps the session alive over a KeepAlive stream, reconnecting
// (on another endpoint if need be) while the validity lasts.
func (s *Session) heartbeat() {
	defer close(s.done)
	pause := s.c.opts.backoff
	for {
		select {
		case <-s.stop:
			return
		case <-s.lost:
			// Give up the server side too, so that others need not wait
			// a TTL for what this client no longer trusts it holds. Close
			// cuts this short and tries again under its own context.
			ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.requestTimeout)
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				select {
				case <-s.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			s.gaveUp.Store(s.closeOnServer(ctx) == nil)
			cancel()
			<-stopped
			return
		default:
		}
		acked, err := s.stream()
		if err == nil {
			continue // stopped or lost: the select above says which
		}
		// A stream that worked for a while, or a node that named the
		// leader to go to, is worth retrying at once: the backoff is for
		// a cluster that keeps failing, not for the one failover that
		// ended a healthy stream. Waiting out a backoff grown during an
		// earlier outage could use up the validity window.
		if acked || reasonOf(err).NotSent() {
			pause = s.c.opts.backoff
		}
		wait := time.NewTimer(pause)
		validity := time.NewTimer(time.Until(s.ValidUntil()))
		select {
		case <-s.stop:
		case <-s.lost:
		case <-validity.C:
			s.markLost(fmt.Errorf("%w: %w (last stream error: %v)", ErrSessionExpired, errValidityPassed, err))
		case <-wait.C:
		}
		wait.Stop()
		validity.Stop()
		// Capped like every other retry: a TTL/3 pause after a failover
		// could outlast what is left of the validity window.
		pause = min(pause*2, s.opts.interval, s.c.opts.maxBackoff)
	}
}

var errValidityPassed = errors.New("no heartbeat acknowledged within the validity window")

// stream runs one KeepAlive stream until it fails (the error), or the
// session is lost or stopped (nil), and reports whether any heartbeat on
// it was acknowledged. It sends a heartbeat every interval and credits
// each answer to the send time of the request it answers (answers come in
// order).
func (s *Session) stream() (acked bool, err error) {
	ep, err := s.c.endpoint()
	if err != nil {
		s.markLost(fmt.Errorf("%w: %w", ErrSessionExpired, err))
		return false, nil
	}
	// Fail over from the endpoint this stream used, not from whichever is
	// current by now: a grant monitor may already have moved on, and
	// moving again would send the heartbeats back to the dead endpoint.
	defer func() {
		if err != nil {
			s.c.failover(ep, err)
		}
	}()
	if p, perr := ep.pipeline(context.Background()); perr == nil {
		return s.pipedHeartbeats(p)
	} else if !errors.Is(perr, errUseUnary) {
		return false, perr
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := ep.sessions.KeepAlive(ctx)
	type answer struct {
		resp *tenurev1.KeepAliveResponse
		err  error
	}
	answers := make(chan answer, 1)
	received := make(chan struct{})
	defer func() {
		cancel()
		_ = st.CloseResponse()
		<-received
	}()
	go func() {
		defer close(received)
		for {
			resp, err := st.Receive()
			select {
			case answers <- answer{resp, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	var pending []time.Duration // send times of unanswered heartbeats
	send := func() error {
		pending = append(pending, s.validity.now())
		return st.Send(&tenurev1.KeepAliveRequest{SessionId: s.id})
	}
	if err := send(); err != nil {
		return false, err
	}
	tick := time.NewTicker(s.opts.interval)
	defer tick.Stop()
	expiry := time.NewTimer(time.Until(s.ValidUntil()))
	defer expiry.Stop()
	for {
		select {
		case <-s.stop:
			_ = st.CloseRequest()
			return acked, nil
		case <-expiry.C:
			if time.Now().Before(s.ValidUntil()) {
				expiry.Reset(time.Until(s.ValidUntil()))
				continue
			}
			s.markLost(fmt.Errorf("%w: %w", ErrSessionExpired, errValidityPassed))
			return acked, nil
		case <-tick.C:
			if err := send(); err != nil {
				return acked, err
			}
		case a := <-answers:
			if a.err != nil {
				return acked, a.err
			}
			if len(pending) == 0 {
				return acked, errors.New("keep-alive answer without a request")
			}
			sentAt := pending[0]
			pending = pending[1:]
			if a.resp.GetExpired() {
				s.markLost(fmt.Errorf("%w: the server no longer has session %d", ErrSessionExpired, s.id))
				return acked, nil
			}
			s.validity.ack(sentAt)
			acked = true
			expiry.Reset(time.Until(s.ValidUntil()))
		}
	}
}

// pipedHeartbeats sends the heartbeats as Refresh requests on the
// endpoint's pipeline, one at a time, until one fails (the error), or
// the session is lost or stopped (nil). Every session of the client
// shares the pipeline, so the server keeps no stream, and no goroutine,
// per session, and heartbeats sent together share writes.
func (s *Session) pipedHeartbeats(p *pipe) (acked bool, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(s.opts.interval)
	defer tick.Stop()
	req := &tenurev1.KeepAliveRequest{SessionId: s.id}
	for {
		sentAt := s.validity.now()
		callCtx, callCancel := context.WithDeadline(ctx, s.ValidUntil())
		_, err := p.call(callCtx, &tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Refresh{Refresh: req}})
		callCancel()
		switch {
		case ctx.Err() != nil:
			return acked, nil // stopped, or lost elsewhere
		case err != nil && errors.Is(wrap("KeepAlive", err), ErrSessionExpired):
			s.markLost(fmt.Errorf("%w: the server no longer has session %d", ErrSessionExpired, s.id))
			return acked, nil
		case err != nil && !s.Valid():
			s.markLost(fmt.Errorf("%w: %w (last error: %v)", ErrSessionExpired, errValidityPassed, err))
			return acked, nil
		case err != nil:
			return acked, err
		}
		s.validity.ack(sentAt)
		acked = true
		select {
		case <-ctx.Done():
			return acked, nil
		case <-tick.C:
		}
	}
}

// Close ends the session on the server, releasing everything it holds at
// once, and stops the heartbeats. ctx bounds the call; if it ends first,
// the server expires the session after its TTL. Safe to call twice.
func (s *Session) Close(ctx context.Context) error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		if !s.gaveUp.Load() {
			// Not lost, or lost but the heartbeat loop could not tell
			// the server before Close stopped it.
			err = s.closeOnServer(ctx)
		}
		s.markLost(fmt.Errorf("%w: session %d was %w", ErrSessionExpired, s.id, errClosed))
	})
	return err
}

func (s *Session) closeOnServer(ctx context.Context) error {
	err := s.c.do(ctx, "CloseSession", idempotent, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: s.id}))
		return err
	})
	if errors.Is(err, ErrSessionExpired) {
		return nil // already gone: what Close wanted
	}
	return err
}

// gate returns the in-process gate for one lease: the server grants a
// lease once per session, so goroutines sharing a session take turns here
// before asking the server.
func (s *Session) gate(key LeaseName, size int) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.gates[key]
	if !ok {
		g = make(chan struct{}, size)
		s.gates[key] = g
	}
	return g
}
