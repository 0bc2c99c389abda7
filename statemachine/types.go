package statemachine

import (
	"errors"
	"fmt"
)

// Errors returned in Result.Err. The API maps each to a wire code in one
// table; callers branch with errors.Is.
var (
	// ErrSessionNotFound is returned when a command names a session that
	// does not exist: never opened, closed, or expired.
	ErrSessionNotFound = errors.New("session not found")
	// ErrLeaseNotFound is returned when a command names a lease that has
	// never been acquired.
	ErrLeaseNotFound = errors.New("lease not found")
	// ErrKeyNotFound is returned when a command needs a key that is absent.
	ErrKeyNotFound = errors.New("key not found")
	// ErrNotHolder is returned when a release, value update or revoke names
	// a token that is not a current holder's.
	ErrNotHolder = errors.New("not holder")
	// ErrLocked is returned by a non-waiting acquire of a full lease.
	ErrLocked = errors.New("lease is held")
	// ErrCompareFailed is returned when a compare-and-swap's compare does
	// not hold; Result.KV carries the key as it is (nil when absent).
	ErrCompareFailed = errors.New("compare failed")
	// ErrCapacityMismatch is returned when an acquire asks for a capacity
	// other than that of a lease that has holders or waiters.
	ErrCapacityMismatch = errors.New("capacity mismatch")
	// ErrTooManyWaiters is returned when a lease's queue is at its limit.
	ErrTooManyWaiters = errors.New("too many waiters")
	// ErrTooManySessions is returned when an identity has as many open
	// sessions as the limit allows.
	ErrTooManySessions = errors.New("too many sessions for identity")
	// ErrNotWaiting is returned when a cancel names a session that is
	// neither waiting for nor holding the lease.
	ErrNotWaiting = errors.New("not waiting")
	// ErrNotSupported is returned for a command that the cluster's
	// version does not run yet: some member's build predates it.
	ErrNotSupported = errors.New("not supported by the cluster version")
	// ErrNotOwner is returned, at apply time, for a command whose Actor
	// may not act for the session or grant it names.
	ErrNotOwner = errors.New("not owner")
	// ErrUnknownCommand is returned for a log entry this version cannot
	// decode. It is never silently skipped.
	ErrUnknownCommand = errors.New("unknown command")
	// ErrNotUTF8 wraps ErrNotSupported. It is returned for a command
	// holding a key or value that is not UTF-8 while the cluster version
	// is below BinaryVersion: the log is still JSON, which would rewrite
	// it. The command changes nothing.
	ErrNotUTF8 = fmt.Errorf("%w: a key or value that is not UTF-8 needs cluster version %d", ErrNotSupported, BinaryVersion)
)

// Session is a client's liveness contract. Its ID is the revision at which
// it was opened, so an ID is never reused: the ID is also its generation.
type Session struct {
	ID       int64             `json:"id"`
	Identity string            `json:"identity"`
	TTL      int64             `json:"ttl"` // nanoseconds
	Labels   map[string]string `json:"labels,omitempty"`
	OpenTime int64             `json:"open_time"` // unix nanoseconds, display only
	// LeaseID is the etcd lease ID the session answers to when it is not
	// its ID: one a client chose in etcd's LeaseGrant. See EtcdLeaseID.
	LeaseID int64 `json:"lease_id,omitempty"`
}

// EtcdLeaseID is the ID the etcd API knows the session by: an etcd lease
// is a session. It is the session's ID unless a client chose another.
func (s Session) EtcdLeaseID() int64 {
	if s.LeaseID != 0 {
		return s.LeaseID
	}
	return s.ID
}

// LeaseID names a lease.
type LeaseID struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (id LeaseID) String() string { return id.Namespace + "/" + id.Name }

