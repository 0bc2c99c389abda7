package statemachine

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// The keys' own clock and their history (mvcc.go). Every test starts its
// machine at cluster version 5 unless it tests the switch to it.

var v5 = SetVersion{Version: 5}

func putOp(key, value string) TxnOp { return TxnOp{Type: OpPut, Key: key, Value: value} }

func leasedPut(key, value string, lease int64) TxnOp {
	return TxnOp{Type: OpPut, Key: key, Value: value, Lease: lease}
}

func deleteOp(key, end string) TxnOp { return TxnOp{Type: OpDelete, Key: key, End: end} }

func rangeOp(key, end string, rev int64) TxnOp {
	return TxnOp{Type: OpRange, Key: key, End: end, Revision: rev}
}

func writes(ops ...TxnOp) Txn { return Txn{Success: ops} }

// rangeAt is RangeKeys collected; it must succeed.
func rangeAt(t tb, m *Machine, key, end string, rev int64) []KeyValue {
	t.Helper()
	var out []KeyValue
	if err := m.RangeKeys(key, end, rev, func(kv KeyValue) bool {
		out = append(out, kv)
		return true
	}); err != nil {
		t.Fatalf("RangeKeys(%q, %q, %d): got = %v, expected: nil", key, end, rev, err)
	}
	return out
}

// keyEvent is what a watch shows of a key event: whether it is a put or a
// deletion (an expiry is a deletion to etcd), the key and the key before.
type keyEvent struct {
	Type   EventType
	KV     KeyValue
	PrevKV *KeyValue
}

func asKeyEvent(e Event) keyEvent {
	typ := EventKeyPut
	if e.Type != EventKeyPut {
		typ = EventKeyDeleted
	}
	return keyEvent{Type: typ, KV: *e.KV, PrevKV: e.PrevKV}
}

// appliedKeyEvents is the key events of results, in order.
func appliedKeyEvents(results ...Result) []keyEvent {
	var out []keyEvent
	for _, r := range results {
		for _, e := range r.Events {
			if e.Type.IsKey() {
				out = append(out, asKeyEvent(e))
			}
		}
	}
	return out
}

// keyEventsFrom is KeyEvents collected; it must succeed.
func keyEventsFrom(t tb, m *Machine, from int64) []keyEvent {
	t.Helper()
	var out []keyEvent
	if err := m.KeyEvents(from, func(e Event) bool {
		if !e.Type.IsKey() || e.Revision != 0 {
			t.Fatalf("KeyEvents(%d): got = %+v, expected: a key event with no global revision", from, e)
		}
		out = append(out, asKeyEvent(e))
		return true
	}); err != nil {
		t.Fatalf("KeyEvents(%d): got = %v, expected: nil", from, err)
	}
	return out
}

