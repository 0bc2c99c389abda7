package statemachine

import (
	"errors"
	"testing"
)

// Txn with etcd's semantics (txn.go), checked against what etcd's
// applier does (etcdserver/apply.go: applyCompare, compareKV, applyTxn).

func cmpNum(key string, target TxnTarget, op CmpOp, n int64) TxnCompare {
	return TxnCompare{Key: key, Target: target, Op: op, Number: n}
}

func cmpValue(key string, op CmpOp, value string) TxnCompare {
	return TxnCompare{Key: key, Target: TargetValue, Op: op, Value: value}
}

// txnSucceeds applies a Txn of compares whose success branch writes
// "won" and reports which branch ran.
func txnSucceeds(t *testing.T, m *Machine, cs ...TxnCompare) bool {
	t.Helper()
	res := applyOK(t, m, 1, Txn{Compares: cs, Success: []TxnOp{putOp("won", "")}})
	return res.Txn.Succeeded
}

func TestTxnCompares(t *testing.T) {
	m := New()
	for _, c := range []Command{
		v5,
		open("a"),                        // session 1
		Put{Key: "k", Value: "b"},        // KV 2
		writes(leasedPut("r/1", "x", 1)), // KV 3
		writes(putOp("r/2", "x"), putOp("k", "b")), // KV 4: k version 2
	} {
		applyOK(t, m, 1, c)
	}
	cases := []struct {
		name     string
		compares []TxnCompare
		expected bool
	}{
		{"a value compare on an absent key fails with =", []TxnCompare{cmpValue("absent", CmpEqual, "")}, false},
		{"a value compare on an absent key fails with !=", []TxnCompare{cmpValue("absent", CmpNotEqual, "x")}, false},
		{"a value compare on an absent key fails with <", []TxnCompare{cmpValue("absent", CmpLess, "x")}, false},
		{"an absent key has version 0", []TxnCompare{cmpNum("absent", TargetVersion, CmpEqual, 0)}, true},
		{"an absent key has create revision 0", []TxnCompare{cmpNum("absent", TargetCreate, CmpLess, 1)}, true},
		{"an absent key has mod revision 0", []TxnCompare{cmpNum("absent", TargetMod, CmpGreater, 0)}, false},
		{"an absent key has lease 0", []TxnCompare{cmpNum("absent", TargetLease, CmpEqual, 0)}, true},
		{"value =", []TxnCompare{cmpValue("k", CmpEqual, "b")}, true},
		{"value > compares bytes", []TxnCompare{cmpValue("k", CmpGreater, "a")}, true},
		{"value <", []TxnCompare{cmpValue("k", CmpLess, "a")}, false},
		{"value != of an equal value", []TxnCompare{cmpValue("k", CmpNotEqual, "b")}, false},
		{"version", []TxnCompare{cmpNum("k", TargetVersion, CmpEqual, 2)}, true},
		{"create revision", []TxnCompare{cmpNum("k", TargetCreate, CmpEqual, 2)}, true},
		{"mod revision", []TxnCompare{cmpNum("k", TargetMod, CmpEqual, 4)}, true},
		{"mod revision !=", []TxnCompare{cmpNum("k", TargetMod, CmpNotEqual, 4)}, false},
		{"lease of a key bound to session 1", []TxnCompare{cmpNum("r/1", TargetLease, CmpEqual, 1)}, true},
		{"every compare must hold", []TxnCompare{cmpValue("k", CmpEqual, "b"), cmpNum("k", TargetVersion, CmpEqual, 1)}, false},
		{"a range compare holds when every key in range does", []TxnCompare{{Key: "r/", End: "r0", Target: TargetValue, Op: CmpEqual, Value: "x"}}, true},
		{"a range compare fails when one key does not", []TxnCompare{{Key: "r/", End: "r0", Target: TargetMod, Op: CmpEqual, Number: 4}}, false},
		{"a range compare to the end of the keyspace", []TxnCompare{{Key: "r/", End: "\x00", Target: TargetCreate, Op: CmpGreater, Number: 2}}, true},
		{"a range compare over no key compares with 0", []TxnCompare{{Key: "s/", End: "s0", Target: TargetVersion, Op: CmpEqual, Number: 0}}, true},
		{"a range compare over no key fails a value compare", []TxnCompare{{Key: "s/", End: "s0", Target: TargetValue, Op: CmpNotEqual, Value: "x"}}, false},
		{"a compare whose end is below its key ranges over no key, as in etcd", []TxnCompare{{Key: "r/2", End: "r/1", Target: TargetVersion, Op: CmpEqual, Number: 0}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := txnSucceeds(t, m, c.compares...); got != c.expected {
				t.Errorf("succeeded: got = %v, expected: %v", got, c.expected)
			}
			applyOK(t, m, 1, Delete{Key: "won"})
		})
	}
}

