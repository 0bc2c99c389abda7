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

	// expiry fires when the validity window closes: Lost must not wait
	// for the heartbeat loop, which may be connecting somewhere.
	expiry *time.Timer

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
	// The pipelines' liveness checks follow the shortest TTL among the
	// sessions they carry, from now until the heartbeats end.
	c.carryTTL(s.ttl, 1)
	s.expiry = time.AfterFunc(time.Hour, s.checkValidity)
	s.expiry.Reset(time.Until(s.ValidUntil()))
	go s.heartbeat()
	return s, nil
}

// checkValidity runs on the expiry timer: it marks the session lost if
// the validity window has closed, else waits for its new end.
func (s *Session) checkValidity() {
	if left := time.Until(s.ValidUntil()); left > 0 {
		s.expiry.Reset(left)
		return
	}
	s.markLost(fmt.Errorf("%w: %w", ErrSessionExpired, errValidityPassed))
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
	defer s.c.carryTTL(s.ttl, -1)
	defer s.expiry.Stop()
	pause := s.c.opts.backoff
	for {
		select {
		case <-s.stop:
			return
		case <-s.c.closing:
			// The client's connections are gone: nothing will renew the
			// session, so its holder is told now, not when the window
			// closes.
			s.markLost(fmt.Errorf("%w: session %d: %w", ErrSessionExpired, s.id, errClientClosed))
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
		s.c.opts.logger.Debug("tenure: heartbeats interrupted", "session", s.id, "err", err, "valid_for", time.Until(s.ValidUntil()).Round(time.Millisecond))
		// A stream that worked for a while, a node that named the leader
		// to go to, or a heartbeat the endpoint left unanswered (a frozen
		// leader: another endpoint names the new one) is worth retrying
		// at once: the backoff is for a cluster that keeps failing, not
		// for the one failover that ended a healthy stream. Waiting out a
		// backoff grown during an earlier outage could use up the
		// validity window.
		if acked || notSent(err) || errors.Is(err, errUnanswered) || errors.Is(err, errLeaderNamed) {
			pause = s.c.opts.backoff
		}
		wait := time.NewTimer(pause)
		validity := time.NewTimer(time.Until(s.ValidUntil()))
		select {
		case <-s.stop:
		case <-s.c.closing:
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

// errClientClosed is why a session whose client was closed is lost.
var errClientClosed = errors.New("its client was closed")

// errUnanswered ends a heartbeat stream whose endpoint left a heartbeat
// unanswered for the patience (see patience): the heartbeat is sent
// again through another endpoint.
var errUnanswered = errors.New("heartbeat unanswered")

// errLeaderNamed ends a heartbeat stream before it starts: the endpoint
// does not lead and named the one that does, now the current endpoint.
var errLeaderNamed = errors.New("the endpoint named another leader")

// patience is how long a heartbeat may go unanswered before it is sent
// again through another endpoint: one heartbeat interval.
//
// A leader answers a heartbeat from memory — no log entry, no disk — so a
// live one, even a busy one, answers in milliseconds; an interval (at
// least 667ms at the 2s minimum TTL) is a hundred times that, and waiting
// longer buys nothing: the next heartbeat is due anyway. Waiting less
// costs a live but slow leader its place as the current endpoint, and the
// follower the retry goes to names that same leader, which is not
// followed again for a second (distrustFailed). A frozen or cut-off
// leader is usually found sooner, by the pipeline's pings, which scale
// with the TTL (pingBounds): patience is the bound for what the pings
// cannot see, a connected leader that does not answer, and the whole
// bound on a stream without a pipeline. Either way the retry starts by
// about 2/3 TTL after the last acknowledged send, before the validity
// window (0.75 TTL) closes, and a new leader, elected within about a
// second, takes the next heartbeat.
func (s *Session) patience() time.Duration { return s.opts.interval }

// heartbeatDeadline bounds one heartbeat sent at now: unanswered for
// the patience, or past the validity window, it is given up.
func (s *Session) heartbeatDeadline() time.Time {
	d, until := time.Now().Add(s.patience()), s.ValidUntil()
	if until.Before(d) {
		return until
	}
	return d
}

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
		if err != nil && !errors.Is(err, errLeaderNamed) {
			s.c.failover(ep, err)
		}
	}()
	// Connecting is bounded like a heartbeat: a frozen node's kernel
	// still accepts the connection, and the upgrade is never answered.
	dialCtx, dialCancel := context.WithDeadline(context.Background(), s.heartbeatDeadline())
	p, perr := ep.pipeline(dialCtx)
	dialCancel()
	switch {
	case perr == nil:
		return s.pipedHeartbeats(ep, p)
	case !errors.Is(perr, errUseUnary):
		if errors.Is(perr, context.DeadlineExceeded) && s.Valid() {
			perr = fmt.Errorf("%w: connecting to %s: %w", errUnanswered, ep.url, perr)
		}
		return false, perr
	}
	if cur, _ := s.c.endpoint(); cur != ep {
		// A follower refused the pipeline and named the leader, which is
		// now the current endpoint: go there rather than open a stream
		// the follower would only end with "not leader".
		return false, fmt.Errorf("%w: %s named %s", errLeaderNamed, ep.url, cur.url)
	}
	if !ep.pipeless() {
		var ce *connect.Error
		if errors.As(perr, &ce) && ce.Meta().Get(leaderHeader) != "" {
			// The follower names a leader the client does not follow:
			// one that went silent a moment ago (distrustFailed), still
			// the leader to a follower that has not noticed yet. Ask the
			// next node; perr, "not leader", moves on without blaming
			// this one.
			return false, perr
		}
		// No leader known yet: an election is under way. The follower
		// waits for its end before it forwards, and answers itself if
		// it is elected.
		return s.forwardedHeartbeats(ep)
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
	// unanswered fires when the oldest unanswered heartbeat has waited
	// for the patience.
	unanswered := time.NewTimer(time.Hour)
	unanswered.Stop()
	defer unanswered.Stop()
	send := func() error {
		now := s.validity.now()
		if len(pending) == 0 {
			unanswered.Reset(s.patience())
		}
		pending = append(pending, now)
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
		case <-unanswered.C:
			return acked, fmt.Errorf("%w for %v by %s", errUnanswered, s.patience(), ep.url)
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
			unanswered.Stop()
			if len(pending) > 0 {
				unanswered.Reset(s.patience() - (s.validity.now() - pending[0]))
			}
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
func (s *Session) pipedHeartbeats(ep *endpoint, p *pipe) (acked bool, err error) {
	return s.callHeartbeats(ep, false, func(ctx context.Context, req *tenurev1.KeepAliveRequest) error {
		_, err := p.call(ctx, &tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Refresh{Refresh: req}})
		return err
	})
}

// forwardedHeartbeats sends the heartbeats as unary Refresh calls to a
// follower that knows no leader yet, which waits for the election to
// end and forwards them to the winner, or answers them itself if it
// wins: during a failover a follower knows the new leader before this
// client does. Its answers name the leader, and the client follows; the
// heartbeats then go there (errLeaderNamed). It returns like
// pipedHeartbeats.
func (s *Session) forwardedHeartbeats(ep *endpoint) (acked bool, err error) {
	return s.callHeartbeats(ep, true, func(ctx context.Context, req *tenurev1.KeepAliveRequest) error {
		_, err := ep.unarySessions.Refresh(ctx, connect.NewRequest(req))
		return err
	})
}

// callHeartbeats makes a refresh call on ep every interval, each
// bounded by heartbeatDeadline, until one fails (the error), the session
// is lost or stopped (nil), or, with untilMoved, the client moved to
// another endpoint (errLeaderNamed).
func (s *Session) callHeartbeats(ep *endpoint, untilMoved bool, refresh func(context.Context, *tenurev1.KeepAliveRequest) error) (acked bool, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-s.c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(s.opts.interval)
	defer tick.Stop()
	req := &tenurev1.KeepAliveRequest{SessionId: s.id}
	for {
		sentAt := s.validity.now()
		callCtx, callCancel := context.WithDeadline(ctx, s.heartbeatDeadline())
		err := refresh(callCtx, req)
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
		case err != nil && connect.CodeOf(err) == connect.CodeDeadlineExceeded:
			// Only this heartbeat is given up: a pipeline stays for the
			// other calls on it, until its pings say otherwise.
			return acked, fmt.Errorf("%w for %v by %s", errUnanswered, s.patience(), ep.url)
		case err != nil:
			return acked, err
		}
		s.validity.ack(sentAt)
		acked = true
		if cur, _ := s.c.endpoint(); untilMoved && cur != ep {
			return acked, fmt.Errorf("%w: %s named %s", errLeaderNamed, ep.url, cur.url)
		}
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