func TestTheKVRevisionMovesOncePerCommandThatChangesKeys(t *testing.T) {
	m := New()
	res := applyOK(t, m, 1, v5)
	expect(t, "KV revision of a fresh machine at version 5", m.KVRevision(), int64(1))
	expect(t, "Result.KVRevision", res.KVRevision, int64(1))
	expect(t, "compact revision of a fresh machine: none, as etcd's -1", m.CompactRevision(), int64(-1))

	steps := []struct {
		name string
		cmd  func() Command
		kv   int64 // the KV revision after it
	}{
		{"opening a session", func() Command { return open("a") }, 1}, // session 1
		{"opening another", func() Command { return open("b") }, 1},   // session 2
		{"an acquire", func() Command { return acquire(1, leaseA) }, 1},
		{"a release", func() Command { return release(leaseA, mustLease(t, m, leaseA).Holders[0].Token) }, 1},
		{"a put", func() Command { return Put{Key: "k0", Value: "v"} }, 2},
		{"a Txn of two puts and a delete", func() Command { return writes(putOp("x", "1"), putOp("y", "1"), deleteOp("k0", "")) }, 3},
		{"a Txn binding three keys to session 1", func() Command {
			return writes(leasedPut("s/1", "", 1), leasedPut("s/2", "", 1), leasedPut("s/3", "", 1))
		}, 4},
		{"closing session 1, which deletes its three keys", func() Command { return CloseSession{SessionID: 1} }, 5},
		{"a key bound to session 2", func() Command { return Put{Key: "t/2", SessionID: 2} }, 6},
		{"opening a third session", func() Command { return open("c") }, 6},
		{"a key bound to it", func() Command { return Put{Key: "t/3", SessionID: m.Revision()} }, 7},
		{"expiring both sessions with keys", func() Command { return ExpireSessions{Epoch: m.Epoch(), IDs: []int64{2, m.Revision() - 1}} }, 8},
		{"deleting an absent key", func() Command { return Delete{Key: "nothing"} }, 8},
		{"a Txn whose compares fail and that has no failure operations", func() Command {
			return Txn{Compares: []TxnCompare{{Key: "x", Target: TargetValue, Op: CmpEqual, Value: "other"}}, Success: []TxnOp{putOp("x", "2")}}
		}, 8},
		{"a Txn that only reads", func() Command { return writes(rangeOp("x", "", 0)) }, 8},
		{"a compaction", func() Command { return Compact{Revision: 7} }, 8},
	}
	for _, s := range steps {
		res := applyOK(t, m, 1, s.cmd())
		if m.KVRevision() != s.kv || res.KVRevision != s.kv {
			t.Fatalf("after %s: KV revision got = %d (Result %d), expected: %d", s.name, m.KVRevision(), res.KVRevision, s.kv)
		}
		for _, e := range res.Events {
			if e.Type.IsKey() && e.KV.ModRevision != s.kv {
				t.Errorf("after %s: key event %v of %q at KV revision %d, expected: %d", s.name, e.Type, e.KV.Key, e.KV.ModRevision, s.kv)
			}
		}
	}
	expect(t, "keys left", keys(m), []string{"x", "y"})
	expect(t, "x", rangeAt(t, m, "x", "", 0), []KeyValue{{Key: "x", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1}})
}

func TestTheEventsOfOneCommandShareItsKVRevisionInOrder(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v5)
	applyOK(t, m, 1, Put{Key: "b", Value: "old"})
	res := applyOK(t, m, 1, writes(putOp("c", "1"), putOp("a", "1"), deleteOp("b", ""), putOp("d", "1")))
	expected := []keyEvent{
		{Type: EventKeyPut, KV: KeyValue{Key: "c", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1}},
		{Type: EventKeyPut, KV: KeyValue{Key: "a", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1}},
		{Type: EventKeyDeleted, KV: KeyValue{Key: "b", ModRevision: 3}, PrevKV: &KeyValue{Key: "b", Value: "old", CreateRevision: 2, ModRevision: 2, Version: 1}},
		{Type: EventKeyPut, KV: KeyValue{Key: "d", Value: "1", CreateRevision: 3, ModRevision: 3, Version: 1}},
	}
	expect(t, "events of the Txn", appliedKeyEvents(res), expected)
	expect(t, "KeyEvents from its revision", keyEventsFrom(t, m, 3), expected)
	var subs []int64
	for _, v := range m.history.byRev {
		if v.Main == 3 {
			subs = append(subs, v.Sub)
		}
	}
	expect(t, "sub-revisions", subs, []int64{0, 1, 2, 3})
}

