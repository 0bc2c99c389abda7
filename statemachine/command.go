package statemachine

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Kind numbers a command on the wire. Numbered by hand; append new kinds,
// never renumber: the log outlives the binary that wrote it.
type Kind uint8

const (
	KindOpenSession    Kind = 1
	KindCloseSession   Kind = 2
	KindExpireSession  Kind = 3
	KindAcquire        Kind = 4
	KindRelease        Kind = 5
	KindSetValue       Kind = 6
	KindRevoke         Kind = 7
	KindCancelWait     Kind = 8
	KindPut            Kind = 9
	KindDelete         Kind = 10
	KindCompareAndSwap Kind = 11
	KindExpireKeys     Kind = 12
	KindEndLockDelays  Kind = 13
	KindNewEpoch       Kind = 14
	KindSetMember      Kind = 15
	KindCollectLeases  Kind = 16
	KindSetPreferred   Kind = 17
	KindSetVersion     Kind = 18
	KindAskStepDown    Kind = 19
	KindTxn            Kind = 20
	KindCompact        Kind = 21
	KindSetAlarm       Kind = 22
	KindAuthChange     Kind = 23

	lastKind = KindAuthChange
)

// Every kind leaves the entry's binaryFlag bit clear: this fails to
// compile when one does not.
const _ = uint8(binaryFlag - 1 - lastKind)

// Command is one state change proposed to the log.
type Command interface {
	Kind() Kind
}

// OpenSession opens a session. MaxPerIdentity (0 = unlimited) bounds the
// sessions one identity may hold open.
type OpenSession struct {
	Identity       string            `json:"identity,omitempty"`
	TTL            int64             `json:"ttl"`
	Labels         map[string]string `json:"labels,omitempty"`
	MaxPerIdentity int               `json:"max_per_identity,omitempty"`
	// LeaseID is the etcd lease ID a client chose for the session (etcd's
	// LeaseGrant with an ID); 0 lets the session's ID be its lease ID.
	// Refused with ErrLeaseExists while an open session answers to it.
	LeaseID int64 `json:"lease_id,omitempty"`
}

