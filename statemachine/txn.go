package statemachine

import (
	"fmt"
	"strings"
)

// Txn is etcd's transaction, and the one way the etcd API writes keys (a
// Put or a DeleteRange is a Txn of one operation): if every compare
// holds, the Success operations run, otherwise the Failure ones, in
// order. Its writes take one KV revision, each its own sub-revision.
//
// The branch of every nested Txn is chosen before anything is written,
// from the state before the Txn, as etcd does; then every chosen
// operation is checked, then they run. A Txn that fails changes nothing.
// The API refuses what etcd refuses before it reaches the log: empty
// keys, a key written twice (etcd's rule against duplicate keys), puts
// that give a value or lease and ask to ignore it.
type Txn struct {
	Compares []TxnCompare `json:"compares,omitempty"`
	Success  []TxnOp      `json:"success,omitempty"`
	Failure  []TxnOp      `json:"failure,omitempty"`
	// Actor is who proposed it, checked against the identity of every
	// session a put attaches a key to (nil: not checked).
	Actor *Actor `json:"actor,omitempty"`
}

// TxnTarget is what a compare reads from each key.
type TxnTarget uint8

const (
	TargetVersion TxnTarget = 1
	TargetCreate  TxnTarget = 2
	TargetMod     TxnTarget = 3
	TargetValue   TxnTarget = 4
	TargetLease   TxnTarget = 5
)

// CmpOp is how a compare compares.
type CmpOp uint8

const (
	CmpEqual    CmpOp = 1
	CmpGreater  CmpOp = 2
	CmpLess     CmpOp = 3
	CmpNotEqual CmpOp = 4
)

// TxnCompare holds when every key in [Key, End) (Key alone when End is
// "") compares to the operand as Op says. An absent key has version,
// create and mod revision and lease 0, and fails every value compare.
type TxnCompare struct {
	Key    string    `json:"key"`
	End    string    `json:"end,omitempty"`
	Target TxnTarget `json:"target"`
	Op     CmpOp     `json:"op"`
	Number int64     `json:"number,omitempty"` // version, revision or lease
	Value  string    `json:"value,omitempty"`
}

// TxnOpType says what an operation of a Txn does.
type TxnOpType uint8

const (
	OpRange  TxnOpType = 1
	OpPut    TxnOpType = 2
	OpDelete TxnOpType = 3
	OpTxn    TxnOpType = 4
)

// TxnOp is one operation of a Txn. Range and Delete name [Key, End) as
// RangeKeys does; Put writes Key.
type TxnOp struct {
	Type TxnOpType `json:"type"`
	Key  string    `json:"key,omitempty"`
	End  string    `json:"end,omitempty"`
	// Revision is the KV revision a Range reads at (0: the current one,
	// which sees the Txn's earlier writes).
	Revision int64  `json:"revision,omitempty"`
	Value    string `json:"value,omitempty"`
	// Lease is the etcd lease ID (a session's EtcdLeaseID) a Put attaches
	// the key to; 0 attaches it to none.
	Lease       int64 `json:"lease,omitempty"`
	IgnoreValue bool  `json:"ignore_value,omitempty"`
	IgnoreLease bool  `json:"ignore_lease,omitempty"`
	Txn         *Txn  `json:"txn,omitempty"`
}

// TxnResponse is what a Txn did: which branch ran, and each operation's
// result, in order.
type TxnResponse struct {
	Succeeded bool
	Ops       []TxnOpResult
}

// TxnOpResult is one operation's result. The API decides what of it the
// caller sees (prev_kv, keys_only, limits and sorting of a range).
type TxnOpResult struct {
	KVs     []KeyValue // Range: every key in range, in key order
	PrevKV  *KeyValue  // Put: the key before, if it existed
	PrevKVs []KeyValue // Delete: the keys deleted
	Txn     *TxnResponse
}

// Writes reports whether any branch of t, nested ones included, writes:
// a Txn that does not is a read and never needs the log.
func (t *Txn) Writes() bool {
	for _, ops := range [][]TxnOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.Type == OpPut || op.Type == OpDelete || op.Type == OpTxn && op.Txn != nil && op.Txn.Writes() {
				return true
			}
		}
	}
	return false
}

func (m *Machine) txn(c Txn) Result {
	if !m.usesKVRevision() {
		return Result{Err: fmt.Errorf("%w: Txn needs cluster version 5", ErrNotSupported)}
	}
	path := m.txnPath(&c, nil)
	if err := m.checkTxn(&c, path, c.Actor); err != nil {
		return Result{Err: err}
	}
	resp, _ := m.runTxn(&c, &path)
	return Result{Txn: resp}
}

// ReadTxn runs a Txn that does not write (Writes is false) outside the
// log, as etcd serves read-only transactions.
func (m *Machine) ReadTxn(c Txn) (*TxnResponse, error) {
	if c.Writes() {
		return nil, fmt.Errorf("statemachine: ReadTxn of a Txn that writes")
	}
	path := m.txnPath(&c, nil)
	if err := m.checkTxn(&c, path, nil); err != nil {
		return nil, err
	}
	resp, _ := m.runTxn(&c, &path)
	return resp, nil
}

// txnPath evaluates the compares of t and of every nested Txn on the
// chosen branches, depth first, before anything is written.
func (m *Machine) txnPath(t *Txn, path []bool) []bool {
	ok := m.comparesHold(t.Compares)
	path = append(path, ok)
	for _, op := range t.branch(ok) {
		if op.Type == OpTxn && op.Txn != nil {
			path = m.txnPath(op.Txn, path)
		}
	}
	return path
}

func (t *Txn) branch(ok bool) []TxnOp {
	if ok {
		return t.Success
	}
	return t.Failure
}