func TestSwitchingToVersion5KeepsTheKeysAndStartsTheirClockAbove(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: 4})
	applyOK(t, m, 1, open("a"))                               // 1
	applyOK(t, m, 1, Put{Key: "a", Value: "1"})               // 2
	applyOK(t, m, 1, Put{Key: "b", Value: "1"})               // 3
	applyOK(t, m, 1, Put{Key: "a", Value: "2"})               // 4
	applyOK(t, m, 1, Put{Key: "gone", Value: "1"})            // 5
	applyOK(t, m, 1, Delete{Key: "gone"})                     // 6
	applyOK(t, m, 1, Put{Key: "s", Value: "1", SessionID: 1}) // 7
	expect(t, "KV revision before version 5", m.KVRevision(), int64(0))
	before := rangeAt(t, m, "", "\x00", 0)

	applyOK(t, m, 1, v5)
	expect(t, "KV revision at the switch", m.KVRevision(), int64(8))
	expect(t, "compact revision at the switch: the last revision keys took", m.CompactRevision(), int64(7))
	expect(t, "keys at the switch", rangeAt(t, m, "", "\x00", 0), before)

	p := applyOK(t, m, 1, Put{Key: "a", Value: "3"})
	expect(t, "put after the switch", *p.KV, KeyValue{Key: "a", Value: "3", CreateRevision: 2, ModRevision: 9, Version: 3})
	expect(t, "its PrevKV", *p.PrevKV, before[0])
	d := applyOK(t, m, 1, writes(deleteOp("b", "")))
	expect(t, "a range at the switch revision sees the keys as they were", rangeAt(t, m, "", "\x00", 8), before)
	expect(t, "and so does one at the revision before, the last of the global clock", rangeAt(t, m, "", "\x00", 7), before)
	expect(t, "a range now", keys(m), []string{"a", "s"})
	expect(t, "KeyEvents from the switch revision", keyEventsFrom(t, m, 8), appliedKeyEvents(p, d))
	// The key written at 7 is kept, as a compaction at 7 keeps it: its
	// put is replayed, with no PrevKV, as etcd's watch from its compact
	// revision does.
	expect(t, "KeyEvents from the revision before", keyEventsFrom(t, m, 7),
		append([]keyEvent{{Type: EventKeyPut, KV: before[2]}}, appliedKeyEvents(p, d)...))

	for _, rev := range []int64{1, 6} {
		err := m.RangeKeys("", "\x00", rev, func(KeyValue) bool { return true })
		if !errors.Is(err, ErrCompacted) {
			t.Errorf("RangeKeys at %d, before the switch: got = %v, expected: %v", rev, err, ErrCompacted)
		}
	}
	if err := m.KeyEvents(6, func(Event) bool { return true }); !errors.Is(err, ErrCompacted) {
		t.Errorf("KeyEvents from before the switch: got = %v, expected: %v", err, ErrCompacted)
	}
	applyOK(t, m, 1, CloseSession{SessionID: 1})
	expect(t, "a key bound before the switch is deleted with its session", keys(m), []string{"a"})
	checkInvariants(t, m)
	checkHistory(t, m)
}

func TestRangeKeysInThePast(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v5)
	for _, c := range []Command{
		Put{Key: "a", Value: "1"},                   // 2
		Put{Key: "b", Value: "1"},                   // 3
		writes(putOp("a", "2"), putOp("c", "1")),    // 4
		Delete{Key: "b"},                            // 5
		writes(putOp("b", "2"), putOp("ab", "1")),   // 6
		writes(deleteOp("a", "b"), putOp("d", "1")), // 7: deletes a and ab
	} {
		applyOK(t, m, 1, c)
	}
	val := func(kvs []KeyValue) string {
		var parts []string
		for _, kv := range kvs {
			parts = append(parts, fmt.Sprintf("%s=%s@%d", kv.Key, kv.Value, kv.ModRevision))
		}
		return strings.Join(parts, " ")
	}
	cases := []struct {
		key, end string
		rev      int64
		expected string
	}{
		{"", "\x00", 1, ""},
		{"", "\x00", 2, "a=1@2"},
		{"", "\x00", 3, "a=1@2 b=1@3"},
		{"", "\x00", 4, "a=2@4 b=1@3 c=1@4"},
		{"", "\x00", 5, "a=2@4 c=1@4"},
		{"", "\x00", 6, "a=2@4 ab=1@6 b=2@6 c=1@4"},
		{"", "\x00", 7, "b=2@6 c=1@4 d=1@7"},
		{"", "\x00", 0, "b=2@6 c=1@4 d=1@7"},
		{"a", "", 6, "a=2@4"},
		{"a", "", 5, "a=2@4"},
		{"b", "", 5, ""},
		{"ab", "c", 6, "ab=1@6 b=2@6"},
		{"b", "\x00", 4, "b=1@3 c=1@4"},
		{"c", "a", 6, ""},
	}
	for _, c := range cases {
		if got := val(rangeAt(t, m, c.key, c.end, c.rev)); got != c.expected {
			t.Errorf("RangeKeys(%q, %q, %d): got = %q, expected: %q", c.key, c.end, c.rev, got, c.expected)
		}
	}
	var first []string
	_ = m.RangeKeys("", "\x00", 6, func(kv KeyValue) bool {
		first = append(first, kv.Key)
		return len(first) < 2
	})
	expect(t, "a range stopped by fn", first, []string{"a", "ab"})
	if err := m.RangeKeys("", "\x00", 8, func(KeyValue) bool { return true }); !errors.Is(err, ErrFutureRevision) {
		t.Errorf("RangeKeys at a future revision: got = %v, expected: %v", err, ErrFutureRevision)
	}
}