// CloseSession ends a session cleanly: no lock-delay.
type CloseSession struct {
	SessionID int64 `json:"session_id"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// ExpireSessions ends sessions whose TTL passed on the leader. Ignored
// unless Epoch is the current epoch; unknown IDs are skipped.
type ExpireSessions struct {
	Epoch int64   `json:"epoch"`
	IDs   []int64 `json:"ids"`
	// Renewed is, beside each ID, when the leader last heard from the
	// session (unix ns; 0 if it never did): the renew time the ended
	// grants keep. Heartbeats stay out of the log; their last one is
	// written once, here.
	Renewed []int64 `json:"renewed,omitempty"`
}

// Acquire grants a lease to a session, or queues it when Wait is set.
type Acquire struct {
	SessionID  int64             `json:"session_id"`
	Lease      LeaseID           `json:"lease"`
	Capacity   int               `json:"capacity"`
	Wait       bool              `json:"wait,omitempty"`
	Value      string            `json:"value,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	LockDelay  int64             `json:"lock_delay,omitempty"`
	MaxWaiters int               `json:"max_waiters,omitempty"` // 0 = unlimited
	// Exclusive asks for the lease alone, whatever its capacity: the
	// writer of a readers-writer lock whose readers use capacity N.
	Exclusive bool `json:"exclusive,omitempty"`
	// GCAfter (nanoseconds) is how long the record may stay idle before
	// it is deleted; 0 keeps it forever. Set on every successful acquire.
	GCAfter int64 `json:"gc_after,omitempty"`
	// MaxHold (nanoseconds) is the grant's max hold; 0 is none.
	MaxHold int64 `json:"max_hold,omitempty"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// Release ends the grant named by Token.
type Release struct {
	Lease LeaseID `json:"lease"`
	Token int64   `json:"token"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// SetValue replaces the value of the grant named by Token.
type SetValue struct {
	Lease LeaseID `json:"lease"`
	Token int64   `json:"token"`
	Value string  `json:"value"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// Revoke ends the grant named by Token, or every grant when Token is 0.
type Revoke struct {
	Lease  LeaseID `json:"lease"`
	Token  int64   `json:"token,omitempty"`
	Reason string  `json:"reason,omitempty"`
}

// CancelWait takes a session out of a lease's queue, when a waiting
// Acquire times out or its caller goes away. With ReleaseIfHeld, a grant
// the session received meanwhile is released too: nobody is left holding
// a lease that no caller knows about.
type CancelWait struct {
	SessionID     int64   `json:"session_id"`
	Lease         LeaseID `json:"lease"`
	ReleaseIfHeld bool    `json:"release_if_held,omitempty"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// Put writes a key. TTL (nanoseconds) makes it expire; SessionID binds it
// to a session. PrevKV is always returned.
type Put struct {
	Key       string `json:"key"`
	Value     string `json:"value"`
	TTL       int64  `json:"ttl,omitempty"`
	SessionID int64  `json:"session_id,omitempty"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// Delete removes a key, or every key with Key as prefix.
type Delete struct {
	Key    string `json:"key"`
	Prefix bool   `json:"prefix,omitempty"`
}

// CompareTarget says what a compare-and-swap checks.
type CompareTarget uint8

const (
	CompareAbsent      CompareTarget = 1
	CompareValue       CompareTarget = 2
	CompareModRevision CompareTarget = 3
)

// CompareAndSwap writes or deletes a key only if the compare holds.
type CompareAndSwap struct {
	Key         string        `json:"key"`
	Target      CompareTarget `json:"target"`
	Value       string        `json:"value,omitempty"`        // CompareValue: expected value
	ModRevision int64         `json:"mod_revision,omitempty"` // CompareModRevision: expected (0 = absent)
	Delete      bool          `json:"delete,omitempty"`
	NewValue    string        `json:"new_value,omitempty"`
	TTL         int64         `json:"ttl,omitempty"`
	SessionID   int64         `json:"session_id,omitempty"`
	// Actor is who proposed it, checked against the session's identity
	// when the command is applied (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// ExpireKeys deletes keys whose TTL passed on the leader, each only if it
// is still at the named revision. Ignored unless Epoch is current.
type ExpireKeys struct {
	Epoch int64    `json:"epoch"`
	Keys  []KeyTTL `json:"keys"`
}

// EndLockDelays lifts lock-delays whose time passed on the leader, each
// only if it is still the delay named by its revision, and grants waiters.
// Ignored unless Epoch is current.
type EndLockDelays struct {
	Epoch  int64       `json:"epoch"`
	Delays []LockDelay `json:"delays"`
}

// NewEpoch is proposed by a node that has just become leader, after a
// barrier. Expiries proposed by earlier leaders are ignored from then on.
type NewEpoch struct{}

// SetMember records the API address a cluster member advertises, so that
// every node can name the leader's; an empty APIAddress forgets the
// member. Membership itself is raft's configuration: this is only what
// raft has no room for. It emits no event and leaves the revision alone,
// since no client-visible state changes.
type SetMember struct {
	ID         string `json:"id"`
	APIAddress string `json:"api_address,omitempty"`
	// Version is the highest cluster version the member's build runs
	// (0, from builds before versions, means 1).
	Version int `json:"version,omitempty"`
	// EtcdAddress is the member's etcd API address, if it serves one:
	// what etcd's MemberList calls its client URL, and where followers
	// forward etcd calls that need the leader.
	EtcdAddress string `json:"etcd_address,omitempty"`
}

// AskStepDown asks the holder of the grant named by Token to step down,
// for Reason: the leader proposes it when a grant outlives its max hold.
// Like a preferred holder's request it takes nothing; the leader revokes
// the grant a grace later if it still stands.
type AskStepDown struct {
	Lease  LeaseID `json:"lease"`
	Token  int64   `json:"token"`
	Reason string  `json:"reason"`
}

// SetVersion raises the cluster version: the leader proposes it once
// every member has registered a build that runs it, so that no replica
// applies a later command differently from another. It never lowers the
// version, emits no event and leaves the revision alone.
type SetVersion struct {
	Version int `json:"version"`
}

// CollectLeases deletes leases that stayed idle for their GCAfter on the
// leader, each only if it is still idle at the named revision. Ignored
// unless Epoch is current.
type CollectLeases struct {
	Epoch  int64       `json:"epoch"`
	Leases []IdleLease `json:"leases"`
}

// SetPreferred names the identity a lease prefers as holder, or clears it
// with an empty Identity. A waiter with that identity is granted ahead of
// the queue, and holders in its way are asked to step down.
type SetPreferred struct {
	Lease    LeaseID `json:"lease"`
	Identity string  `json:"identity,omitempty"`
}

func (OpenSession) Kind() Kind    { return KindOpenSession }
func (CloseSession) Kind() Kind   { return KindCloseSession }
func (ExpireSessions) Kind() Kind { return KindExpireSession }
func (Acquire) Kind() Kind        { return KindAcquire }
func (Release) Kind() Kind        { return KindRelease }
func (SetValue) Kind() Kind       { return KindSetValue }
func (Revoke) Kind() Kind         { return KindRevoke }
func (CancelWait) Kind() Kind     { return KindCancelWait }
func (Put) Kind() Kind            { return KindPut }
func (Delete) Kind() Kind         { return KindDelete }
func (CompareAndSwap) Kind() Kind { return KindCompareAndSwap }
func (ExpireKeys) Kind() Kind     { return KindExpireKeys }
func (EndLockDelays) Kind() Kind  { return KindEndLockDelays }
func (NewEpoch) Kind() Kind       { return KindNewEpoch }
func (SetMember) Kind() Kind      { return KindSetMember }
func (CollectLeases) Kind() Kind  { return KindCollectLeases }
func (SetPreferred) Kind() Kind   { return KindSetPreferred }
func (SetVersion) Kind() Kind     { return KindSetVersion }
func (AskStepDown) Kind() Kind    { return KindAskStepDown }
func (Txn) Kind() Kind            { return KindTxn }
func (Compact) Kind() Kind        { return KindCompact }
func (SetAlarm) Kind() Kind       { return KindSetAlarm }
func (AuthChange) Kind() Kind     { return KindAuthChange }

// A log entry is a header, one byte of kind and eight of the leader's
// unix nanoseconds, then the command's body. The body is binary (codec.go)
// when the kind byte has binaryFlag set, and JSON otherwise: the form of
// builds before cluster version 6, which this one still reads, and writes
// while a member may run one of them.
const headerLen = 1 + 8

// binaryFlag marks an entry whose body is binary. No kind reaches it.
const binaryFlag = 0x80

// EncodeFor turns a command and the leader's time into a log entry that
// every member of a cluster at clusterVersion reads: binary from
// BinaryVersion on, JSON before it.
func EncodeFor(clusterVersion int, now int64, cmd Command) ([]byte, error) {
	if clusterVersion >= BinaryVersion {
		return Encode(now, cmd)
	}
	return EncodeJSON(now, cmd)
}

// Encode turns a command and the leader's time into a binary log entry.
func Encode(now int64, cmd Command) ([]byte, error) {
	if cmd == nil || cmd.Kind() == 0 || cmd.Kind() > lastKind {
		return nil, fmt.Errorf("encode %T: %w", cmd, ErrUnknownCommand)
	}
	e := encoder{b: make([]byte, headerLen, headerLen+64)}
	e.b[0] = byte(cmd.Kind()) | binaryFlag
	binary.BigEndian.PutUint64(e.b[1:], uint64(now))
	encodeCommand(&e, cmd)
	return e.b, nil
}

// EncodeJSON turns a command into a log entry in the JSON form, which
// builds before cluster version 6 read. JSON strings are UTF-8, and
// encoding/json would rewrite any other byte to U+FFFD without a word:
// a command with a string that is not UTF-8 is refused instead, with
// ErrNotUTF8, and changes nothing.
func EncodeJSON(now int64, cmd Command) ([]byte, error) {
	check := encoder{checkUTF8: true}
	encodeCommand(&check, cmd)
	if check.notUTF8 {
		return nil, fmt.Errorf("%w, and a member still runs an older build: upgrade every member", ErrNotUTF8)
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", cmd, err)
	}
	buf := make([]byte, headerLen, headerLen+len(body))
	buf[0] = byte(cmd.Kind())
	binary.BigEndian.PutUint64(buf[1:], uint64(now))
	return append(buf, body...), nil
}

// IsBinary reports whether data is an entry in the binary form. Such an
// entry is applied only at BinaryVersion or later: below it a member may
// run a build that cannot decode it, and refuses it as ErrUnknownCommand,
// so every replica must refuse it too (ErrNotSupported) to stay alike.
// Leaders write binary entries only from BinaryVersion on (EncodeFor).
func IsBinary(data []byte) bool { return len(data) > 0 && data[0]&binaryFlag != 0 }

// Decode is the inverse of Encode and of EncodeJSON.
func Decode(data []byte) (now int64, cmd Command, err error) {
	if len(data) < headerLen {
		return 0, nil, fmt.Errorf("%w: entry of %d bytes is shorter than its header", ErrUnknownCommand, len(data))
	}
	now = int64(binary.BigEndian.Uint64(data[1:]))
	kind, body := Kind(data[0]&^binaryFlag), data[headerLen:]
	if kind == 0 || kind > lastKind {
		return 0, nil, fmt.Errorf("%w: kind %d", ErrUnknownCommand, data[0])
	}
	if data[0]&binaryFlag == 0 {
		cmd, err = decodeJSON(kind, body)
		if err != nil {
			return 0, nil, err
		}
		return now, cmd, nil
	}
	d := decoder{b: body}
	cmd = decodeCommand(&d, kind)
	if err := d.done("command"); err != nil {
		return 0, nil, fmt.Errorf("%w: %T: %v", ErrUnknownCommand, cmd, err)
	}
	return now, cmd, nil
}

func decodeJSON(kind Kind, body []byte) (Command, error) {
	switch kind {
	case KindOpenSession:
		return decodeAs[OpenSession](body)
	case KindCloseSession:
		return decodeAs[CloseSession](body)
	case KindExpireSession:
		return decodeAs[ExpireSessions](body)
	case KindAcquire:
		return decodeAs[Acquire](body)
	case KindRelease:
		return decodeAs[Release](body)
	case KindSetValue:
		return decodeAs[SetValue](body)
	case KindRevoke:
		return decodeAs[Revoke](body)
	case KindCancelWait:
		return decodeAs[CancelWait](body)
	case KindPut:
		return decodeAs[Put](body)
	case KindDelete:
		return decodeAs[Delete](body)
	case KindCompareAndSwap:
		return decodeAs[CompareAndSwap](body)
	case KindExpireKeys:
		return decodeAs[ExpireKeys](body)
	case KindEndLockDelays:
		return decodeAs[EndLockDelays](body)
	case KindNewEpoch:
		return decodeAs[NewEpoch](body)
	case KindSetMember:
		return decodeAs[SetMember](body)
	case KindCollectLeases:
		return decodeAs[CollectLeases](body)
	case KindSetPreferred:
		return decodeAs[SetPreferred](body)
	case KindSetVersion:
		return decodeAs[SetVersion](body)
	case KindAskStepDown:
		return decodeAs[AskStepDown](body)
	case KindTxn:
		return decodeAs[Txn](body)
	case KindCompact:
		return decodeAs[Compact](body)
	case KindSetAlarm:
		return decodeAs[SetAlarm](body)
	case KindAuthChange:
		return decodeAs[AuthChange](body)
	}
	return nil, fmt.Errorf("%w: kind %d", ErrUnknownCommand, kind)
}

func decodeAs[T Command](body []byte) (Command, error) {
	var c T
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("%w: %T: %v", ErrUnknownCommand, c, err)
	}
	return c, nil
}