// Grant is one holder of a lease.
type Grant struct {
	SessionID   int64  `json:"session_id"`
	Holder      string `json:"holder"`
	Token       int64  `json:"token"`
	AcquireTime int64  `json:"acquire_time"`
	// RenewTime is the last logged change of the grant (acquire or value
	// update). Heartbeats are not logged: the API shows the leader's
	// in-memory last renewal of the session instead when it has one, and
	// an expiry logs it on the ended grant.
	RenewTime int64  `json:"renew_time"`
	Value     string `json:"value,omitempty"`
	// Exclusive grants hold the lease alone, whatever its capacity.
	Exclusive bool `json:"exclusive,omitempty"`
	// StepDown is why the holder was asked to step down ("" while it was
	// not): the lease's preferred holder waits, or the grant outlived its
	// max hold. Asking is all it does; the grant stands until its holder
	// releases it, its session ends or it is revoked.
	StepDown string `json:"step_down,omitempty"`
	// MaxHold (nanoseconds) is how long the holder may keep the grant
	// before the leader asks it to step down and, a grace later, revokes
	// it; 0 is no limit. The state machine only records it.
	MaxHold int64 `json:"max_hold,omitempty"`
}

// Ending says how a grant ended.
type Ending string

const (
	EndReleased Ending = "released" // by its holder, or by closing its session
	EndExpired  Ending = "expired"  // its session expired
	EndRevoked  Ending = "revoked"  // by an administrator
)

// EndedGrant is the last grant of a lease that ended, kept on the record
// so that an unheld lease still says who had it, until when, and how it
// ended, as a Kubernetes Lease keeps its last holder.
type EndedGrant struct {
	SessionID   int64  `json:"session_id"`
	Holder      string `json:"holder"`
	Token       int64  `json:"token"`
	AcquireTime int64  `json:"acquire_time"`
	// RenewTime is the last sign of life the log knows of: the end itself
	// for a release or revoke, the last heartbeat the leader saw for an
	// expiry (carried in the expiry command).
	RenewTime int64  `json:"renew_time"`
	EndTime   int64  `json:"end_time"`
	Ended     Ending `json:"ended"`
	Reason    string `json:"reason,omitempty"`
}

// Waiter is a session parked in a lease's FIFO queue.
type Waiter struct {
	SessionID int64  `json:"session_id"`
	Holder    string `json:"holder"`
	Since     int64  `json:"since"`
	Value     string `json:"value,omitempty"`
	Exclusive bool   `json:"exclusive,omitempty"`
	MaxHold   int64  `json:"max_hold,omitempty"` // the grant's, once granted
}

// Lease is a named ownership record. A lease stays after its last holder
// releases it, so that transitions, labels and its last holder survive,
// like a Kubernetes Lease object, until it has been idle (no holders, no
// waiters, no lock-delay) for GCAfter.
type Lease struct {
	LeaseID
	Capacity    int               `json:"capacity"`
	Holders     []Grant           `json:"holders,omitempty"`
	Waiters     []Waiter          `json:"waiters,omitempty"`
	Transitions int64             `json:"transitions"`
	Labels      map[string]string `json:"labels,omitempty"`
	LockDelay   int64             `json:"lock_delay,omitempty"` // nanoseconds
	// DelayRevision is non-zero while a lock-delay blocks new grants: the
	// revision of the expiry that started it. EndLockDelays names it.
	DelayRevision  int64 `json:"delay_revision,omitempty"`
	CreateRevision int64 `json:"create_revision"`
	ModRevision    int64 `json:"mod_revision"`
	// Last is the most recent grant that ended; nil until one has.
	Last *EndedGrant `json:"last,omitempty"`
	// GCAfter is how long the record may stay idle before the leader
	// deletes it (nanoseconds; 0 keeps it forever). Every acquire sets it.
	GCAfter int64 `json:"gc_after,omitempty"`
	// IdleSince is when the record last became idle (unix nanoseconds,
	// leader time), 0 while it has holders, waiters or a lock-delay. It
	// is set only when GCAfter is: it dates the deletion.
	IdleSince int64 `json:"idle_since,omitempty"`
	// PreferredHolder is the identity that is granted the lease ahead of
	// the queue, and for which other holders are asked to step down.
	PreferredHolder string `json:"preferred_holder,omitempty"`
}

