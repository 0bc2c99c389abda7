package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Leader is who leads an election.
type Leader struct {
	Identity  string // the leader session's holder identity; "" when nobody leads
	SessionID int64
	Value     string // what the leader proclaimed, e.g. its address
	Token     int64  // the leader's fencing token
	Revision  int64  // the revision of the change
}

// Election elects one leader among the sessions that campaign for name.
// The leader holds a lease whose value it proclaims; its token fences its
// writes. Its Grant is this session's leadership: Valid while it
// certainly leads. An Election is safe for concurrent use.
type Election struct{ Grant }

// Election returns the election named name.
func (s *Session) Election(name string, opts ...LeaseOption) *Election {
	return &Election{Grant{h: newHolder(s, name, 1, false, opts)}}
}

// Campaign waits until this session leads, then proclaims value.
func (e *Election) Campaign(ctx context.Context, value string) error {
	return e.h.acquire(ctx, true, value)
}

// Proclaim changes the leader's value without an election.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	err := e.h.setValue(ctx, value)
	if errors.Is(err, ErrNotHolder) {
		return &Error{Op: "Proclaim", Kind: ErrNotLeader, Cause: err}
	}
	return err
}

// Resign gives up leadership, so that the next candidate is elected at
// once.
func (e *Election) Resign(ctx context.Context) error {
	if t, _, _ := e.h.current(); t == 0 {
		return &Error{Op: "Resign", Kind: ErrNotLeader, Cause: errors.New("this session does not lead")}
	}
	return e.h.release(ctx)
}

// Leader returns the current leader, or ErrNoLeader.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	return leaderOf(ctx, e.h.s.c, e.h.lease)
}

func leaderOf(ctx context.Context, c *Client, lease LeaseName) (Leader, error) {
	var resp *connect.Response[tenurev1.GetLeaseResponse]
	err := c.do(ctx, "Leader", idempotent, func(ctx context.Context, ep *endpoint) (err error) {
		resp, err = ep.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: lease.Namespace, Name: lease.Name}))
		return err
	})
	if errors.Is(err, ErrNotFound) {
		return Leader{}, &Error{Op: "Leader", Kind: ErrNoLeader, Cause: err}
	}
	if err != nil {
		return Leader{}, err
	}
	l := resp.Msg.GetLease()
	if len(l.GetHolders()) == 0 {
		return Leader{Revision: resp.Msg.GetRevision()}, &Error{Op: "Leader", Kind: ErrNoLeader, Cause: fmt.Errorf("%s has no leader", lease)}
	}
	g := l.GetHolders()[0]
	return Leader{Identity: g.GetHolderIdentity(), SessionID: g.GetSessionId(), Value: g.GetValue(), Token: g.GetToken(), Revision: resp.Msg.GetRevision()}, nil
}

// Observe sends the current leader, then every change — a new leader, a
// proclaimed value, or nobody leading (a zero Identity) — in revision
// order, until ctx ends; then it closes the channel. It reconnects on
// its own; if it falls behind the server's history it re-reads the
// leader and carries on.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	return observe(ctx, e.h.s.c, e.h.lease)
}

func observe(ctx context.Context, c *Client, lease LeaseName) <-chan Leader {
	out := make(chan Leader, 1)
	go func() {
		defer close(out)
		var last Leader
		emit := func(l Leader) bool {
			if l.Token == last.Token && l.Value == last.Value && l.Identity == last.Identity && last.Revision != 0 {
				return true
			}
			last = l
			select {
			case out <- l:
				return true
			case <-ctx.Done():
				return false
			}
		}
		pause := c.opts.backoff
		for ctx.Err() == nil {
			cur, err := leaderOf(ctx, c, lease)
			if errors.Is(err, ErrNoLeader) && cur.Revision == 0 {
				// The election does not exist yet, so the read has no
				// revision to follow from, and revision 1 may be gone
				// from the server's history. Pin one, then read again:
				// if it still does not exist, none of its events lies
				// between the pin and the read.
				var pin int64
				if pin, err = storeRevision(ctx, c); err == nil {
					cur, err = leaderOf(ctx, c, lease)
					if cur.Revision == 0 {
						cur.Revision = pin
					}
				}
			}
			if err != nil && !errors.Is(err, ErrNoLeader) {
				if !sleep(ctx, pause) {
					return
				}
				pause = min(pause*2, c.opts.maxBackoff)
				continue
			}
			if !emit(cur) {
				return
			}
			// Follow events from just after the read until the stream
			// breaks; then read again, so nothing between is missed.
			if !followLeader(ctx, c, lease, cur, emit) {
				return
			}
		}
	}()
	return out
}

