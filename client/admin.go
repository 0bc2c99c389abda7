package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Lease is a lease as listed: shaped like a Kubernetes Lease, plus a
// fencing token, a capacity and a wait queue.
type Lease struct {
	Namespace      string
	Name           string
	Capacity       int
	Holder         string        // first holder's identity, "" when free
	Token          int64         // first holder's fencing token, 0 when free
	Value          string        // first holder's value
	LeaseDuration  time.Duration // the holder session's TTL
	AcquireTime    time.Time
	RenewTime      time.Time // last heartbeat seen by the leader (display only)
	Transitions    int64
	Labels         map[string]string
	Holders        []GrantInfo
	Waiters        []Waiter
	LockDelay      time.Duration
	LockDelayOn    bool
	CreateRevision int64 // when the lease was created
	ModRevision    int64 // its last change
	// Status is "held"; "waiting" (waiters but no holder: a lock-delay);
	// or how the last grant ended: "released", "expired", "revoked".
	Status string
	// Last is the most recent grant that ended, nil until one has: an
	// unheld lease still says who had it and since when it is gone.
	Last            *EndedGrant
	GCAfter         time.Duration // 0: kept forever
	DeleteTime      time.Time     // when the idle record goes, zero while busy
	PreferredHolder string
	// MaxHold is the first holder's max hold (0: none): past AcquireTime
	// + MaxHold it is asked to step down, then revoked a grace later.
	MaxHold time.Duration
	// Kind is "" for a Tenure lease, KindEtcdLock for an etcd recipe's
	// lock listed with the leases (across all namespaces only).
	Kind string
	// KeyPrefix is an etcd lock's keys' common prefix, its name and "/",
	// as bytes; Name is the same without the "/", printable.
	KeyPrefix []byte
	// Key is a Kubernetes Lease's etcd key (KindKubernetes), as bytes;
	// ResourceVersion its metadata.resourceVersion, the key's mod
	// revision.
	Key             []byte
	ResourceVersion int64
}

// KindKubernetes is Lease.Kind for a coordination.k8s.io Lease of the
// Kubernetes cluster whose kube-apiserver stores its objects in Tenure
// (serve --kubernetes-prefix), read from its key: its namespace and
// name are Kubernetes', Holder, LeaseDuration, AcquireTime, RenewTime
// and Transitions its spec's; Token is 0 and Holders empty, as
// Kubernetes gives no fencing token; Status is "held", "expired" (past
// RenewTime + LeaseDuration) or "released" (no holder). Read-only: the
// lease calls act on Tenure's leases only.
const KindKubernetes = "kubernetes"

// KindEtcdLock is Lease.Kind for the lock of one of etcd's concurrency
// recipes (a clientv3 Mutex or Election, etcd's Lock and Election
// services, etcdctl lock and elect), as the server reads it from the
// keys: no namespace; the holder is the key created first, the waiters
// the others in create order, Token the holder key's create revision
// (etcd's fencing value), AcquireTime when it became the holder (zero
// when the answering node did not see that happen).
const KindEtcdLock = "etcd-lock"

// EndedGrant is the last grant of a lease that ended.
type EndedGrant struct {
	SessionID   int64
	Holder      string
	Token       int64
	AcquireTime time.Time
	// RenewTime is the holder's last sign of life: its last heartbeat the
	// leader saw, for an expiry.
	RenewTime time.Time
	EndTime   time.Time
	Ended     string // "released", "expired" or "revoked"
	Reason    string
}

// LeaseName is the lease's namespace and name.
func (l Lease) LeaseName() LeaseName { return LeaseName{Namespace: l.Namespace, Name: l.Name} }

// GrantInfo is one holder of a lease, as listed.
type GrantInfo struct {
	SessionID   int64
	Holder      string
	Token       int64
	AcquireTime time.Time
	RenewTime   time.Time
	Value       string
	Exclusive   bool
	StepDown    string // why the holder was asked to step down, if it was
	EtcdLease   int64  // an etcd lock's: the etcd lease of the holder's key
}

// Waiter is a session queued for a lease.
type Waiter struct {
	SessionID int64
	Holder    string
	Since     time.Time
	Exclusive bool
	EtcdLease int64 // an etcd lock's: the etcd lease of the waiter's key
}

// SessionInfo is a session as listed.
type SessionInfo struct {
	ID            int64
	Identity      string
	TTL           time.Duration
	Labels        map[string]string
	OpenTime      time.Time
	LastHeartbeat time.Time
	Leases        []string
	Waiting       []string
	Keys          int64
}