func TestTxn(t *testing.T) {
	base := []Command{v5, open("a"), Put{Key: "k", Value: "1"}, Put{Key: "other", Value: "1"}} // session 1, KV 2, 3
	runCases(t, []machineCase{
		{
			name:  "the failure branch runs when a compare fails, and its writes take one KV revision",
			setup: base,
			cmd: Txn{
				Compares: []TxnCompare{cmpValue("k", CmpEqual, "2")},
				Success:  []TxnOp{putOp("s", "")},
				Failure:  []TxnOp{putOp("f1", ""), rangeOp("k", "", 0), putOp("f2", "")},
			},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "succeeded", res.Txn.Succeeded, false)
				expect(t, "results", len(res.Txn.Ops), 3)
				expect(t, "range", res.Txn.Ops[1].KVs, []KeyValue{{Key: "k", Value: "1", CreateRevision: 2, ModRevision: 2, Version: 1}})
				expect(t, "keys", keys(m), []string{"f1", "f2", "k", "other"})
				expect(t, "KV revision", res.KVRevision, int64(4))
			},
		},
		{
			name:  "a nested Txn's branch is chosen from the state before the Txn",
			setup: base,
			cmd: writes(
				putOp("k", "2"),
				TxnOp{Type: OpTxn, Txn: &Txn{
					Compares: []TxnCompare{cmpValue("k", CmpEqual, "1")},
					Success:  []TxnOp{putOp("saw-before", "")},
					Failure:  []TxnOp{putOp("saw-after", "")},
				}},
			),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "keys", keys(m), []string{"k", "other", "saw-before"})
				expect(t, "nested succeeded", res.Txn.Ops[1].Txn.Succeeded, true)
				expect(t, "nested result", res.Txn.Ops[1].Txn.Ops[0].PrevKV, (*KeyValue)(nil))
			},
		},
		{
			name:  "a range inside a Txn sees the Txn's earlier writes, and a range at the revision before does not",
			setup: base,
			cmd:   writes(putOp("k", "2"), deleteOp("other", ""), rangeOp("", "\x00", 0), rangeOp("", "\x00", 3)),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "range now", res.Txn.Ops[2].KVs, []KeyValue{{Key: "k", Value: "2", CreateRevision: 2, ModRevision: 4, Version: 2}})
				expect(t, "range at 3", res.Txn.Ops[3].KVs, []KeyValue{
					{Key: "k", Value: "1", CreateRevision: 2, ModRevision: 2, Version: 1},
					{Key: "other", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1},
				})
				expect(t, "put PrevKV", *res.Txn.Ops[0].PrevKV, KeyValue{Key: "k", Value: "1", CreateRevision: 2, ModRevision: 2, Version: 1})
				expect(t, "deleted", res.Txn.Ops[1].PrevKVs, []KeyValue{{Key: "other", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1}})
			},
		},
		{
			name:  "a range in a Txn at a future revision is refused and nothing is written",
			setup: base,
			cmd:   writes(putOp("k", "2"), rangeOp("", "\x00", 4)),
			err:   ErrFutureRevision,
		},
		{
			name:  "a range in a Txn at a compacted revision is refused and nothing is written",
			setup: append(base[:len(base):len(base)], Compact{Revision: 3}),
			cmd:   writes(putOp("k", "2"), rangeOp("", "\x00", 2)),
			err:   ErrCompacted,
		},
		{
			name:  "ignore_value on an absent key is refused and nothing is written",
			setup: base,
			cmd:   writes(putOp("a", "x"), TxnOp{Type: OpPut, Key: "absent", IgnoreValue: true}),
			err:   ErrKeyNotFound,
		},
		{
			name:  "ignore_lease on an absent key is refused and nothing is written",
			setup: base,
			cmd:   writes(putOp("a", "x"), TxnOp{Type: OpPut, Key: "absent", Value: "v", IgnoreLease: true}),
			err:   ErrKeyNotFound,
		},
		{
			name:  "ignore_value keeps the value and takes the lease given",
			setup: base,
			cmd:   writes(TxnOp{Type: OpPut, Key: "k", Lease: 1, IgnoreValue: true}),
			check: func(t *testing.T, m *Machine, res Result) {
				kv, _ := m.Key("k")
				expect(t, "k", kv, KeyValue{Key: "k", Value: "1", CreateRevision: 2, ModRevision: 4, Version: 2, SessionID: 1})
				expect(t, "session keys", m.SessionKeys(1), []string{"k"})
			},
		},
		{
			name:  "ignore_lease keeps the lease and takes the value given",
			setup: append(base[:len(base):len(base)], writes(leasedPut("k", "1", 1))),
			cmd:   writes(TxnOp{Type: OpPut, Key: "k", Value: "2", IgnoreLease: true}),
			check: func(t *testing.T, m *Machine, res Result) {
				kv, _ := m.Key("k")
				expect(t, "k", kv, KeyValue{Key: "k", Value: "2", CreateRevision: 2, ModRevision: 5, Version: 3, SessionID: 1})
				expect(t, "session keys", m.SessionKeys(1), []string{"k"})
			},
		},
		{
			name:  "a put without a lease unbinds the key from its session",
			setup: append(base[:len(base):len(base)], writes(leasedPut("k", "1", 1))),
			cmd:   writes(putOp("k", "2")),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "session keys", m.SessionKeys(1), []string(nil))
				applyOK(t, m, 1, CloseSession{SessionID: 1})
				expect(t, "keys", keys(m), []string{"k", "other"})
			},
		},
		{
			name:  "a put with an unknown lease is refused and nothing is written",
			setup: base,
			cmd:   writes(putOp("a", "x"), leasedPut("b", "x", 99)),
			err:   ErrSessionNotFound,
		},
		{
			name:  "a put with the lease of an ended session is refused",
			setup: append(base[:len(base):len(base)], CloseSession{SessionID: 1}),
			cmd:   writes(leasedPut("b", "x", 1)),
			err:   ErrSessionNotFound,
		},
		{
			name:  "a put on the branch not chosen is not checked",
			setup: base,
			cmd:   Txn{Compares: []TxnCompare{cmpValue("k", CmpEqual, "1")}, Success: []TxnOp{putOp("a", "")}, Failure: []TxnOp{leasedPut("b", "x", 99)}},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "keys", keys(m), []string{"a", "k", "other"})
			},
		},
		{
			name:  "binding a key to another identity's session is refused",
			setup: base,
			cmd: Txn{
				Success: []TxnOp{putOp("free", ""), leasedPut("b", "x", 1)},
				Actor:   &Actor{Principal: "bob", Identities: []string{"b"}},
			},
			err: ErrNotOwner,
		},
		{
			name:  "binding a key to one's own session is allowed",
			setup: base,
			cmd:   Txn{Success: []TxnOp{leasedPut("b", "x", 1)}, Actor: &Actor{Principal: "alice", Identities: []string{"a"}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "session keys", m.SessionKeys(1), []string{"b"})
			},
		},
		{
			name:  "a nested Txn operation without its Txn is refused",
			setup: base,
			cmd:   writes(putOp("a", ""), TxnOp{Type: OpTxn}),
			err:   ErrUnknownCommand,
		},
		{
			name:  "a delete of a range removes the keys in it and returns them",
			setup: append(base[:len(base):len(base)], Put{Key: "l"}),
			cmd:   writes(deleteOp("k", "m")),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "deleted", len(res.Txn.Ops[0].PrevKVs), 2)
				expect(t, "keys", keys(m), []string{"other"})
				expectEvents(t, res, EventKeyDeleted, EventKeyDeleted)
			},
		},
		{
			name: "a Txn needs cluster version 5",
			cmd:  writes(putOp("a", "")),
			err:  ErrNotSupported,
		},
	})
}