// storeRevision returns the store's current revision.
func storeRevision(ctx context.Context, c *Client) (int64, error) {
	var rev int64
	err := c.do(ctx, "Revision", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Limit: 1}))
		if err == nil {
			rev = resp.Msg.GetRevision()
		}
		return err
	})
	return rev, err
}

func followLeader(ctx context.Context, c *Client, lease LeaseName, cur Leader, emit func(Leader) bool) bool {
	ep, err := c.endpoint()
	if err != nil {
		return false
	}
	st, err := ep.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{Namespace: lease.Namespace, Name: lease.Name, StartRevision: cur.Revision + 1}))
	if err != nil {
		if ctx.Err() == nil {
			c.failover(ep, err)
		}
		return sleep(ctx, c.opts.backoff)
	}
	defer st.Close()
	for st.Receive() {
		ev := st.Msg()
		switch ev.GetType() {
		case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_ACQUIRED, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_VALUE_SET:
			cur = Leader{Identity: ev.GetHolderIdentity(), SessionID: ev.GetSessionId(), Value: ev.GetValue(), Token: ev.GetToken(), Revision: ev.GetRevision()}
		case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_REVOKED:
			if ev.GetToken() != cur.Token {
				continue
			}
			cur = Leader{Revision: ev.GetRevision()}
		default:
			continue
		}
		if !emit(cur) {
			return false
		}
	}
	if ctx.Err() != nil {
		return false
	}
	if err := st.Err(); err != nil && connect.CodeOf(err) != connect.CodeAborted && connect.CodeOf(err) != connect.CodeOutOfRange {
		c.failover(ep, err)
	}
	return sleep(ctx, c.opts.backoff)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Callbacks are RunElection's hooks.
type Callbacks struct {
	// OnStartedLeading runs when this process becomes leader, with a
	// context cancelled the instant leadership may be lost; its fencing
	// token is TokenFromContext(ctx), for the writes it makes. It must
	// return promptly once ctx is cancelled: the next campaign waits for
	// it, so that two leaders never run in this process.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading runs after OnStartedLeading has returned and
	// before the lease is given back, so always before any later
	// OnStartedLeading, of this RunElection or — when leadership passes
	// by resignation — of another in the process.
	OnStoppedLeading func()
	// OnNewLeader runs when a new term starts — another leader, or the
	// same identity elected again — with the leader's identity, never
	// "". A proclaimed value does not call it. Like OnNoLeader it runs on
	// RunElection's observer goroutine, one call at a time, in the order
	// of the changes; it may lag behind OnStartedLeading.
	OnNewLeader func(identity string)
	// OnNoLeader runs when nobody leads: at the start if nobody does,
	// and in the gap of a handover, once per gap (a release, expiry or
	// revoke before the next grant). OnNewLeader follows when the next
	// leader is elected. A release that grants the next candidate in
	// the same step may leave no gap to report.
	OnNoLeader func()
}

