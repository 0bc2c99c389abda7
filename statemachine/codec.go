package statemachine

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"unicode/utf8"
)

// The binary codec writes commands into the log and the state into
// snapshots from cluster version 6 on (BinaryVersion). Why a codec of
// our own and not protobuf:
//
//   - Keys and values are bytes and stay bytes (DESIGN.md, safety rule
//     11). Both would keep them; JSON, the codec before, did not: it
//     rewrote every byte that is not UTF-8 to U+FFFD.
//   - The commands are the Go structs the pure machine applies. Protobuf
//     would add a generated twin of each, and a copy from one to the
//     other on every proposal and every apply, on both sides of the
//     hottest path there is; this codec appends straight from the
//     structs and reads straight into them, without reflection.
//   - Determinism is by construction: fields in a fixed order, maps in
//     key order. Protobuf's deterministic marshalling is deterministic
//     only per build of the library, which is not a promise to a log
//     that replicas of different builds replay.
//   - Its one weakness, a hand-written pair per type that could drift,
//     is what the tests close: every field of every type is filled by
//     reflection and must survive the round trip, and a fuzz target
//     feeds Decode arbitrary bytes.
//
// The format: integers are varints (signed ones zigzagged), strings a
// length and the bytes as they are, booleans one byte (0 or 1), slices a
// count and their items, maps a count and their pairs in strictly rising
// key order, an optional struct a presence byte. Each type writes its
// fields in the order its encode method gives. A field added later is
// appended at the end of its type and read only when bytes remain (see
// decoder.more), and is written only once the cluster version every
// replica runs reads it, as every change of what a command means is.
// Decode refuses a body with bytes left over, a truncated one, a boolean
// other than 0 or 1 and a map out of order: a damaged entry is an error,
// never a command nobody proposed.

// BinaryVersion is the cluster version from which the log and snapshots
// are written in the binary codec. Before it, every member may still run
// a build that reads only JSON, so commands are written as JSON, and a
// command holding a string that is not UTF-8 is refused rather than
// rewritten (ErrNotSupported).
const BinaryVersion = 6

// maxTxnDepth bounds the nesting of Txns a decoder follows, as
// encoding/json bounded it: far above what the API accepts, it keeps a
// damaged entry from running the stack down.
const maxTxnDepth = 10000

type encoder struct {
	b []byte
	// checkUTF8 makes str record in notUTF8 a string that is not UTF-8:
	// for the JSON form, which cannot carry one.
	checkUTF8, notUTF8 bool
	// w, when set, takes b whenever it has grown past flushAt, between
	// the items of a list (encodeSlice), so that a snapshot is written
	// in pieces rather than built whole beside the state it copies; err
	// is w's first error, after which nothing more is written.
	w   io.Writer
	err error
}

// flushAt is how much an encoder with a writer holds before it writes.
const flushAt = 64 << 10

// flush writes what b holds to w, if the encoder has one.
func (e *encoder) flush() {
	if e.w == nil || len(e.b) == 0 {
		return
	}
	if e.err == nil {
		_, e.err = e.w.Write(e.b)
	}
	e.b = e.b[:0]
}

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }

func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) str(s string) {
	e.uint(uint64(len(s)))
	e.b = append(e.b, s...)
	if e.checkUTF8 && !e.notUTF8 && !utf8.ValidString(s) {
		e.notUTF8 = true
	}
}

func (e *encoder) ints(s []int64) {
	e.uint(uint64(len(s)))
	for _, v := range s {
		e.int(v)
	}
}

func (e *encoder) strs(s []string) {
	e.uint(uint64(len(s)))
	for _, v := range s {
		e.str(v)
	}
}

func (e *encoder) labels(m map[string]string) { encodeMap(e, m, (*encoder).str) }

func (e *encoder) intMap(m map[string]int) {
	encodeMap(e, m, func(e *encoder, v int) { e.int(int64(v)) })
}

// encodeMap writes m's size, then its pairs in key order.
func encodeMap[V any](e *encoder, m map[string]V, enc func(*encoder, V)) {
	e.uint(uint64(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		e.str(k)
		enc(e, m[k])
	}
}

func (e *encoder) leaseID(id LeaseID) {
	e.str(id.Namespace)
	e.str(id.Name)
}

func (e *encoder) actor(a *Actor) {
	e.bool(a != nil)
	if a != nil {
		e.str(a.Principal)
		e.strs(a.Identities)
		e.bool(a.Breaker)
	}
}

// encodeSlice writes s's length, then each item with enc.
func encodeSlice[T any](e *encoder, s []T, enc func(*encoder, *T)) {
	e.uint(uint64(len(s)))
	for i := range s {
		enc(e, &s[i])
		if len(e.b) >= flushAt {
			e.flush()
		}
	}
}

type decoder struct {
	b     []byte
	err   error
	depth int // of nested Txns
}

// fail records the first error; every read after it returns zero.
func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
	d.b = nil
}