func TestWritesAndReadTxn(t *testing.T) {
	nested := func(ops ...TxnOp) TxnOp { return TxnOp{Type: OpTxn, Txn: &Txn{Failure: ops}} }
	cases := []struct {
		name     string
		txn      Txn
		expected bool
	}{
		{"no operation", Txn{}, false},
		{"ranges", Txn{Success: []TxnOp{rangeOp("a", "", 0)}, Failure: []TxnOp{rangeOp("b", "", 0)}}, false},
		{"a put on the failure branch", Txn{Success: []TxnOp{rangeOp("a", "", 0)}, Failure: []TxnOp{putOp("b", "")}}, true},
		{"a delete", writes(deleteOp("a", "")), true},
		{"a nested Txn that reads", writes(nested(rangeOp("a", "", 0))), false},
		{"a nested Txn that writes", writes(rangeOp("a", "", 0), nested(deleteOp("a", ""))), true},
		{"a nested operation without its Txn", writes(TxnOp{Type: OpTxn}), false},
	}
	for _, c := range cases {
		if got := c.txn.Writes(); got != c.expected {
			t.Errorf("Writes of %s: got = %v, expected: %v", c.name, got, c.expected)
		}
	}

	m := New()
	applyOK(t, m, 1, v5)
	applyOK(t, m, 1, Put{Key: "a", Value: "1"})
	applyOK(t, m, 1, Put{Key: "a", Value: "2"})
	before := snapshotBytes(t, m)
	resp, err := m.ReadTxn(Txn{
		Compares: []TxnCompare{cmpNum("a", TargetVersion, CmpEqual, 2)},
		Success:  []TxnOp{rangeOp("a", "", 0), rangeOp("a", "", 2)},
	})
	if err != nil {
		t.Fatalf("ReadTxn: got = %v, expected: nil", err)
	}
	expect(t, "succeeded", resp.Succeeded, true)
	expect(t, "range now", resp.Ops[0].KVs[0].Value, "2")
	expect(t, "range at 2", resp.Ops[1].KVs[0].Value, "1")
	if _, err := m.ReadTxn(writes(putOp("a", "3"))); err == nil {
		t.Errorf("ReadTxn of a Txn that writes: got = nil, expected: an error")
	}
	if _, err := m.ReadTxn(writes(rangeOp("a", "", 9))); !errors.Is(err, ErrFutureRevision) {
		t.Errorf("ReadTxn at a future revision: got = %v, expected: %v", err, ErrFutureRevision)
	}
	expect(t, "state after the reads", string(snapshotBytes(t, m)), string(before))
}

