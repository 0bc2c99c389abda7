package statemachine

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// busyMachine has sessions with labels, holders, waiters, a semaphore,
// keys with and without TTL and session, a lock-delay and a new epoch.
func busyMachine(t *testing.T) *Machine {
	m := New()
	for _, c := range []Command{
		OpenSession{Identity: "a", TTL: ttl, Labels: map[string]string{"zone": "z"}}, // 1
		open("b"), open("c"), open("d"), // 2, 3, 4
		Acquire{SessionID: 1, Lease: leaseA, Capacity: 1, Value: "addr", Labels: map[string]string{"app": "x"}}, // 5
		wait(2, leaseA),                                                                               // 6
		semaphore(2, leaseB, 2, false), semaphore(3, leaseB, 2, false), semaphore(1, leaseB, 2, true), // 7, 8, 9
		Put{Key: "k", Value: "v", TTL: keyTTL}, Put{Key: "s", Value: "v", SessionID: 3}, Put{Key: "k", Value: "w"}, // 10, 11, 12
		withDelay(acquire(4, LeaseID{Namespace: "other", Name: "c"})), // 13
		NewEpoch{},
		expire(1, 4),                                                // 14, 15
		open("e"), wait(16, LeaseID{Namespace: "other", Name: "c"}), // 16, 17
	} {
		applyOK(t, m, 7, c)
	}
	return m
}

func TestSnapshotRestore(t *testing.T) {
	m := busyMachine(t)
	snap := snapshotBytes(t, m)
	restored := New()
	applyOK(t, restored, 1, open("stale"))
	if err := restored.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got := snapshotBytes(t, restored); !bytes.Equal(got, snap) {
		t.Fatalf("snapshot of the restored machine:\ngot = %s\nexpected: %s", got, snap)
	}
	expect(t, "revision", restored.Revision(), int64(17))
	expect(t, "epoch", restored.Epoch(), int64(1))
	expect(t, "deadlines", restored.Deadlines(), m.Deadlines())
	checkInvariants(t, restored)

	// The same commands have the same results on both.
	for _, c := range []Command{
		CloseSession{SessionID: 1},
		EndLockDelays{Epoch: 1, Delays: []LockDelay{{Lease: LeaseID{Namespace: "other", Name: "c"}, Revision: 14}}},
		OpenSession{Identity: "a", TTL: ttl, MaxPerIdentity: 1},
		CloseSession{SessionID: 3},
	} {
		a, b := m.Apply(9, c), restored.Apply(9, c)
		expect(t, "events", b.Events, a.Events)
		expect(t, "error", b.Err, a.Err)
	}
	expect(t, "final snapshot", string(snapshotBytes(t, restored)), string(snapshotBytes(t, m)))
}

func TestRestoreErrors(t *testing.T) {
	tests := []struct {
		name    string
		snap    string
		message string
	}{
		{"a snapshot that is not JSON is refused", `{"version":1,`, "read snapshot"},
		{"a snapshot of another version is refused", `{"version":2}`, "version 2"},
		{"a snapshot without a version is refused", `{}`, "version 0"},
		{
			"a grant of a session not in the snapshot is refused",
			`{"version":1,"revision":3,"leases":[{"namespace":"ns","name":"a","capacity":1,"holders":[{"session_id":1,"token":2}]}]}`,
			"names session 1",
		},
		{
			"a waiter of a session not in the snapshot is refused",
			`{"version":1,"revision":3,"leases":[{"namespace":"ns","name":"a","capacity":1,"waiters":[{"session_id":2}]}]}`,
			"names session 2",
		},
		{
			"a key bound to a session not in the snapshot is refused",
			`{"version":1,"revision":3,"keys":[{"key":"k","value":"v","session_id":3}]}`,
			"names session 3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := busyMachine(t)
			before := snapshotBytes(t, m)
			err := m.Restore(strings.NewReader(tt.snap))
			if err == nil || !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("Restore: got = %v, expected: an error containing %q", err, tt.message)
			}
			if after := snapshotBytes(t, m); !bytes.Equal(after, before) {
				t.Errorf("state after a failed restore:\ngot = %s\nexpected: %s", after, before)
			}
			checkInvariants(t, m)
		})
	}
}

