package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// leaseOptions configure Mutex, Semaphore, RWMutex and Election.
type leaseOptions struct {
	namespace string
	labels    map[string]string
	lockDelay time.Duration
	watchdog  func()
	value     string
	gcAfter   *time.Duration // nil: the server's --lease-gc-after
	maxHold   time.Duration
}

// LeaseOption configures a lock or an election.
type LeaseOption func(*leaseOptions)

// WithNamespace puts the lease in a namespace (default DefaultNamespace).
func WithNamespace(ns string) LeaseOption { return func(o *leaseOptions) { o.namespace = ns } }

// WithLabels labels the lease when it is granted.
func WithLabels(l map[string]string) LeaseOption { return func(o *leaseOptions) { o.labels = l } }

// WithLockDelay asks that, if this holder's session expires, nobody be
// granted the lease for d: time for a partitioned holder to stop.
func WithLockDelay(d time.Duration) LeaseOption { return func(o *leaseOptions) { o.lockDelay = d } }

// WithGCAfter sets how long the lease record is kept once nothing holds
// or waits for it (its last holder, how the grant ended) before the
// server deletes it; 0 keeps it forever. Without it the server's
// --lease-gc-after (1h) applies. Names that come and go (per-pod,
// per-job) should be collected; a name a team looks up should not.
func WithGCAfter(d time.Duration) LeaseOption {
	return func(o *leaseOptions) { o.gcAfter = &d }
}

// WithMaxHold bounds how long this session may keep a grant of the lease:
// past d the server asks it to step down (the grant ends locally with
// ErrStepDown, the reason saying "max-hold"), and revokes the grant the
// server's --max-hold-grace (30s) later if it still stands. For the
// stuck job that would otherwise hold a lock for days. The server may
// cap d (--max-hold-limit).
func WithMaxHold(d time.Duration) LeaseOption { return func(o *leaseOptions) { o.maxHold = d } }

// WithValue sets the value RunElection proclaims when elected.
func WithValue(v string) LeaseOption { return func(o *leaseOptions) { o.value = v } }

// WithWatchdog calls fn the moment a held grant may be lost (Valid turns
// false, the session ends, or the grant is revoked). fn runs on its own
// goroutine; it should stop the protected work at once.
func WithWatchdog(fn func()) LeaseOption { return func(o *leaseOptions) { o.watchdog = fn } }

// WithExitWatchdog exits the process with code the moment a held grant
// may be lost: the bluntest way to make sure protected work stops.
func WithExitWatchdog(code int) LeaseOption {
	return WithWatchdog(func() {
		fmt.Fprintln(os.Stderr, "tenure: lease may be lost; exiting")
		os.Exit(code)
	})
}

// LeaseName names a lease: a namespace and a name in it, written
// "namespace/name".
type LeaseName = api.LeaseName

// DefaultNamespace is the namespace of a lease when WithNamespace is not
// given.
const DefaultNamespace = api.DefaultNamespace

// Token is a fencing token: the grant's revision, which strictly
// increases per lease, with the lease's name.
type Token struct {
	Namespace string
	Name      string
	Token     int64
}

// Lease is the name of the lease t was granted on.
func (t Token) Lease() LeaseName { return LeaseName{Namespace: t.Namespace, Name: t.Name} }

// String is the fence header's form, "namespace/name:token".
func (t Token) String() string { return t.Lease().String() + ":" + strconv.FormatInt(t.Token, 10) }

// holder acquires, keeps and gives back one session's grant of a lease.
// Goroutines that share the session take turns through the session's
// gate for the lease, because the server grants a lease once per session.
type holder struct {
	s         *Session
	lease     LeaseName
	capacity  int
	exclusive bool
	opts      leaseOptions
	gate      chan struct{}

	mu    sync.Mutex // guards the fields below
	token int64
	value string
	ctx   context.Context // cancelled when the current grant ends
	lost  chan struct{}   // closed when the current grant ends
	end   func(cause error)
	done  chan struct{} // closed when the grant's monitor has stopped
	// inDoubt is a token whose Release did not come back: it may still
	// apply. Acquire is idempotent per session, so an Acquire sent
	// before it applies would be answered with that same grant, which
	// the late release then ends under the caller. The next acquire
	// releases it again first, so that it always gets a grant of its own.
	inDoubt int64
}