// RunElection campaigns for name with session until ctx ends. When
// elected it calls OnStartedLeading with a context that is cancelled the
// instant leadership may be lost; after a loss it calls OnStoppedLeading
// and campaigns again, with a new session (same TTL and identity) if the
// old one expired. When ctx is cancelled while leading, it cancels the
// leader's context, waits for OnStartedLeading to return, calls
// OnStoppedLeading, then resigns, so the next candidate takes over in
// milliseconds rather than after a TTL, and never while this one still
// works. Ending ctx is how to stop it: it then returns nil, having
// resigned if it led (whether ctx was cancelled or passed its deadline).
// It returns an error only when the server refuses the campaign as
// invalid (ErrInvalidArgument). Sessions it opened itself are closed on
// return; session is left open. WithValue sets the value proclaimed when
// elected. OnNewLeader and OnNoLeader, when set, report the election's
// leaders, this process's included.
func RunElection(ctx context.Context, session *Session, name string, cb Callbacks, opts ...LeaseOption) error {
	c := session.c
	o := leaseOptions{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	observeCtx, stopObserve := context.WithCancel(ctx)
	var observed sync.WaitGroup
	defer func() {
		stopObserve()
		observed.Wait()
	}()
	if cb.OnNewLeader != nil || cb.OnNoLeader != nil {
		observed.Add(1)
		go func() {
			defer observed.Done()
			reportLeaders(observe(observeCtx, c, api.NewLeaseName(o.namespace, name)), cb)
		}()
	}
	sessionOpts := []SessionOption{WithTTL(session.TTL()), WithIdentity(session.Identity()), WithValidityFactor(session.opts.validityFactor), WithHeartbeatInterval(session.opts.interval)}
	var own *Session // a session RunElection opened, to close when done
	defer func() {
		if own != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.requestTimeout)
			defer cancel()
			_ = own.Close(closeCtx)
		}
	}()
	for ctx.Err() == nil {
		if session.Err() != nil {
			if own != nil {
				_ = own.Close(context.WithoutCancel(ctx))
				own = nil
			}
			next, err := c.NewSession(ctx, sessionOpts...)
			if err != nil {
				sleep(ctx, c.opts.maxBackoff)
				continue
			}
			session, own = next, next
		}
		e := session.Election(name, opts...)
		if err := e.Campaign(ctx, o.value); err != nil {
			if errors.Is(err, ErrInvalidArgument) {
				// The server refused the campaign itself (a bad
				// namespace, name or value): asking again cannot
				// succeed, and would only hide the mistake.
				return err
			}
			// Campaign again after a pause, or at once with a new session
			// once this one is lost. The server can say the session is
			// gone (ErrSessionExpired) before its heartbeats do: without
			// the pause that would be a busy loop until they do.
			if session.Err() == nil {
				select {
				case <-ctx.Done():
				case <-session.Lost():
				case <-time.After(c.opts.backoff):
				}
			}
			continue
		}
		lead, stopLeading := context.WithCancel(e.Context())
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			if cb.OnStartedLeading != nil {
				cb.OnStartedLeading(lead)
			}
		}()
		select {
		case <-ctx.Done():
		case <-lead.Done():
		}
		stopLeading()
		<-finished
		// Stopped before the resignation: once the lease is given back
		// the next candidate may start at once, and this one must
		// already have stopped leading.
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
		// Resign also after a loss: it frees the session's turn at the
		// lease, and a grant already gone counts as released.
		resignCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.requestTimeout)
		_ = e.Resign(resignCtx)
		cancel()
	}
	// The caller ended ctx: that is how RunElection is stopped, and the
	// resignation above has already handed over, so it is no failure.
	return nil
}

// reportLeaders calls cb's OnNewLeader once per term and OnNoLeader once
// per gap, from what observed reports until it closes. Observe also
// reports proclaimed values, which are not new leaders.
func reportLeaders(observed <-chan Leader, cb Callbacks) {
	var last Leader
	first := true
	for l := range observed {
		switch {
		case l.Identity == "":
			if (first || last.Identity != "") && cb.OnNoLeader != nil {
				cb.OnNoLeader()
			}
		case first || l.Token != last.Token:
			if cb.OnNewLeader != nil {
				cb.OnNewLeader(l.Identity)
			}
		}
		last, first = l, false
	}
}