func TestMemberAddressesAreStateThatSnapshotsKeep(t *testing.T) {
	m := New()
	before := m.Revision()
	res := m.Apply(1, SetMember{ID: "n1", APIAddress: "10.0.0.1:7480"})
	expect(t, "error", res.Err, nil)
	expect(t, "events", len(res.Events), 0)
	expect(t, "revision", m.Revision(), before) // not a client-visible change
	applyOK(t, m, 2, SetMember{ID: "n2", APIAddress: "10.0.0.2:7480"})
	applyOK(t, m, 3, SetMember{ID: "n1", APIAddress: "10.0.0.9:7480"}) // moved
	applyOK(t, m, 4, SetMember{ID: "gone", APIAddress: "10.0.0.3:7480"})
	applyOK(t, m, 5, SetMember{ID: "gone"}) // forgotten
	applyOK(t, m, 6, SetMember{APIAddress: "nobody"})

	want := map[string]string{"n1": "10.0.0.9:7480", "n2": "10.0.0.2:7480"}
	expect(t, "members", m.Members(), want)
	restored := New()
	if err := restored.Restore(bytes.NewReader(snapshotBytes(t, m))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	expect(t, "restored members", restored.Members(), want)
	addr, ok := restored.MemberAddress("n2")
	expect(t, "n2", addr, "10.0.0.2:7480")
	expect(t, "n2 known", ok, true)
}

func TestSnapshotKeepsTheKeysHistory(t *testing.T) {
	m := New()
	for _, c := range []Command{
		Put{Key: "old", Value: "from version 4"}, // 1
		v5,                                       // KV 2
		SetMember{ID: "n1", APIAddress: "10.0.0.1:7480", EtcdAddress: "10.0.0.1:2379"},
		SetMember{ID: "n2", APIAddress: "10.0.0.2:7480"},
		withLeaseID("a", 4), // session 2 takes 4
		open("b"),           // 3
		open("c"),           // 4, alias 4|2^62
		writes(leasedPut("a/1", "1", 4), putOp("a/2", "1")),    // KV 3
		writes(leasedPut("c/1", "1", 4|1<<62), putOp("b", "")), // KV 4
		Put{Key: "a/2", Value: "2", SessionID: 3},              // KV 5
		writes(deleteOp("b", "")),                              // KV 6
		Compact{Revision: 4},
		writes(putOp("old", "from version 5")), // KV 7
		CloseSession{SessionID: 2},             // KV 8: deletes a/1
	} {
		applyOK(t, m, 1, c)
	}
	snap := snapshotBytes(t, m)
	restored := New()
	applyOK(t, restored, 1, v5)
	applyOK(t, restored, 1, writes(putOp("stale", "")))
	if err := restored.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got := snapshotBytes(t, restored); !bytes.Equal(got, snap) {
		t.Fatalf("snapshot of the restored machine:\ngot = %s\nexpected: %s", got, snap)
	}
	expect(t, "KV revision", restored.KVRevision(), int64(8))
	expect(t, "compact revision", restored.CompactRevision(), int64(4))
	expect(t, "versions kept", restored.HistorySize(), m.HistorySize())
	for rev := m.CompactRevision(); rev <= m.KVRevision(); rev++ {
		expect(t, fmt.Sprintf("range at %d", rev), rangeAt(t, restored, "", "\x00", rev), rangeAt(t, m, "", "\x00", rev))
	}
	expect(t, "KeyEvents", keyEventsFrom(t, restored, 5), keyEventsFrom(t, m, 5))
	if err := restored.RangeKeys("", "\x00", 3, func(KeyValue) bool { return true }); !errors.Is(err, ErrCompacted) {
		t.Errorf("range below the compact revision: got = %v, expected: %v", err, ErrCompacted)
	}
	for _, lease := range []int64{2, 3, 4, 4 | 1<<62} {
		s1, ok1 := m.SessionByLease(lease)
		s2, ok2 := restored.SessionByLease(lease)
		expect(t, fmt.Sprintf("SessionByLease(%d)", lease), [2]any{s2, ok2}, [2]any{s1, ok1})
	}
	c1, _ := restored.Key("c/1")
	expect(t, "etcd lease of c/1", c1.EtcdLease(), int64(4|1<<62))
	addr, ok := restored.MemberEtcdAddress("n1")
	expect(t, "n1's etcd address", [2]any{addr, ok}, [2]any{"10.0.0.1:2379", true})
	_, ok = restored.MemberEtcdAddress("n2")
	expect(t, "n2 serves no etcd API", ok, false)
	// The key as it is and its last version are one KeyValue, as before.
	restored.history.byKey.Descend(func(v *version) bool {
		if cur, ok := restored.keys.Get(&KeyValue{Key: v.Key}); ok && v.KV != nil && *cur == *v.KV && cur != v.KV {
			t.Errorf("version %+v: a copy of the key, expected: the key itself", v)
		}
		return true
	})
	checkInvariants(t, restored)
	checkHistory(t, restored)

	// The same commands have the same results on both.
	for _, c := range []Command{
		writes(putOp("old", "again"), deleteOp("a/", "a0")),
		withLeaseID("d", 4),
		withLeaseID("e", 4|1<<62),            // refused: session 4's alias
		withLeaseID("e", 18),                 // session 17
		OpenSession{Identity: "f", TTL: ttl}, // session 18, known by 18|2^62
		Compact{Revision: 8},
		Compact{Revision: 8},
		CloseSession{SessionID: 4},
	} {
		a, b := m.Apply(9, c), restored.Apply(9, c)
		expect(t, fmt.Sprintf("%T events", c), b.Events, a.Events)
		expect(t, fmt.Sprintf("%T error", c), b.Err, a.Err)
		expect(t, fmt.Sprintf("%T Txn", c), b.Txn, a.Txn)
	}
	s, _ := restored.Session(18)
	expect(t, "etcd lease of session 18", s.EtcdLeaseID(), int64(18|1<<62))
	expect(t, "final snapshot", string(snapshotBytes(t, restored)), string(snapshotBytes(t, m)))
}

func TestSnapshotsTurnBinaryWithTheClusterVersionAndKeepEveryByte(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v5)
	applyOK(t, m, 1, writes(putOp("/u/п", "v"), putOp("text", "\uFFFD")))
	json := snapshotBytes(t, m)
	if json[0] != '{' {
		t.Fatalf("snapshot at cluster version 5: got = %q..., expected: JSON, which builds before version 6 read", json[:8])
	}

	// At version 6 the same state is binary, and restores to itself.
	applyOK(t, m, 1, SetVersion{Version: BinaryVersion})
	for _, s := range awkwardStrings[1:] {
		applyOK(t, m, 1, writes(putOp("/c/"+s, s)))
	}
	applyOK(t, m, 1, writes(deleteOp("/c/\xbf", "")))
	snap := snapshotBytes(t, m)
	if !bytes.HasPrefix(snap, binarySnapshotMagic) {
		t.Fatalf("snapshot at cluster version %d: got = %q..., expected: the binary magic", BinaryVersion, snap[:8])
	}
	restored := New()
	if err := restored.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	expect(t, "snapshot of the restored machine", snapshotBytes(t, restored), snap)
	expect(t, "cluster version", restored.ClusterVersion(), BinaryVersion)
	for _, s := range awkwardStrings[1:] {
		kv, ok := restored.Key("/c/" + s)
		if s == "\xbf" {
			expect(t, "deleted "+s, ok, false)
			continue
		}
		expect(t, "value of /c/"+s, [2]any{kv.Value, ok}, [2]any{s, true})
	}
	expect(t, "history", keyEventsFrom(t, restored, 1), keyEventsFrom(t, m, 1))
	checkInvariants(t, restored)
	checkHistory(t, restored)

	// A JSON snapshot of an older build still restores here.
	old := New()
	if err := old.Restore(bytes.NewReader(json)); err != nil {
		t.Fatalf("Restore of the JSON snapshot: %v", err)
	}
	kv, _ := old.Key("/u/п")
	expect(t, "key from the JSON snapshot", kv.Value, "v")
}

