package clientgo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tenurehq/tenure/client"
)

// Errors callers branch on with errors.Is. The errors Create and Update
// return also wrap the client's sentinels where Tenure refused: an
// acquire of a lease someone else holds matches client.ErrLocked, one on
// a lost session client.ErrSessionExpired.
var (
	// ErrLost is returned by Create and Update once a grant this Lock
	// held has ended without being given back: the session was lost or
	// an operator revoked the grant. The Lock does not lead again; the
	// elector gives up within its RenewDeadline. To campaign again, make
	// a new Lock (with a new session if the session was lost).
	ErrLost = errors.New("leadership lost")
	// ErrForeignHolder is returned by Create and Update for a record that
	// names a holder other than this Lock's Identity or nobody: a Lock
	// takes and gives back only its own session's grant.
	ErrForeignHolder = errors.New("record names another holder")
)

// leaseResource is what a not-found error names: a Tenure lease, which
// client-go only needs to see as not found.
var leaseResource = schema.GroupResource{Group: "tenure", Resource: "leases"}

// Lock is a client-go resourcelock.Interface backed by a Tenure lease
// that one session holds. Give it to leaderelection.LeaderElectionConfig
// as Lock, in place of a resourcelock.LeaseLock; see the package
// documentation for what changes and what does not.
//
// The elector calls Get, Create, Update and RecordEvent from its own
// goroutine, one at a time. Lock also embeds the grant (client.Grant):
// Token, Valid, Lost and Context answer for the grant this Lock's
// session holds while it leads, from any goroutine, exactly as they do
// for a client.Mutex. A Lock is a fence.Source, so
// fence.Transport(base, lock) fences a leader's HTTP calls.
//
// The session must not hold the same lease through anything else: the
// session takes one grant per lease, and the Lock's acquire would wait
// behind the other holder's turn.
type Lock struct {
	// Grant is the session's grant of the lease while this Lock leads.
	// Its Token fences the leader's writes; Lost and Context end the
	// moment the grant may be lost, which can be well before the elector
	// notices (see the package documentation).
	client.Grant

	s        *client.Session
	m        *client.Mutex
	lease    client.LeaseName
	recorder resourcelock.EventRecorder

	mu   sync.Mutex // serialises Create and Update; guards held and lost
	held bool       // m holds a grant that Create or Update took and nothing has given back
	lost error      // why a grant this Lock held ended without a release; set once, never cleared
}

var _ resourcelock.Interface = (*Lock)(nil)

type options struct {
	recorder  resourcelock.EventRecorder
	leaseOpts []client.LeaseOption
}

// Option configures a Lock.
type Option func(*options)

// WithEventRecorder records the elector's events ("became leader",
// "stopped leading") with r, as resourcelock.LeaseLock does with its
// ResourceLockConfig's EventRecorder. Without it RecordEvent does nothing.
func WithEventRecorder(r resourcelock.EventRecorder) Option {
	return func(o *options) { o.recorder = r }
}

// WithLeaseOptions passes options to the lease's client.Mutex:
// client.WithLabels, client.WithLockDelay (time for a partitioned leader
// to stop before anyone else may lead), client.WithWatchdog. The
// namespace is New's argument; a client.WithNamespace here is overridden.
func WithLeaseOptions(opts ...client.LeaseOption) Option {
	return func(o *options) { o.leaseOpts = append(o.leaseOpts, opts...) }
}

// New returns a Lock on the lease namespace/name (namespace "" is
// client.DefaultNamespace), held by session s while it leads. Its
// Identity is s.Identity(): give each candidate a session with its own
// identity (client.WithIdentity), as each LeaseLock has its own.
//
// New does not call the server. The caller keeps s, and should close it
// when finished: that gives back a grant the elector did not release.
func New(s *client.Session, namespace, name string, opts ...Option) *Lock {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if namespace == "" {
		namespace = client.DefaultNamespace
	}
	m := s.Mutex(name, append(o.leaseOpts, client.WithNamespace(namespace))...)
	return &Lock{
		Grant:    m.Grant,
		s:        s,
		m:        m,
		lease:    client.LeaseName{Namespace: namespace, Name: name},
		recorder: o.recorder,
	}
}

// Get reads the lease from Tenure (a linearizable read) and returns it as
// a LeaderElectionRecord: the holder's identity ("" when nobody holds
// it), the holder session's TTL as LeaseDurationSeconds (rounded up to
// whole seconds), its acquire time, its renew time — the last heartbeat
// the server saw from the holder, so the record changes while the leader
// lives — how many times the holder changed, and the lease's preferred
// holder. A lease that does not exist (never held, or collected after
// its gc_after) is a Kubernetes NotFound error, so that the elector
// calls Create.
//
// The raw record, which the elector only compares with the last one it
// saw, also holds the fencing token and the renew time to the
// nanosecond: a new grant or a new heartbeat is always a change.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	lease, err := l.s.Client().Lease(ctx, l.lease.Namespace, l.lease.Name)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil, apierrors.NewNotFound(leaseResource, l.lease.String())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("clientgo: reading %s: %w", l.lease, err)
	}
	rec, raw := record(lease)
	return rec, raw, nil
}

// rawRecord is what Get returns as the raw record.
type rawRecord struct {
	Record    resourcelock.LeaderElectionRecord `json:"record"`
	SessionID int64                             `json:"sessionID,omitempty"`
	Token     int64                             `json:"token,omitempty"`
	RenewTime time.Time                         `json:"renewTimeNanos,omitzero"`
}