// done is the decoder's error once its caller has read all it knows of: a
// byte left over is damage too.
func (d *decoder) done(what string) error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d bytes after the %s", len(d.b), what)
	}
	return d.err
}

// more reports whether bytes remain: how a field appended to a type
// after its first release is read only from entries that have it.
func (d *decoder) more() bool { return d.err == nil && len(d.b) > 0 }

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong unsigned varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// goInt reads an int field, refusing one this platform's int cannot hold.
func (d *decoder) goInt() int {
	v := d.int()
	if int64(int(v)) != v {
		d.fail("integer %d overflows int", v)
		return 0
	}
	return int(v)
}

// small reads an enumeration stored in a byte-sized type.
func (d *decoder) small() uint8 {
	v := d.uint()
	if v > 255 {
		d.fail("enumeration value %d is over 255", v)
		return 0
	}
	return uint8(v)
}

func (d *decoder) bool() bool {
	if len(d.b) == 0 {
		d.fail("truncated boolean")
		return false
	}
	v := d.b[0]
	if v > 1 {
		d.fail("boolean byte %#x is neither 0 nor 1", v)
		return false
	}
	d.b = d.b[1:]
	return v == 1
}

// count reads the length of a string, slice or map. Every item takes at
// least one byte, so a count above the bytes left is damage, and
// refusing it keeps a damaged entry from allocating without bound.
func (d *decoder) count() int {
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail("length %d is over the %d bytes left", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.count()
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) ints() []int64 {
	n := d.count()
	if n == 0 {
		return nil
	}
	s := make([]int64, n)
	for i := range s {
		s[i] = d.int()
	}
	return s
}

func (d *decoder) strs() []string {
	n := d.count()
	if n == 0 {
		return nil
	}
	s := make([]string, n)
	for i := range s {
		s[i] = d.str()
	}
	return s
}

func (d *decoder) labels() map[string]string { return decodeMap(d, (*decoder).str) }

func (d *decoder) intMap() map[string]int { return decodeMap(d, (*decoder).goInt) }

// decodeMap reads what encodeMap wrote, refusing keys that do not rise;
// nil when empty.
func decodeMap[V any](d *decoder, dec func(*decoder) V) map[string]V {
	n := d.count()
	if n == 0 {
		return nil
	}
	m := make(map[string]V, n)
	var last string
	for i := range n {
		k := d.str()
		if i > 0 && k <= last {
			d.fail("map key %q is not above %q", k, last)
		}
		m[k], last = dec(d), k
	}
	return m
}

func (d *decoder) leaseID() LeaseID {
	return LeaseID{Namespace: d.str(), Name: d.str()}
}

func (d *decoder) actor() *Actor {
	if !d.bool() {
		return nil
	}
	return &Actor{Principal: d.str(), Identities: d.strs(), Breaker: d.bool()}
}

// decodeSlice reads what encodeSlice wrote; nil when empty.
func decodeSlice[T any](d *decoder, dec func(*decoder, *T)) []T {
	n := d.count()
	if n == 0 {
		return nil
	}
	s := make([]T, n)
	for i := range s {
		dec(d, &s[i])
		if d.err != nil {
			return nil
		}
	}
	return s
}

// encodeCommand appends cmd's body.
func encodeCommand(e *encoder, cmd Command) {
	switch c := cmd.(type) {
	case OpenSession:
		e.str(c.Identity)
		e.int(c.TTL)
		e.labels(c.Labels)
		e.int(int64(c.MaxPerIdentity))
		e.int(c.LeaseID)
	case CloseSession:
		e.int(c.SessionID)
		e.actor(c.Actor)
	case ExpireSessions:
		e.int(c.Epoch)
		e.ints(c.IDs)
		e.ints(c.Renewed)
	case Acquire:
		e.int(c.SessionID)
		e.leaseID(c.Lease)
		e.int(int64(c.Capacity))
		e.bool(c.Wait)
		e.str(c.Value)
		e.labels(c.Labels)
		e.int(c.LockDelay)
		e.int(int64(c.MaxWaiters))
		e.bool(c.Exclusive)
		e.int(c.GCAfter)
		e.int(c.MaxHold)
		e.actor(c.Actor)
	case Release:
		e.leaseID(c.Lease)
		e.int(c.Token)
		e.actor(c.Actor)
	case SetValue:
		e.leaseID(c.Lease)
		e.int(c.Token)
		e.str(c.Value)
		e.actor(c.Actor)
	case Revoke:
		e.leaseID(c.Lease)
		e.int(c.Token)
		e.str(c.Reason)
	case CancelWait:
		e.int(c.SessionID)
		e.leaseID(c.Lease)
		e.bool(c.ReleaseIfHeld)
		e.actor(c.Actor)
	case Put:
		e.str(c.Key)
		e.str(c.Value)
		e.int(c.TTL)
		e.int(c.SessionID)
		e.actor(c.Actor)
	case Delete:
		e.str(c.Key)
		e.bool(c.Prefix)
	case CompareAndSwap:
		e.str(c.Key)
		e.uint(uint64(c.Target))
		e.str(c.Value)
		e.int(c.ModRevision)
		e.bool(c.Delete)
		e.str(c.NewValue)
		e.int(c.TTL)
		e.int(c.SessionID)
		e.actor(c.Actor)
	case ExpireKeys:
		e.int(c.Epoch)
		encodeSlice(e, c.Keys, func(e *encoder, k *KeyTTL) {
			e.str(k.Key)
			e.int(k.ModRevision)
			e.int(k.TTL)
		})
	case EndLockDelays:
		e.int(c.Epoch)
		encodeSlice(e, c.Delays, func(e *encoder, l *LockDelay) {
			e.leaseID(l.Lease)
			e.int(l.Revision)
			e.int(l.Delay)
		})
	case NewEpoch:
	case SetMember:
		e.str(c.ID)
		e.str(c.APIAddress)
		e.int(int64(c.Version))
		e.str(c.EtcdAddress)
	case CollectLeases:
		e.int(c.Epoch)
		encodeSlice(e, c.Leases, func(e *encoder, l *IdleLease) {
			e.leaseID(l.Lease)
			e.int(l.Revision)
			e.int(l.GCAfter)
			e.int(l.IdleSince)
		})
	case SetPreferred:
		e.leaseID(c.Lease)
		e.str(c.Identity)
	case SetVersion:
		e.int(int64(c.Version))
	case AskStepDown:
		e.leaseID(c.Lease)
		e.int(c.Token)
		e.str(c.Reason)
	case Txn:
		encodeTxn(e, &c)
	case Compact:
		e.int(c.Revision)
	case SetAlarm:
		e.str(c.Member)
		e.uint(uint64(c.Alarm))
		e.bool(c.Active)
	case AuthChange:
		e.uint(uint64(c.Op))
		e.str(c.User)
		e.str(c.Role)
		e.str(c.Password)
		e.bool(c.NoPassword)
		encodeAuthPerm(e, &c.Perm)
	}
}

func encodeTxn(e *encoder, t *Txn) {
	encodeSlice(e, t.Compares, func(e *encoder, c *TxnCompare) {
		e.str(c.Key)
		e.str(c.End)
		e.uint(uint64(c.Target))
		e.uint(uint64(c.Op))
		e.int(c.Number)
		e.str(c.Value)
	})
	encodeSlice(e, t.Success, encodeTxnOp)
	encodeSlice(e, t.Failure, encodeTxnOp)
	e.actor(t.Actor)
}

func encodeTxnOp(e *encoder, op *TxnOp) {
	e.uint(uint64(op.Type))
	e.str(op.Key)
	e.str(op.End)
	e.int(op.Revision)
	e.str(op.Value)
	e.int(op.Lease)
	e.bool(op.IgnoreValue)
	e.bool(op.IgnoreLease)
	e.bool(op.Txn != nil)
	if op.Txn != nil {
		encodeTxn(e, op.Txn)
	}
}

// decodeCommand reads the body of a command of kind k; nil for a kind
// this build does not know.
func decodeCommand(d *decoder, k Kind) Command {
	switch k {
	case KindOpenSession:
		return OpenSession{Identity: d.str(), TTL: d.int(), Labels: d.labels(), MaxPerIdentity: d.goInt(), LeaseID: d.int()}
	case KindCloseSession:
		return CloseSession{SessionID: d.int(), Actor: d.actor()}
	case KindExpireSession:
		return ExpireSessions{Epoch: d.int(), IDs: d.ints(), Renewed: d.ints()}
	case KindAcquire:
		return Acquire{
			SessionID: d.int(), Lease: d.leaseID(), Capacity: d.goInt(), Wait: d.bool(),
			Value: d.str(), Labels: d.labels(), LockDelay: d.int(), MaxWaiters: d.goInt(),
			Exclusive: d.bool(), GCAfter: d.int(), MaxHold: d.int(), Actor: d.actor(),
		}
	case KindRelease:
		return Release{Lease: d.leaseID(), Token: d.int(), Actor: d.actor()}
	case KindSetValue:
		return SetValue{Lease: d.leaseID(), Token: d.int(), Value: d.str(), Actor: d.actor()}
	case KindRevoke:
		return Revoke{Lease: d.leaseID(), Token: d.int(), Reason: d.str()}
	case KindCancelWait:
		return CancelWait{SessionID: d.int(), Lease: d.leaseID(), ReleaseIfHeld: d.bool(), Actor: d.actor()}
	case KindPut:
		return Put{Key: d.str(), Value: d.str(), TTL: d.int(), SessionID: d.int(), Actor: d.actor()}
	case KindDelete:
		return Delete{Key: d.str(), Prefix: d.bool()}
	case KindCompareAndSwap:
		return CompareAndSwap{
			Key: d.str(), Target: CompareTarget(d.small()), Value: d.str(), ModRevision: d.int(),
			Delete: d.bool(), NewValue: d.str(), TTL: d.int(), SessionID: d.int(), Actor: d.actor(),
		}
	case KindExpireKeys:
		return ExpireKeys{Epoch: d.int(), Keys: decodeSlice(d, func(d *decoder, k *KeyTTL) {
			*k = KeyTTL{Key: d.str(), ModRevision: d.int(), TTL: d.int()}
		})}
	case KindEndLockDelays:
		return EndLockDelays{Epoch: d.int(), Delays: decodeSlice(d, func(d *decoder, l *LockDelay) {
			*l = LockDelay{Lease: d.leaseID(), Revision: d.int(), Delay: d.int()}
		})}
	case KindNewEpoch:
		return NewEpoch{}
	case KindSetMember:
		return SetMember{ID: d.str(), APIAddress: d.str(), Version: d.goInt(), EtcdAddress: d.str()}
	case KindCollectLeases:
		return CollectLeases{Epoch: d.int(), Leases: decodeSlice(d, func(d *decoder, l *IdleLease) {
			*l = IdleLease{Lease: d.leaseID(), Revision: d.int(), GCAfter: d.int(), IdleSince: d.int()}
		})}
	case KindSetPreferred:
		return SetPreferred{Lease: d.leaseID(), Identity: d.str()}
	case KindSetVersion:
		return SetVersion{Version: d.goInt()}
	case KindAskStepDown:
		return AskStepDown{Lease: d.leaseID(), Token: d.int(), Reason: d.str()}
	case KindTxn:
		var t Txn
		decodeTxn(d, &t)
		return t
	case KindCompact:
		return Compact{Revision: d.int()}
	case KindSetAlarm:
		return SetAlarm{Member: d.str(), Alarm: AlarmType(d.small()), Active: d.bool()}
	case KindAuthChange:
		c := AuthChange{Op: AuthOp(d.small()), User: d.str(), Role: d.str(), Password: d.str(), NoPassword: d.bool()}
		decodeAuthPerm(d, &c.Perm)
		return c
	}
	return nil
}

func decodeTxn(d *decoder, t *Txn) {
	if d.depth++; d.depth > maxTxnDepth {
		d.fail("Txns nested over %d deep", maxTxnDepth)
		return
	}
	t.Compares = decodeSlice(d, func(d *decoder, c *TxnCompare) {
		*c = TxnCompare{Key: d.str(), End: d.str(), Target: TxnTarget(d.small()), Op: CmpOp(d.small()), Number: d.int(), Value: d.str()}
	})
	t.Success = decodeSlice(d, decodeTxnOp)
	t.Failure = decodeSlice(d, decodeTxnOp)
	t.Actor = d.actor()
	d.depth--
}

func decodeTxnOp(d *decoder, op *TxnOp) {
	*op = TxnOp{
		Type: TxnOpType(d.small()), Key: d.str(), End: d.str(), Revision: d.int(), Value: d.str(),
		Lease: d.int(), IgnoreValue: d.bool(), IgnoreLease: d.bool(),
	}
	if d.bool() {
		op.Txn = &Txn{}
		decodeTxn(d, op.Txn)
	}
}