func newHolder(s *Session, name string, capacity int, exclusive bool, opts []LeaseOption) *holder {
	o := leaseOptions{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	h := &holder{s: s, lease: api.NewLeaseName(o.namespace, name), capacity: capacity, exclusive: exclusive, opts: o}
	// Readers and writers of one RWMutex share a gate: one session, one grant.
	h.gate = s.gate(h.lease, 1)
	h.lost = make(chan struct{})
	close(h.lost)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.ctx = ctx
	return h
}

var errReleased = errors.New("released")

// acquire takes the session's gate, then the server grant. With wait it
// parks on the server's FIFO queue until granted or ctx ends.
func (h *holder) acquire(ctx context.Context, wait bool, value string) error {
	select {
	case h.gate <- struct{}{}:
	case <-ctx.Done():
		return wrap("Acquire", ctx.Err())
	case <-h.s.lost:
		return &Error{Op: "Acquire", Kind: ErrSessionExpired, Cause: h.s.Err()}
	}
	if err := h.settleRelease(ctx); err != nil {
		<-h.gate
		return err
	}
	token, err := h.request(ctx, wait, value)
	if err != nil {
		<-h.gate
		return err
	}
	h.start(token, value)
	return nil
}

// settleRelease sends again the release whose outcome was in doubt, if
// any, until it is known: the grant it named is then gone, and an
// acquire cannot be answered with it.
func (h *holder) settleRelease(ctx context.Context) error {
	h.mu.Lock()
	token := h.inDoubt
	h.mu.Unlock()
	if token == 0 || h.s.Err() != nil {
		return nil
	}
	if err := h.sendRelease(ctx, token); err != nil {
		return &Error{Op: "Acquire", Kind: ErrUnavailable, Cause: fmt.Errorf("the release of token %d, whose outcome was not known, could not be repeated first: %w", token, err)}
	}
	return nil
}

func (h *holder) request(ctx context.Context, wait bool, value string) (int64, error) {
	if err := h.lease.Validate(); err != nil {
		// "prod/scheduler" would read as namespace prod in fence headers
		// and the CLI; the server refuses it too.
		if errors.Is(err, api.ErrSlashInName) {
			err = fmt.Errorf("%w: give the namespace with WithNamespace", err)
		}
		return 0, &Error{Op: "Acquire", Kind: ErrInvalidArgument, Cause: err}
	}
	if !h.s.Valid() {
		return 0, &Error{Op: "Acquire", Kind: ErrSessionExpired, Cause: errors.New("the session is no longer valid")}
	}
	// The wait also ends when the session is lost: a grant to a lost
	// session is worthless.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(h.s.ctx, cancel)
	defer stop()
	req := &tenurev1.AcquireRequest{
		SessionId: h.s.id,
		Namespace: h.lease.Namespace,
		Name:      h.lease.Name,
		Capacity:  int32(h.capacity),
		Wait:      wait,
		Value:     value,
		Labels:    h.opts.labels,
		Exclusive: h.exclusive,
	}
	if h.opts.lockDelay > 0 {
		req.LockDelay = durationpb.New(h.opts.lockDelay)
	}
	if h.opts.gcAfter != nil {
		req.GcAfter = durationpb.New(*h.opts.gcAfter)
	}
	if h.opts.maxHold > 0 {
		req.MaxHold = durationpb.New(h.opts.maxHold)
	}
	kind := idempotent // Acquire is idempotent per session and lease
	if wait {
		kind = blocking
	}
	var resp *connect.Response[tenurev1.AcquireResponse]
	err := h.s.c.do(ctx, "Acquire", kind, func(ctx context.Context, ep *endpoint) (err error) {
		resp, err = ep.leases.Acquire(ctx, connect.NewRequest(req))
		return err
	})
	if err != nil {
		if h.s.Err() != nil {
			return 0, &Error{Op: "Acquire", Kind: ErrSessionExpired, Cause: h.s.Err()}
		}
		if ctx.Err() != nil {
			// Sent and then cut short, a try may have been granted as
			// well as a wait: nobody would know to release it.
			h.abandon()
		}
		return 0, err
	}
	if !resp.Msg.GetAcquired() {
		holder := resp.Msg.GetLease().GetHolderIdentity()
		return 0, &Error{Op: "Acquire", Kind: ErrLocked, Cause: fmt.Errorf("%s is held by %q", h.lease, holder)}
	}
	return resp.Msg.GetToken(), nil
}

// abandon gives back a grant that raced a cancelled wait: the server may
// have granted just as the caller went away, and nobody would know to
// release it. This goroutine still holds the session's gate for the
// lease, so a grant of this session found now is the abandoned one.
func (h *holder) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), h.s.c.opts.requestTimeout)
	defer cancel()
	l, err := h.s.c.Lease(ctx, h.lease.Namespace, h.lease.Name)
	if err != nil {
		return
	}
	for _, g := range l.Holders {
		if g.SessionID != h.s.id {
			continue
		}
		_ = h.s.c.do(ctx, "Release", idempotent, func(ctx context.Context, ep *endpoint) error {
			_, err := ep.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: g.Token}))
			return err
		})
	}
}