func TestCompact(t *testing.T) {
	// history: a=1@2, b=1@3, a=2@4 c=1@4, b deleted@5, a=3@6
	history := []Command{
		v5,
		Put{Key: "a", Value: "1"},
		Put{Key: "b", Value: "1"},
		writes(putOp("a", "2"), putOp("c", "1")),
		Delete{Key: "b"},
		Put{Key: "a", Value: "3"},
	}
	ranges := func(t *testing.T, m *Machine, rev int64) string {
		var parts []string
		for _, kv := range rangeAt(t, m, "", "\x00", rev) {
			parts = append(parts, kv.Key+"="+kv.Value)
		}
		return strings.Join(parts, " ")
	}
	runCases(t, []machineCase{
		{
			name:  "a range at the compact revision still answers, with each key's last version unless a deletion",
			setup: history,
			cmd:   Compact{Revision: 5},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "compact revision", m.CompactRevision(), int64(5))
				expect(t, "KV revision", res.KVRevision, int64(6))
				expectEvents(t, res)
				expect(t, "range at 5", ranges(t, m, 5), "a=2 c=1")
				expect(t, "range at 6", ranges(t, m, 6), "a=3 c=1")
				expect(t, "versions kept", m.HistorySize(), 3) // a@4, c@4, a@6
				for _, rev := range []int64{1, 4} {
					if err := m.RangeKeys("", "\x00", rev, func(KeyValue) bool { return true }); !errors.Is(err, ErrCompacted) {
						t.Errorf("range at %d: got = %v, expected: %v", rev, err, ErrCompacted)
					}
				}
				if err := m.RangeKeys("", "\x00", 7, func(KeyValue) bool { return true }); !errors.Is(err, ErrFutureRevision) {
					t.Errorf("range at 7: got = %v, expected: %v", err, ErrFutureRevision)
				}
				if err := m.KeyEvents(4, func(Event) bool { return true }); !errors.Is(err, ErrCompacted) {
					t.Errorf("KeyEvents from 4: got = %v, expected: %v", err, ErrCompacted)
				}
				expect(t, "KeyEvents from 6", keyEventsFrom(t, m, 6), []keyEvent{{
					Type:   EventKeyPut,
					KV:     KeyValue{Key: "a", Value: "3", CreateRevision: 2, ModRevision: 6, Version: 3},
					PrevKV: &KeyValue{Key: "a", Value: "2", CreateRevision: 2, ModRevision: 4, Version: 2},
				}})
				checkHistory(t, m)
			},
		},
		{
			name:  "compacting at the current revision keeps the keys as they are",
			setup: history,
			cmd:   Compact{Revision: 6},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "range at 6", ranges(t, m, 6), "a=3 c=1")
				expect(t, "versions kept", m.HistorySize(), 2)
				expect(t, "KeyEvents from 7", keyEventsFrom(t, m, 7), []keyEvent(nil))
				res = applyOK(t, m, 1, Put{Key: "c", Value: "2"})
				expect(t, "the next events replay with their PrevKV", keyEventsFrom(t, m, 7), appliedKeyEvents(res))
			},
		},
		{
			name:  "compacting again at the same revision is refused",
			setup: append(history[:len(history):len(history)], Compact{Revision: 4}),
			cmd:   Compact{Revision: 4},
			err:   ErrCompacted,
		},
		{
			name:  "compacting backwards is refused",
			setup: append(history[:len(history):len(history)], Compact{Revision: 4}),
			cmd:   Compact{Revision: 3},
			err:   ErrCompacted,
		},
		{
			name:  "compacting at a future revision is refused",
			setup: history,
			cmd:   Compact{Revision: 7},
			err:   ErrFutureRevision,
		},
		{
			name:  "compacting below the revision of the switch to version 5 is refused",
			setup: []Command{Put{Key: "a"}, Put{Key: "a"}, v5, Put{Key: "a"}},
			cmd:   Compact{Revision: 2},
			err:   ErrCompacted,
		},
		{
			name:  "on a fresh store, compacting at revision 1 succeeds once, as in etcd",
			setup: []Command{v5},
			cmd:   Compact{Revision: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "compact revision", m.CompactRevision(), int64(1))
				expect(t, "again", m.Apply(1, Compact{Revision: 1}).Err != nil, true)
			},
		},
		{
			name: "compaction needs cluster version 5",
			cmd:  Compact{Revision: 1},
			err:  ErrNotSupported,
		},
	})
}