func leaseFrom(p *tenurev1.Lease) Lease {
	l := Lease{
		Namespace: p.GetNamespace(), Name: p.GetName(), Capacity: int(p.GetCapacity()),
		Holder: p.GetHolderIdentity(), Token: p.GetFencingToken(), Value: p.GetValue(),
		LeaseDuration: p.GetLeaseDuration().AsDuration(), Transitions: p.GetLeaseTransitions(),
		Labels: p.GetLabels(), LockDelay: p.GetLockDelay().AsDuration(), LockDelayOn: p.GetLockDelayActive(),
		CreateRevision: p.GetCreateRevision(), ModRevision: p.GetModRevision(),
		Status: p.GetStatus(), GCAfter: p.GetGcAfter().AsDuration(), DeleteTime: timeOf(p.GetDeleteTime()),
		PreferredHolder: p.GetPreferredHolder(), MaxHold: p.GetMaxHold().AsDuration(),
		Kind: p.GetKind(), KeyPrefix: p.GetKeyPrefix(), Key: p.GetKey(), ResourceVersion: p.GetResourceVersion(),
	}
	if e := p.GetLast(); e != nil {
		l.Last = &EndedGrant{
			SessionID: e.GetSessionId(), Holder: e.GetHolderIdentity(), Token: e.GetToken(),
			AcquireTime: timeOf(e.GetAcquireTime()), RenewTime: timeOf(e.GetRenewTime()), EndTime: timeOf(e.GetEndTime()),
			Ended: e.GetEnded(), Reason: e.GetReason(),
		}
	}
	if p.GetAcquireTime() != nil {
		l.AcquireTime = p.GetAcquireTime().AsTime()
	}
	if p.GetRenewTime() != nil {
		l.RenewTime = p.GetRenewTime().AsTime()
	}
	for _, g := range p.GetHolders() {
		gr := GrantInfo{SessionID: g.GetSessionId(), Holder: g.GetHolderIdentity(), Token: g.GetToken(), Value: g.GetValue(), Exclusive: g.GetExclusive(), StepDown: g.GetStepDown(), EtcdLease: g.GetEtcdLeaseId()}
		if g.GetAcquireTime() != nil {
			gr.AcquireTime = g.GetAcquireTime().AsTime()
		}
		if g.GetRenewTime() != nil {
			gr.RenewTime = g.GetRenewTime().AsTime()
		}
		l.Holders = append(l.Holders, gr)
	}
	for _, w := range p.GetWaiters() {
		wt := Waiter{SessionID: w.GetSessionId(), Holder: w.GetHolderIdentity(), Exclusive: w.GetExclusive(), EtcdLease: w.GetEtcdLeaseId()}
		if w.GetSince() != nil {
			wt.Since = w.GetSince().AsTime()
		}
		l.Waiters = append(l.Waiters, wt)
	}
	return l
}

// timeOf is t as a time.Time, zero when unset.
func timeOf(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

// ListOptions select leases or sessions.
type ListOptions struct {
	Namespace     string // default DefaultNamespace
	AllNamespaces bool
	LabelSelector string // "a=b,c!=d,e,!f"
}

// Leases lists leases, sorted by namespace and name.
func (c *Client) Leases(ctx context.Context, o ListOptions, opts ...ReadOption) ([]Lease, error) {
	var out []Lease
	ro := readOpts(opts)
	err := c.do(ctx, "ListLeases", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{Namespace: o.Namespace, AllNamespaces: o.AllNamespaces, LabelSelector: o.LabelSelector, Stale: ro.stale}))
		if err != nil {
			return err
		}
		out = out[:0]
		for _, l := range resp.Msg.GetLeases() {
			out = append(out, leaseFrom(l))
		}
		return nil
	})
	return out, err
}

// Lease returns one lease, or ErrNotFound.
func (c *Client) Lease(ctx context.Context, namespace, name string, opts ...ReadOption) (Lease, error) {
	var out Lease
	o := readOpts(opts)
	err := c.do(ctx, "GetLease", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: namespace, Name: name, Stale: o.stale}))
		if err == nil {
			out = leaseFrom(resp.Msg.GetLease())
		}
		return err
	})
	return out, err
}