// tokenKey carries a grant's Token in the grant's Context.
type tokenKey struct{}

// TokenFromContext returns the fencing token of the grant whose Context
// ctx is (or derives from): Mutex.Context, Election.Context, and the
// context RunElection passes to OnStartedLeading.
func TokenFromContext(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(tokenKey{}).(Token)
	return t, ok
}

// start records a new grant and starts its monitor, which ends the grant
// locally when the session is lost or the server reports the grant gone
// (revoked, or released by someone else's break-lock).
func (h *holder) start(token int64, value string) {
	ctx, cancel := context.WithCancelCause(context.WithValue(h.s.ctx, tokenKey{}, Token{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: token}))
	lost := make(chan struct{})
	done := make(chan struct{})
	var once sync.Once
	end := func(cause error) {
		once.Do(func() {
			cancel(cause)
			close(lost)
		})
	}
	h.mu.Lock()
	h.token, h.value, h.ctx, h.lost, h.end, h.done = token, value, ctx, lost, end, done
	h.mu.Unlock()
	go func() {
		defer close(done)
		h.monitor(ctx, token, end)
	}()
}

// monitor watches the lease for the end of this grant until the grant
// ends for any reason.
func (h *holder) monitor(ctx context.Context, token int64, end func(error)) {
	watchdog := h.opts.watchdog
	defer func() {
		if watchdog != nil && !errors.Is(context.Cause(ctx), errReleased) {
			go watchdog()
		}
	}()
	from := token + 1
	pause := h.s.c.opts.backoff
	for ctx.Err() == nil {
		ended, next, err := h.watchFrom(ctx, from, token)
		if ended != nil {
			end(ended)
			return
		}
		if ctx.Err() != nil {
			break
		}
		from = next
		if errors.Is(err, ErrLagged) {
			// History moved on: ask directly whether the grant stands.
			if valid, verr := h.validate(ctx, token); verr == nil && !valid {
				end(&Error{Op: "Lock", Kind: ErrNotHolder, Cause: fmt.Errorf("grant %d of %s is gone", token, h.lease)})
				return
			}
			from = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(pause*2, h.s.c.opts.maxBackoff)
	}
	end(context.Cause(ctx))
}

// watchFrom streams the lease's events from revision from, returning the
// cause when the grant ends, or the revision to resume from when the
// stream breaks.
func (h *holder) watchFrom(ctx context.Context, from, token int64) (ended error, next int64, err error) {
	ep, err := h.s.c.endpoint()
	if err != nil {
		return nil, from, err
	}
	// On the pipeline, a grant watch is one request answered when the
	// grant ends: no stream, no connection of its own.
	ev, err := ep.watchGrant(ctx, &tenurev1.WatchGrantRequest{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: token, StartRevision: from})
	switch {
	case err == nil:
		return grantEnded(h.lease, token, ev), ev.GetRevision() + 1, nil
	case !errors.Is(err, errUseUnary):
		err = wrap("Watch", err)
		if !errors.Is(err, ErrLagged) && ctx.Err() == nil {
			h.s.c.failover(ep, err)
		}
		return nil, from, err
	}
	st, err := ep.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{Namespace: h.lease.Namespace, Name: h.lease.Name, StartRevision: from}))
	if err != nil {
		if ctx.Err() == nil {
			h.s.c.failover(ep, err)
		}
		return nil, from, wrap("Watch", err)
	}
	defer st.Close()
	for st.Receive() {
		ev := st.Msg()
		from = ev.GetRevision() + 1
		if ended := grantEnded(h.lease, token, ev); ended != nil {
			return ended, from, nil
		}
	}
	err = wrap("Watch", st.Err())
	if err != nil && !errors.Is(err, ErrLagged) && ctx.Err() == nil {
		h.s.c.failover(ep, err)
	}
	return nil, from, err
}