func TestRestoreRefusesDamagedBinarySnapshots(t *testing.T) {
	m := busyMachine(t)
	applyOK(t, m, 1, SetVersion{Version: BinaryVersion})
	good := snapshotBytes(t, m)
	format := len(binarySnapshotMagic)
	tests := []struct {
		name    string
		snap    []byte
		message string
	}{
		{"a snapshot cut short is refused", good[:len(good)-1], "read snapshot"},
		{"a snapshot with bytes after the state is refused", append(bytes.Clone(good), 0), "bytes after the state"},
		{"a snapshot of another binary format is refused", append(append(bytes.Clone(good[:format]), 3), good[format+1:]...), "binary format 3"},
		{"the magic alone is refused", bytes.Clone(good[:format]), "read snapshot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := busyMachine(t)
			before := snapshotBytes(t, target)
			err := target.Restore(bytes.NewReader(tt.snap))
			if err == nil || !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("Restore: got = %v, expected: an error containing %q", err, tt.message)
			}
			expect(t, "state after a failed restore", snapshotBytes(t, target), before)
		})
	}
}

// TestBinarySnapshotIsWrittenInPiecesAndAsACopyWouldBe checks that a
// binary snapshot written straight from the machine's leases, in pieces,
// is byte for byte the encoding of a copy of the state, and that a
// writer's error is returned.
func TestBinarySnapshotIsWrittenInPiecesAndAsACopyWouldBe(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: BinaryVersion})
	id := applyOK(t, m, 1, open("a")).Session.ID
	value := strings.Repeat("v", 100)
	for i := range 3000 { // far past flushAt
		applyOK(t, m, 1, Acquire{SessionID: id, Lease: LeaseID{Namespace: "ns", Name: fmt.Sprintf("l%d", 2999-i)}, Capacity: 1, Value: value})
	}
	whole := m.snapshotState()
	whole.Leases = m.Leases("")
	e := encoder{b: append([]byte(nil), binarySnapshotMagic...)}
	e.uint(binarySnapshotFormat)
	whole.encode(&e)

	var w countingWriter
	if err := m.Snapshot(&w); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if !bytes.Equal(w.Bytes(), e.b) {
		t.Fatalf("snapshot written in pieces: got = %d bytes, expected: the %d bytes of a copy's encoding", w.Len(), len(e.b))
	}
	if w.writes < 2 {
		t.Fatalf("writes: got = %d, expected: several pieces of about %d bytes", w.writes, flushAt)
	}

	broken := errors.New("disk full")
	if err := m.Snapshot(failingWriter{broken}); !errors.Is(err, broken) {
		t.Fatalf("Snapshot to a failing writer: got = %v, expected: %v", err, broken)
	}
}