func (m *Machine) comparesHold(cs []TxnCompare) bool {
	for _, c := range cs {
		if !m.compareHolds(c) {
			return false
		}
	}
	return true
}

func (m *Machine) compareHolds(c TxnCompare) bool {
	var kvs []KeyValue
	// A range whose end is not above its key holds no key, and compares
	// as an absent key does, as etcd's applyCompare does.
	_ = m.RangeKeys(c.Key, c.End, 0, func(kv KeyValue) bool {
		kvs = append(kvs, kv)
		return true
	})
	if len(kvs) == 0 {
		if c.Target == TargetValue {
			return false // an absent value equals nothing, as in etcd
		}
		return compareKey(c, KeyValue{})
	}
	for _, kv := range kvs {
		if !compareKey(c, kv) {
			return false
		}
	}
	return true
}

func compareKey(c TxnCompare, kv KeyValue) bool {
	var r int
	switch c.Target {
	case TargetValue:
		r = strings.Compare(kv.Value, c.Value)
	default:
		var n int64
		switch c.Target {
		case TargetVersion:
			n = kv.Version
		case TargetCreate:
			n = kv.CreateRevision
		case TargetMod:
			n = kv.ModRevision
		case TargetLease:
			n = kv.EtcdLease()
		}
		switch {
		case n < c.Number:
			r = -1
		case n > c.Number:
			r = 1
		}
	}
	switch c.Op {
	case CmpEqual:
		return r == 0
	case CmpGreater:
		return r > 0
	case CmpLess:
		return r < 0
	case CmpNotEqual:
		return r != 0
	}
	return false
}

// checkTxn checks every operation on the chosen path against the state
// before the Txn: leases exist and may be used by actor, keys a put
// ignores the value or lease of exist, ranges' revisions can be read.
func (m *Machine) checkTxn(t *Txn, path []bool, actor *Actor) error {
	// In etcd's order: every put on the path first, then every range.
	for _, ranges := range []bool{false, true} {
		if _, err := m.checkOps(t, path, actor, ranges); err != nil {
			return err
		}
	}
	return nil
}

// checkOps checks the puts of t's chosen path, or its ranges, nested
// Txns included, and returns what is left of the path.
func (m *Machine) checkOps(t *Txn, path []bool, actor *Actor, ranges bool) ([]bool, error) {
	ok := path[0]
	path = path[1:]
	for _, op := range t.branch(ok) {
		switch op.Type {
		case OpRange:
			if !ranges {
				continue
			}
			if err := m.checkRevision(op.Revision); err != nil {
				return nil, err
			}
		case OpPut:
			if ranges {
				continue
			}
			if op.IgnoreValue || op.IgnoreLease {
				if _, found := m.keys.Get(&KeyValue{Key: op.Key}); !found {
					return nil, fmt.Errorf("%w: %q", ErrKeyNotFound, op.Key)
				}
			}
			if op.Lease != 0 {
				s, found := m.sessionByLease(op.Lease)
				if !found {
					return nil, fmt.Errorf("%w: lease %d", ErrSessionNotFound, op.Lease)
				}
				if err := m.actAs(actor, s, "bind a key to", false); err != nil {
					return nil, err
				}
			}
		case OpDelete:
		case OpTxn:
			if op.Txn == nil {
				return nil, fmt.Errorf("%w: a nested Txn operation without its Txn", ErrUnknownCommand)
			}
			var err error
			if path, err = m.checkOps(op.Txn, path, actor, ranges); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%w: Txn operation type %d", ErrUnknownCommand, op.Type)
		}
	}
	return path, nil
}

// runTxn runs the operations on the chosen path; checkTxn passed, so
// none fails.
func (m *Machine) runTxn(t *Txn, path *[]bool) (*TxnResponse, error) {
	ok := (*path)[0]
	*path = (*path)[1:]
	resp := &TxnResponse{Succeeded: ok}
	for _, op := range t.branch(ok) {
		var r TxnOpResult
		switch op.Type {
		case OpRange:
			_ = m.RangeKeys(op.Key, op.End, op.Revision, func(kv KeyValue) bool {
				r.KVs = append(r.KVs, kv)
				return true
			})
		case OpPut:
			r.PrevKV = m.txnPut(op)
		case OpDelete:
			r.PrevKVs = m.deleteRange(op.Key, op.End)
		case OpTxn:
			r.Txn, _ = m.runTxn(op.Txn, path)
		}
		resp.Ops = append(resp.Ops, r)
	}
	return resp, nil
}

func (m *Machine) txnPut(op TxnOp) *KeyValue {
	value, sessionID := op.Value, int64(0)
	if op.Lease != 0 {
		s, _ := m.sessionByLease(op.Lease)
		sessionID = s.ID
	}
	if cur, ok := m.keys.Get(&KeyValue{Key: op.Key}); ok {
		if op.IgnoreValue {
			value = cur.Value
		}
		if op.IgnoreLease {
			sessionID = cur.SessionID
		}
	}
	_, prev := m.putKey(op.Key, value, 0, sessionID)
	return prev
}

// deleteRange deletes the keys in [key, end) and returns them.
func (m *Machine) deleteRange(key, end string) []KeyValue {
	var doomed []*KeyValue
	if end == "" {
		end = key + "\x00"
	}
	m.keys.AscendGreaterOrEqual(&KeyValue{Key: key}, func(kv *KeyValue) bool {
		if end != "\x00" && kv.Key >= end {
			return false
		}
		doomed = append(doomed, kv)
		return true
	})
	out := make([]KeyValue, 0, len(doomed))
	for _, kv := range doomed {
		out = append(out, *kv)
		m.deleteKey(kv, EventKeyDeleted)
	}
	return out
}