// Idle reports whether nothing holds, waits for or delays the lease: the
// state in which it may be garbage-collected.
func (l *Lease) Idle() bool {
	return len(l.Holders) == 0 && len(l.Waiters) == 0 && l.DelayRevision == 0
}

// KeyValue is a key with its revisions.
type KeyValue struct {
	Key            string `json:"key"`
	Value          string `json:"value"`
	CreateRevision int64  `json:"create_revision"`
	ModRevision    int64  `json:"mod_revision"`
	Version        int64  `json:"version"`
	TTL            int64  `json:"ttl,omitempty"` // nanoseconds; 0 = no TTL of its own
	SessionID      int64  `json:"session_id,omitempty"`
	// LeaseID is the etcd lease ID of the session, when a client chose
	// one other than SessionID; see EtcdLease.
	LeaseID int64 `json:"lease_id,omitempty"`
}

// EtcdLease is the etcd lease the key is attached to (0: none).
func (kv *KeyValue) EtcdLease() int64 {
	if kv.LeaseID != 0 {
		return kv.LeaseID
	}
	return kv.SessionID
}

// EventType says what an event records.
type EventType uint8

// Event types, numbered by hand; append new ones.
const (
	EventSessionOpened   EventType = 1
	EventSessionClosed   EventType = 2
	EventSessionExpired  EventType = 3
	EventLeaseAcquired   EventType = 4
	EventLeaseReleased   EventType = 5
	EventLeaseExpired    EventType = 6 // a grant ended because its session expired
	EventLeaseRevoked    EventType = 7
	EventLeaseWaiting    EventType = 8
	EventLeaseWaitEnded  EventType = 9 // a waiter left the queue without a grant
	EventLeaseValueSet   EventType = 10
	EventLockDelayEnded  EventType = 11
	EventKeyPut          EventType = 12
	EventKeyDeleted      EventType = 13
	EventKeyExpired      EventType = 14
	EventLeaseReleasedBy EventType = 15 // a grant ended because its session was closed
	EventLeaseDeleted    EventType = 16 // an idle lease record was garbage-collected
	EventLeaseStepDown   EventType = 17 // a holder was asked to step down; its grant stands
	EventLeasePreferred  EventType = 18 // the preferred holder was set or cleared
)

var eventTypeNames = map[EventType]string{
	EventSessionOpened:   "session-opened",
	EventSessionClosed:   "session-closed",
	EventSessionExpired:  "session-expired",
	EventLeaseAcquired:   "acquired",
	EventLeaseReleased:   "released",
	EventLeaseExpired:    "expired",
	EventLeaseRevoked:    "revoked",
	EventLeaseWaiting:    "waiting",
	EventLeaseWaitEnded:  "wait-ended",
	EventLeaseValueSet:   "value-set",
	EventLockDelayEnded:  "lock-delay-ended",
	EventKeyPut:          "put",
	EventKeyDeleted:      "deleted",
	EventKeyExpired:      "key-expired",
	EventLeaseReleasedBy: "released-by-close",
	EventLeaseDeleted:    "lease-deleted",
	EventLeaseStepDown:   "step-down",
	EventLeasePreferred:  "preferred-holder-set",
}

func (t EventType) String() string {
	if s, ok := eventTypeNames[t]; ok {
		return s
	}
	return "unknown"
}

// IsLease reports whether the event is about a lease.
func (t EventType) IsLease() bool {
	return t >= EventLeaseAcquired && t <= EventLockDelayEnded || t >= EventLeaseReleasedBy && t <= EventLeasePreferred
}