type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// TestASplitSnapshotIsTheMachineAsItWasWhateverItAppliesMeanwhile: the
// part of a snapshot SnapshotSplit leaves for later (keys, history, the
// members' maps) is written as it was when the split was made, while
// the machine goes on with puts over the same keys, deletions, new keys,
// a compaction and a member's address: the bytes are those of a
// snapshot taken at the split. The rest runs on another goroutine while
// the machine applies, as raftnode runs it, so that -race sees any
// sharing.
func TestASplitSnapshotIsTheMachineAsItWasWhateverItAppliesMeanwhile(t *testing.T) {
	m := busyMachine(t)
	applyOK(t, m, 1, v5)
	applyOK(t, m, 1, SetVersion{Version: BinaryVersion})
	for i := range 300 {
		applyOK(t, m, 1, writes(putOp(fmt.Sprintf("/k/%03d", i%100), fmt.Sprint(i)), putOp("/x\xff", "\x00")))
	}
	applyOK(t, m, 1, writes(deleteOp("/k/05", "/k/06")))
	want := snapshotBytes(t, m)

	var got bytes.Buffer
	rest, err := m.SnapshotSplit(&got)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rest() }()
	for i := range 300 {
		applyOK(t, m, 2, writes(putOp(fmt.Sprintf("/k/%03d", i), "later"), deleteOp("/x\xff", "")))
		if i == 100 {
			applyOK(t, m, 2, Compact{Revision: m.KVRevision() - 50})
			applyOK(t, m, 2, SetMember{ID: "n9", APIAddress: "127.0.0.1:9"})
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("split snapshot: got = %d bytes, expected: the %d bytes of the snapshot taken at the split", got.Len(), len(want))
	}
	if bytes.Equal(snapshotBytes(t, m), want) {
		t.Fatal("the machine's snapshot after the writes is the one before them: the test changed nothing")
	}
}