// grantEnded is the error a holder's grant ends with, if ev ends it. A
// request to step down ends it here too: the holder must stop the work
// the grant guards, and its release then lets the preferred holder in.
func grantEnded(lease LeaseName, token int64, ev *tenurev1.LeaseEvent) error {
	if ev.GetToken() != token {
		return nil
	}
	switch ev.GetType() {
	case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_STEP_DOWN:
		return &Error{Op: "Lock", Kind: ErrStepDown, Cause: fmt.Errorf("grant %d of %s: %s", token, lease, ev.GetReason())}
	case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED,
		tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED,
		tenurev1.LeaseEventType_LEASE_EVENT_TYPE_REVOKED:
		kind := ErrNotHolder
		if ev.GetType() == tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED {
			kind = ErrSessionExpired
		}
		return &Error{Op: "Lock", Kind: kind, Cause: fmt.Errorf("grant %d of %s ended: %s", token, lease, ev.GetReason())}
	}
	return nil
}

func (h *holder) validate(ctx context.Context, token int64) (bool, error) {
	var valid bool
	err := h.s.c.do(ctx, "Validate", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: token}))
		if err == nil {
			valid = resp.Msg.GetValid()
		}
		return err
	})
	return valid, err
}

// release gives the grant back and frees the session's gate. A grant
// already gone (revoked, session ended) counts as released.
func (h *holder) release(ctx context.Context) error {
	h.mu.Lock()
	token, end, done := h.token, h.end, h.done
	h.token = 0
	h.mu.Unlock()
	if token == 0 {
		return &Error{Op: "Unlock", Kind: ErrNotHolder, Cause: fmt.Errorf("%s is not held by this session", h.lease)}
	}
	end(errReleased)
	// The monitor stops by itself now that the grant has ended; the
	// release need not wait for it, only the gate does.
	defer func() {
		<-done
		<-h.gate
	}()
	if h.s.Err() != nil {
		return nil // the session is gone, and with it the grant
	}
	return h.sendRelease(ctx, token)
}

// sendRelease releases token on the server, and records it as in doubt
// while the answer is not known.
func (h *holder) sendRelease(ctx context.Context, token int64) error {
	err := h.s.c.do(ctx, "Release", idempotent, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: token}))
		return err
	})
	// Not holder means the grant is already gone — also after a retry
	// whose first attempt released it.
	if errors.Is(err, ErrNotHolder) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrSessionExpired) {
		err = nil
	}
	h.mu.Lock()
	switch {
	case err != nil:
		h.inDoubt = token
	case h.inDoubt == token:
		h.inDoubt = 0
	}
	h.mu.Unlock()
	return err
}

func (h *holder) setValue(ctx context.Context, value string) error {
	h.mu.Lock()
	token := h.token
	h.mu.Unlock()
	if token == 0 {
		return &Error{Op: "SetValue", Kind: ErrNotLeader, Cause: fmt.Errorf("%s is not held by this session", h.lease)}
	}
	err := h.s.c.do(ctx, "SetValue", idempotent, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.leases.SetValue(ctx, connect.NewRequest(&tenurev1.SetValueRequest{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: token, Value: value}))
		return err
	})
	if err == nil {
		h.mu.Lock()
		h.value = value
		h.mu.Unlock()
	}
	return err
}

// current returns the grant's token (0 when not held) and loss signals.
func (h *holder) current() (int64, context.Context, chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.token, h.ctx, h.lost
}

func (h *holder) valid() bool {
	token, ctx, _ := h.current()
	return token != 0 && ctx.Err() == nil && h.s.Valid()
}

func (h *holder) fenceToken() (Token, bool) {
	token, _, _ := h.current()
	return Token{Namespace: h.lease.Namespace, Name: h.lease.Name, Token: token}, token != 0 && h.valid()
}