// What etcd answers first when a Txn fails more than one check: every
// put on the chosen path is checked before any range, and a put's key
// (for ignore_value) before its lease.
func TestTxnChecksInEtcdsOrder(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v5)
	farRange := TxnOp{Type: OpRange, Key: "a", Revision: 100}
	unknownLease := TxnOp{Type: OpPut, Key: "a", Lease: 999}
	res := m.Apply(2, Txn{Success: []TxnOp{farRange, unknownLease}})
	if !errors.Is(res.Err, ErrSessionNotFound) {
		t.Errorf("a future range, then a put on an unknown lease: got = %v, expected: %v", res.Err, ErrSessionNotFound)
	}
	ignoring := TxnOp{Type: OpPut, Key: "absent", Lease: 999, IgnoreValue: true}
	res = m.Apply(3, Txn{Success: []TxnOp{{Type: OpTxn, Txn: &Txn{Success: []TxnOp{ignoring}}}}})
	if !errors.Is(res.Err, ErrKeyNotFound) {
		t.Errorf("a nested put ignoring the value of an absent key on an unknown lease: got = %v, expected: %v", res.Err, ErrKeyNotFound)
	}
	expect(t, "KV revision after refusals", m.KVRevision(), int64(1))
}

// A watch's prev_kv is the key as it was before the event's revision,
// even when the same Txn wrote the key first: etcd reads it at the
// revision before.
func TestEventPrevIsTheKeyBeforeTheCommand(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v5)
	applyOK(t, m, 2, Txn{Success: []TxnOp{{Type: OpPut, Key: "a", Value: "old"}}})
	res := applyOK(t, m, 3, Txn{Success: []TxnOp{{Type: OpPut, Key: "a", Value: "new"}, {Type: OpDelete, Key: "a", End: "\x00"}}})
	if len(res.Events) != 2 {
		t.Fatalf("events: got = %+v, expected: a put and a delete", res.Events)
	}
	for _, e := range res.Events {
		if e.PrevKV == nil || e.PrevKV.Value != "old" {
			t.Errorf("%v event's prev: got = %+v, expected: the key before the Txn (old)", e.Type, e.PrevKV)
		}
	}
	var replayed []Event
	if err := m.KeyEvents(3, func(e Event) bool { replayed = append(replayed, e); return true }); err != nil {
		t.Fatal(err)
	}
	for _, e := range replayed {
		if e.PrevKV == nil || e.PrevKV.Value != "old" {
			t.Errorf("replayed %v event's prev: got = %+v, expected: old", e.Type, e.PrevKV)
		}
	}
	// A key the Txn creates had no previous version.
	res = applyOK(t, m, 4, Txn{Success: []TxnOp{{Type: OpPut, Key: "b", Value: "1"}, {Type: OpDelete, Key: "b", End: "\x00"}}})
	for _, e := range res.Events {
		if e.PrevKV != nil {
			t.Errorf("%v event of a key the Txn created: prev got = %+v, expected: none", e.Type, e.PrevKV)
		}
	}
}

// Compact 0 on a store never compacted succeeds, as etcd's does (its
// compact revision starts at -1); a second one is refused.
func TestCompactZeroOnAFreshStore(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v5)
	applyOK(t, m, 2, Compact{Revision: 0})
	if res := m.Apply(3, Compact{Revision: 0}); !errors.Is(res.Err, ErrCompacted) {
		t.Errorf("a second Compact 0: got = %v, expected: %v", res.Err, ErrCompacted)
	}
}