// IsKey reports whether the event is about a key.
func (t EventType) IsKey() bool { return t >= EventKeyPut && t <= EventKeyExpired }

// IsSession reports whether the event is about a session.
func (t EventType) IsSession() bool { return t >= EventSessionOpened && t <= EventSessionExpired }

// Event is one change to the state. Every event has its own revision, and
// revisions are contiguous, so a watcher that saw revision r knows the next
// event is r+1.
type Event struct {
	Revision int64     `json:"revision"`
	Type     EventType `json:"type"`
	Time     int64     `json:"time"` // the command's now, display only

	// Session events, and lease events about one session's grant or wait.
	SessionID int64    `json:"session_id,omitempty"`
	Session   *Session `json:"session,omitempty"` // on EventSessionOpened

	// Lease events.
	Lease  LeaseID `json:"lease"`
	Holder string  `json:"holder,omitempty"`
	Token  int64   `json:"token,omitempty"`
	Value  string  `json:"value,omitempty"`
	Reason string  `json:"reason,omitempty"`
	// LockDelay is set on EventLeaseExpired when the expiry starts a
	// lock-delay; the delay's revision is the event's revision.
	LockDelay int64 `json:"lock_delay,omitempty"`
	// GCAfter is set on the last event of a command that leaves a lease
	// idle and collectable: the lessor times its deletion from here. Any
	// later event of the lease without it ends that timing.
	GCAfter int64 `json:"gc_after,omitempty"`

	// Key events.
	KV     *KeyValue `json:"kv,omitempty"`
	PrevKV *KeyValue `json:"prev_kv,omitempty"`
}

// Result is what Apply returns for one command.
type Result struct {
	// Revision is the store's revision after the command.
	Revision int64
	// KVRevision is the keys' revision after the command (mvcc.go).
	KVRevision int64
	// Err is a sentinel error from this package, possibly wrapped with
	// detail. A command that fails changes nothing and has no events.
	Err    error
	Events []Event

	Session *Session // OpenSession
	Lease   *Lease   // Acquire, Release, SetValue, Revoke: the lease after
	Grant   *Grant   // Acquire: the caller's grant when acquired
	Queued  bool     // Acquire: the caller waits in the queue
	KV      *KeyValue
	PrevKV  *KeyValue
	Deleted int64   // Delete
	Revoked []int64 // Revoke: tokens revoked
	Epoch   int64   // NewEpoch
	Txn     *TxnResponse
	// AuthRevision is the auth store's revision after an AuthChange
	// that changed it, 0 otherwise: the replication layer tells its
	// observer of such a change though it has no events.
	AuthRevision int64
}

// Deadlines lists everything the leader's lessor must time, read from the
// state when a node becomes leader.
type Deadlines struct {
	Sessions []SessionTTL
	Keys     []KeyTTL
	Delays   []LockDelay
	Idle     []IdleLease
}

// SessionTTL is a session's identity and TTL.
type SessionTTL struct {
	ID  int64
	TTL int64 // nanoseconds
}

// KeyTTL is a key with a TTL of its own, at the revision that set it.
type KeyTTL struct {
	Key         string `json:"key"`
	ModRevision int64  `json:"mod_revision"`
	TTL         int64  `json:"ttl,omitempty"`
}

// LockDelay is an active lock-delay, named by the revision that began it.
type LockDelay struct {
	Lease    LeaseID `json:"lease"`
	Revision int64   `json:"revision"`
	Delay    int64   `json:"delay,omitempty"`
}

// IdleLease is a lease that is idle and collectable, named by its
// ModRevision when it became idle: a later change of the lease makes the
// collection a no-op.
type IdleLease struct {
	Lease    LeaseID `json:"lease"`
	Revision int64   `json:"revision"`
	// GCAfter and IdleSince date the deletion, for a new leader.
	GCAfter   int64 `json:"gc_after,omitempty"`
	IdleSince int64 `json:"idle_since,omitempty"`
}