func record(lease client.Lease) (*resourcelock.LeaderElectionRecord, []byte) {
	rec := resourcelock.LeaderElectionRecord{LeaderTransitions: int(lease.Transitions), PreferredHolder: lease.PreferredHolder}
	raw := rawRecord{}
	if len(lease.Holders) > 0 {
		g := lease.Holders[0]
		rec.HolderIdentity = g.Holder
		rec.LeaseDurationSeconds = int(math.Ceil(lease.LeaseDuration.Seconds()))
		rec.AcquireTime = metav1.NewTime(g.AcquireTime)
		rec.RenewTime = metav1.NewTime(g.RenewTime)
		raw.SessionID, raw.Token, raw.RenewTime = g.SessionID, g.Token, g.RenewTime
	}
	raw.Record = rec
	b, err := json.Marshal(raw)
	if err != nil {
		// Only strings, numbers and times: marshalling cannot fail.
		panic(fmt.Sprintf("clientgo: marshalling a lease record: %v", err))
	}
	return &rec, b
}

// Create is called by the elector when Get found no lease. It does what
// Update does: Tenure creates the lease with the first grant.
func (l *Lock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, "Create", ler)
}

// Update is called by the elector to take the lease, to renew it, and
// (with ReleaseOnCancel) to give it back with an empty HolderIdentity.
//
// With this Lock's Identity as holder, Update makes sure the session
// holds the lease: if it holds it and the grant is Valid, that is the
// renewal, and nothing is sent (the session's heartbeats keep the
// lease). If it does not hold it, Update asks Tenure for it without
// waiting, and fails, matching client.ErrLocked, while another session
// holds it, whatever the elector's clock made of the record. If the
// grant it held is lost, or no longer Valid, Update gives it back (a
// holder asked to step down for the lease's preferred holder still holds
// it on the server) and fails with ErrLost, and so does every later
// Create and Update.
//
// With an empty HolderIdentity, Update gives the grant back at once, so
// that the next candidate can take it on its next try.
//
// The record's times, duration and transitions are the elector's
// bookkeeping and are not written: Tenure keeps its own.
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, "Update", ler)
}

func (l *Lock) write(ctx context.Context, op string, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ler.HolderIdentity {
	case l.Identity():
		return l.lead(ctx, op)
	case "":
		return l.release(ctx, op)
	default:
		return fmt.Errorf("clientgo: %s %s: %w: %q, not this lock's %q", op, l.lease, ErrForeignHolder, ler.HolderIdentity, l.Identity())
	}
}

// lead makes sure the session holds the lease. l.mu is held.
func (l *Lock) lead(ctx context.Context, op string) error {
	if l.lost != nil {
		return fmt.Errorf("clientgo: %s %s: %w: %w; make a new Lock to campaign again", op, l.lease, ErrLost, l.lost)
	}
	if l.held {
		if l.m.Valid() {
			return nil
		}
		// Lost, or no longer certainly held. Either way this leader must
		// stop: give back whatever the server may still hold, so that
		// the next candidate need not wait for the session to end, and
		// free the session's turn at the lease.
		l.lost = context.Cause(l.m.Context())
		if l.lost == nil {
			l.lost = errors.New("the session's heartbeats are no longer acknowledged in time")
		}
		l.held = false
		l.unlock(ctx)
		return fmt.Errorf("clientgo: %s %s: %w: %w", op, l.lease, ErrLost, l.lost)
	}
	if err := l.m.TryLock(ctx); err != nil {
		if ctx.Err() != nil {
			l.abandon()
		}
		return fmt.Errorf("clientgo: %s %s: %w", op, l.lease, err)
	}
	l.held = true
	return nil
}

// release gives the grant back. l.mu is held.
func (l *Lock) release(ctx context.Context, op string) error {
	if !l.held {
		return nil // never taken, or lost: nothing to give back
	}
	l.held = false
	if err := l.m.Unlock(ctx); err != nil {
		// The grant stays with the session until it closes or expires.
		return fmt.Errorf("clientgo: %s %s: releasing: %w", op, l.lease, err)
	}
	return nil
}

// unlock gives back a grant that has ended or is about to, under its own
// deadline: the elector's context may be the one that just ran out.
func (l *Lock) unlock(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.s.TTL())
	defer cancel()
	_ = l.m.Unlock(ctx)
}

// abandon gives back a grant whose acquire the elector's context cut
// short: the server may have granted it just as the caller went away,
// and the session would keep it, unseen, until it ends. An acquire of a
// lease the session holds returns that grant, which Unlock then gives
// back. l.mu is held.
func (l *Lock) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), l.s.TTL())
	defer cancel()
	lease, err := l.s.Client().Lease(ctx, l.lease.Namespace, l.lease.Name)
	if err != nil {
		return
	}
	for _, g := range lease.Holders {
		if g.SessionID == l.s.ID() && l.m.TryLock(ctx) == nil {
			_ = l.m.Unlock(ctx)
		}
	}
}

// RecordEvent records an elector event ("became leader", "stopped
// leading") with the WithEventRecorder recorder, on a Kubernetes Lease
// object named like the Tenure lease; without one it does nothing.
func (l *Lock) RecordEvent(s string) {
	if l.recorder == nil {
		return
	}
	subject := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.lease.Namespace, Name: l.lease.Name}}
	l.recorder.Eventf(subject, "Normal", "LeaderElection", "%v %v", l.Identity(), s)
}

// Identity is the session's holder identity, which Get reports as
// HolderIdentity while the session holds the lease.
func (l *Lock) Identity() string { return l.s.Identity() }

// Describe is the lease's name, "namespace/name".
func (l *Lock) Describe() string { return l.lease.String() }
