package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Presence: the Kubernetes lease patterns — node heartbeats and identity
// leases — built on sessions instead of timestamps. A process is present
// while it holds a lease through a live session; when it stops, its
// session closes and the lease is released at once, and when it dies the
// session expires after its TTL and the record says "expired". Watchers
// learn either the moment it happens, without polling renew times.

// NodeLeaseNamespace is where Heartbeat keeps node leases by default, as
// Kubernetes keeps them in kube-node-lease.
const NodeLeaseNamespace = "node-lease"

// DefaultNodeLeaseTTL is a node heartbeat's session TTL by default: the
// kubelet's node lease duration.
const DefaultNodeLeaseTTL = 40 * time.Second

// PresenceOptions configure Heartbeat and Announce.
type PresenceOptions struct {
	// Namespace is Heartbeat's namespace (default NodeLeaseNamespace);
	// Announce names its own.
	Namespace string
	// TTL is the session's TTL: how long after the process dies its lease
	// is released. Default DefaultNodeLeaseTTL for Heartbeat, the
	// client's session default (10s) for Announce.
	TTL time.Duration
	// Identity is the holder identity (default: the session's default, or
	// with credentials the server's: the principal's name).
	Identity string
	// GCAfter, when set, is how long the record is kept after the process
	// is gone (see WithGCAfter); unset, the server's --lease-gc-after.
	GCAfter *time.Duration
	// OnHeld is called each time the lease is held, again after a lost
	// session, with the grant's fencing token.
	OnHeld func(Token)
	// OnLost is called when a held lease is lost (the session expired, an
	// operator revoked it, or it was asked to step down); the lease is
	// taken again at once.
	OnLost func(error)
}

// Heartbeat keeps the lease node in NodeLeaseNamespace (or o.Namespace)
// held for as long as ctx lives: the node-lease pattern of Kubernetes' kubelet, where a node
// whose lease is no longer held is not ready. It holds the lease with a
// session of o.TTL, takes it again after the session is lost (waiting in
// the queue if an older incarnation still holds it), and when ctx ends
// closes the session, which releases the lease at once: a clean stop says
// "released", a crash "expired" after the TTL. It returns nil after ctx
// ends, or an error the server will keep giving (a bad name, a policy
// that refuses it).
func (c *Client) Heartbeat(ctx context.Context, node string, labels map[string]string, o PresenceOptions) error {
	if o.TTL == 0 {
		o.TTL = DefaultNodeLeaseTTL
	}
	ns := o.Namespace
	if ns == "" {
		ns = NodeLeaseNamespace
	}
	return c.present(ctx, ns, node, labels, "", o)
}

// Announcement is a published identity lease; see Announce.
type Announcement struct {
	stop context.CancelFunc
	done chan struct{}
	err  error // set before done closes

	mu    sync.Mutex
	token Token
}

// Announce publishes "this instance is alive": it holds namespace/name
// with labels and value (an address, say) through a session of its own,
// the way each kube-apiserver publishes an identity lease. It returns once
// the lease is held; from then on it stays held, taken again after a lost
// session, until ctx ends or Withdraw is called. Live lists and follows
// the live set by label selector.
func (c *Client) Announce(ctx context.Context, namespace, name string, labels map[string]string, value string, opts ...PresenceOptions) (*Announcement, error) {
	var o PresenceOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, stop := context.WithCancel(ctx)
	a := &Announcement{stop: stop, done: make(chan struct{})}
	held := make(chan struct{})
	var once sync.Once
	onHeld := o.OnHeld
	o.OnHeld = func(t Token) {
		a.mu.Lock()
		a.token = t
		a.mu.Unlock()
		once.Do(func() { close(held) })
		if onHeld != nil {
			onHeld(t)
		}
	}
	go func() {
		defer close(a.done)
		a.err = c.present(ctx, namespace, name, labels, value, o)
	}()
	select {
	case <-held:
		return a, nil
	case <-a.done:
		stop()
		if a.err == nil {
			a.err = ctx.Err()
		}
		return nil, a.err
	}
}

// Token is the fencing token of the announcement's current grant.
func (a *Announcement) Token() Token {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.token
}

// Done is closed once the announcement has ended: withdrawn, its context
// ended, or the server refused it for good (see Err).
func (a *Announcement) Done() <-chan struct{} { return a.done }

// Err is why the announcement ended; nil while it lasts and after a
// withdrawal.
func (a *Announcement) Err() error {
	select {
	case <-a.done:
		return a.err
	default:
		return nil
	}
}