// checkHistory checks what must hold of the keys' history: both indexes
// hold the same versions, in revision order, between the compact and the
// KV revision; each key's last version is the key as it is (or its
// deletion); at most one version of a key, not a deletion, is as old as
// the compact revision.
func checkHistory(t tb, m *Machine) {
	t.Helper()
	if !m.usesKVRevision() {
		if m.HistorySize() != 0 || m.history.byKey.Len() != 0 || m.KVRevision() != 0 {
			t.Fatalf("history before version 5: got = %d versions, KV revision %d, expected: none", m.HistorySize(), m.KVRevision())
		}
		return
	}
	if m.CompactRevision() > m.KVRevision() || m.CompactRevision() < -1 {
		t.Fatalf("compact revision %d, KV revision %d", m.CompactRevision(), m.KVRevision())
	}
	h := m.history.byRev
	if len(h) != m.history.byKey.Len() {
		t.Fatalf("history: %d versions in revision order, %d by key", len(h), m.history.byKey.Len())
	}
	last := map[string]*version{}
	old := map[string]int{}
	for i, v := range h {
		if i > 0 && !revLess(h[i-1], v) {
			t.Fatalf("history out of order: %+v before %+v", h[i-1], v)
		}
		if got, ok := m.history.byKey.Get(v); !ok || got != v {
			t.Fatalf("version %+v is not indexed by key", v)
		}
		if v.Main > m.KVRevision() {
			t.Fatalf("version %+v above the KV revision %d", v, m.KVRevision())
		}
		if v.KV != nil && (v.KV.Key != v.Key || v.KV.ModRevision != v.Main) {
			t.Fatalf("version %+v holds %+v", v, v.KV)
		}
		if v.Main <= m.CompactRevision() {
			old[v.Key]++
			if old[v.Key] > 1 || v.KV == nil {
				t.Fatalf("version %+v of %q kept at or below the compact revision %d", v, v.Key, m.CompactRevision())
			}
		}
		last[v.Key] = v
	}
	for k, v := range last {
		kv, ok := m.Key(k)
		if (v.KV != nil) != ok || ok && kv != *v.KV {
			t.Fatalf("key %q: got = %+v (present %v), expected: its last version %+v", k, kv, ok, v.KV)
		}
	}
	for _, kv := range rangeAt(t, m, "", "\x00", 0) {
		if _, ok := last[kv.Key]; !ok {
			t.Fatalf("key %q has no version in the history", kv.Key)
		}
	}
}

// BenchmarkHistoryMemory measures what the history costs per version kept:
// b.N puts of a 16-byte key (among 1,000) and a value of 0, 128 or 1,024
// bytes, whose strings are fresh as a decoded command's are, and the heap
// they leave behind, divided by b.N. Run it with a fixed N:
//
//	go test -run '^$' -bench HistoryMemory -benchtime 200000x ./statemachine
func BenchmarkHistoryMemory(b *testing.B) {
	for _, size := range []int{0, 128, 1024} {
		b.Run(fmt.Sprintf("value=%d", size), func(b *testing.B) { historyMemory(b, size) })
	}
}

func historyMemory(b *testing.B, size int) {
	const keys = 1000
	value := strings.Repeat("v", size)
	m := New()
	m.Apply(1, v5)
	// The keys are there before the measure: what is left is history.
	for i := range keys {
		m.Apply(1, Put{Key: fmt.Sprintf("key/%012d", i), Value: strings.Clone(value)})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range b.N {
		m.Apply(1, Put{Key: fmt.Sprintf("key/%012d", i%keys), Value: strings.Clone(value)})
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "bytes/version")
	if m.HistorySize() != keys+b.N {
		b.Fatalf("history: got = %d versions, expected: %d", m.HistorySize(), keys+b.N)
	}
	runtime.KeepAlive(m)
}