// Sessions lists open sessions, by ID.
func (c *Client) Sessions(ctx context.Context, labelSelector string, opts ...ReadOption) ([]SessionInfo, error) {
	var out []SessionInfo
	o := readOpts(opts)
	err := c.do(ctx, "ListSessions", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.sessions.List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{LabelSelector: labelSelector, Stale: o.stale}))
		if err != nil {
			return err
		}
		out = out[:0]
		for _, s := range resp.Msg.GetSessions() {
			info := SessionInfo{
				ID: s.GetId(), Identity: s.GetIdentity(), TTL: s.GetTtl().AsDuration(), Labels: s.GetLabels(),
				Leases: s.GetLeases(), Waiting: s.GetWaiting(), Keys: s.GetKeys(),
			}
			if s.GetOpenTime() != nil {
				info.OpenTime = s.GetOpenTime().AsTime()
			}
			if s.GetLastHeartbeat() != nil {
				info.LastHeartbeat = s.GetLastHeartbeat().AsTime()
			}
			out = append(out, info)
		}
		return nil
	})
	return out, err
}

// Revoke is the administrative break-lock: it ends every grant of the
// lease, or only the one named by token when token is not 0, records the
// reason, and returns the tokens revoked.
func (c *Client) Revoke(ctx context.Context, namespace, name string, token int64, reason string) ([]int64, error) {
	var revoked []int64
	err := c.do(ctx, "Revoke", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Namespace: namespace, Name: name, Token: token, Reason: reason}))
		if err == nil {
			revoked = resp.Msg.GetRevoked()
		}
		return err
	})
	return revoked, err
}

// SetPreferredHolder names the identity the lease prefers as holder, or
// clears it with "": while that identity waits it is granted next, and
// the holders in its way are asked to step down (their grants end with
// ErrStepDown locally; the server keeps them until they release). It
// needs the admin verb, and a cluster whose every member runs this
// version (ErrNotSupported otherwise).
func (c *Client) SetPreferredHolder(ctx context.Context, namespace, name, identity string) (Lease, error) {
	var out Lease
	err := c.do(ctx, "SetPreferredHolder", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.leases.SetPreferredHolder(ctx, connect.NewRequest(&tenurev1.SetPreferredHolderRequest{Namespace: namespace, Name: name, Identity: identity}))
		if err == nil {
			out = leaseFrom(resp.Msg.GetLease())
		}
		return err
	})
	return out, err
}

// LeaseEvent is one change to a lease.
type LeaseEvent struct {
	Revision  int64
	Type      string // acquired, released, expired, revoked, waiting, wait-ended, value-set, lock-delay-ended, deleted, step-down, preferred-holder-set
	Namespace string
	Name      string
	SessionID int64
	Holder    string
	Token     int64
	Value     string
	Reason    string
	Time      time.Time
	Err       error // set on the last event when the watch ends with an error
}

var leaseEventNames = map[tenurev1.LeaseEventType]string{
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_ACQUIRED:             "acquired",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED:             "released",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED:              "expired",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_REVOKED:              "revoked",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_WAITING:              "waiting",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_WAIT_ENDED:           "wait-ended",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_VALUE_SET:            "value-set",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_LOCK_DELAY_ENDED:     "lock-delay-ended",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_DELETED:              "deleted",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_STEP_DOWN:            "step-down",
	tenurev1.LeaseEventType_LEASE_EVENT_TYPE_PREFERRED_HOLDER_SET: "preferred-holder-set",
}

// WatchLeases sends lease events in revision order — of one namespace,
// or all with AllNamespaces — from revision from (0: from now, pinned
// before it returns) until ctx ends or an error ends the watch (the last
// event carries Err). It resumes across endpoint failures without
// skipping events.
func (c *Client) WatchLeases(ctx context.Context, o ListOptions, from int64) <-chan LeaseEvent {
	return watchInto(ctx, c, "WatchLeases", from, true,
		func(ctx context.Context, ep *endpoint, from int64) (*connect.ServerStreamForClient[tenurev1.LeaseEvent], error) {
			return ep.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{Namespace: o.Namespace, AllNamespaces: o.AllNamespaces, StartRevision: from}))
		},
		func(ev *tenurev1.LeaseEvent) (int64, LeaseEvent) {
			le := LeaseEvent{
				Revision: ev.GetRevision(), Type: leaseEventNames[ev.GetType()], Namespace: ev.GetNamespace(), Name: ev.GetName(),
				SessionID: ev.GetSessionId(), Holder: ev.GetHolderIdentity(), Token: ev.GetToken(), Value: ev.GetValue(), Reason: ev.GetReason(),
			}
			if ev.GetTime() != nil {
				le.Time = ev.GetTime().AsTime()
			}
			return ev.GetRevision(), le
		},
		func(err error) LeaseEvent { return LeaseEvent{Err: err} })
}