// Withdraw releases the lease at once and waits until it is released
// (or ctx ends).
func (a *Announcement) Withdraw(ctx context.Context) error {
	a.stop()
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// present holds namespace/name until ctx ends; see Heartbeat.
func (c *Client) present(ctx context.Context, namespace, name string, labels map[string]string, value string, o PresenceOptions) error {
	leaseOpts := []LeaseOption{WithNamespace(namespace), WithLabels(labels)}
	if o.GCAfter != nil {
		leaseOpts = append(leaseOpts, WithGCAfter(*o.GCAfter))
	}
	var sessOpts []SessionOption
	if o.TTL > 0 {
		sessOpts = append(sessOpts, WithTTL(o.TTL))
	}
	if o.Identity != "" {
		sessOpts = append(sessOpts, WithIdentity(o.Identity))
	}
	pause := c.opts.backoff
	for ctx.Err() == nil {
		s, err := c.NewSession(ctx, sessOpts...)
		if err != nil {
			if permanent(err) {
				return err
			}
			sleep(ctx, pause)
			pause = min(2*pause, c.opts.maxBackoff)
			continue
		}
		err = c.holdOnce(ctx, s, name, value, leaseOpts, o)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.requestTimeout)
		_ = s.Close(closeCtx) // releases the lease at once
		cancel()
		if err != nil && permanent(err) {
			return err
		}
		if err != nil {
			sleep(ctx, pause)
			pause = min(2*pause, c.opts.maxBackoff)
			continue
		}
		pause = c.opts.backoff
	}
	return nil
}

// holdOnce takes the lease with session s and holds it until ctx ends,
// the grant is lost, or the session is. It returns an error only when
// the lease could not be taken.
func (c *Client) holdOnce(ctx context.Context, s *Session, name, value string, leaseOpts []LeaseOption, o PresenceOptions) error {
	e := s.Election(name, leaseOpts...)
	if err := e.Campaign(ctx, value); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if t, ok := e.Token(); ok && o.OnHeld != nil {
		o.OnHeld(t)
	}
	select {
	case <-ctx.Done():
	case <-e.Lost():
		if o.OnLost != nil {
			o.OnLost(context.Cause(e.Context()))
		}
	}
	return nil
}

// permanent reports whether the server will give err again however
// often it is asked.
func permanent(err error) bool {
	return errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrPermissionDenied) ||
		errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrNotSupported) || errors.Is(err, ErrClosed)
}

// LiveSet is the set of held leases in a namespace that match a label
// selector, at a revision; Err is set on the last one when following
// ended with an error.
type LiveSet struct {
	Leases   []Lease // sorted by name
	Revision int64
	Err      error
}

// Names are the live leases' names.
func (s LiveSet) Names() []string {
	out := make([]string, len(s.Leases))
	for i, l := range s.Leases {
		out[i] = l.Name
	}
	return out
}

// Live sends the live set — the held leases of namespace whose labels
// match selector ("app=api,zone!=b") — at once, and then each time it
// changes, until ctx ends: the apiserver-identity pattern, and simple
// service discovery over Announce. It follows the namespace's events and
// re-reads the matching leases after each burst of them (a linearizable
// read), so a set of thousands of members that change a few times a
// second costs little; it never polls. If following fails for good the
// last set sent carries Err and the channel closes.
func (c *Client) Live(ctx context.Context, namespace, selector string) <-chan LiveSet {
	out := make(chan LiveSet, 1)
	go func() {
		defer close(out)
		send := func(s LiveSet) bool {
			select {
			case out <- s:
				return true
			case <-ctx.Done():
				return false
			}
		}
		list := func() (LiveSet, error) {
			leases, err := c.Leases(ctx, ListOptions{Namespace: namespace, LabelSelector: selector})
			if err != nil {
				return LiveSet{}, err
			}
			rev, err := c.currentRevision(ctx, true)
			if err != nil {
				return LiveSet{}, err
			}
			live := LiveSet{Revision: rev}
			for _, l := range leases {
				if len(l.Holders) > 0 {
					live.Leases = append(live.Leases, l)
				}
			}
			return live, nil
		}
		// The watch starts before the first read, so that no change
		// between the two is missed: at worst one is read twice.
		events := c.WatchLeases(ctx, ListOptions{Namespace: namespace}, 0)
		cur, err := list()
		if err != nil {
			send(LiveSet{Err: err})
			return
		}
		if !send(cur) {
			return
		}
		// take handles one event: false ends following, after sending
		// the error that ended it.
		changed := false
		take := func(ev LeaseEvent, ok bool) bool {
			if !ok {
				return false
			}
			if ev.Err != nil {
				send(LiveSet{Leases: cur.Leases, Revision: cur.Revision, Err: ev.Err})
				return false
			}
			changed = changed || affectsLiveSet(ev.Type)
			return true
		}
		for {
			changed = false
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-events:
				if !take(ev, ok) {
					return
				}
			}
			// Take the rest of a burst before reading once for all of it.
			for drained := false; !drained; {
				select {
				case ev, ok := <-events:
					if !take(ev, ok) {
						return
					}
				default:
					drained = true
				}
			}
			if !changed {
				continue
			}
			next, err := list()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				send(LiveSet{Leases: cur.Leases, Revision: cur.Revision, Err: err})
				return
			}
			if sameMembers(cur, next) {
				cur.Revision = next.Revision
				continue
			}
			cur = next
			if !send(cur) {
				return
			}
		}
	}()
	return out
}

func affectsLiveSet(typ string) bool {
	switch typ {
	case "acquired", "released", "expired", "revoked", "value-set", "deleted":
		return true
	}
	return false
}

// sameMembers reports whether two live sets name the same holders with
// the same tokens and values.
func sameMembers(a, b LiveSet) bool {
	return slices.EqualFunc(a.Leases, b.Leases, func(x, y Lease) bool {
		return x.Name == y.Name && x.Token == y.Token && x.Value == y.Value && x.Holder == y.Holder
	})
}
