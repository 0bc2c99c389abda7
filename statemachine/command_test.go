package statemachine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// sampleCommands has one command of every kind, with every field set.
func sampleCommands() []Command {
	return []Command{
		OpenSession{Identity: "web-1", TTL: ttl, Labels: map[string]string{"zone": "a"}, MaxPerIdentity: 3, LeaseID: 0x7f},
		CloseSession{SessionID: 7},
		ExpireSessions{Epoch: 2, IDs: []int64{1, 5}, Renewed: []int64{1_700_000_000_000_000_000, 0}},
		Acquire{SessionID: 1, Lease: leaseA, Capacity: 2, Wait: true, Value: "addr", Labels: map[string]string{"app": "x"}, LockDelay: lockDelay, MaxWaiters: 4, Exclusive: true, GCAfter: gcAfter, MaxHold: ttl},
		Release{Lease: leaseA, Token: 9},
		SetValue{Lease: leaseA, Token: 9, Value: "new"},
		Revoke{Lease: leaseB, Token: 3, Reason: "operator"},
		CancelWait{SessionID: 1, Lease: leaseA, ReleaseIfHeld: true},
		Put{Key: "k", Value: "v", TTL: keyTTL, SessionID: 1},
		Delete{Key: "a/", Prefix: true},
		CompareAndSwap{Key: "k", Target: CompareModRevision, Value: "v", ModRevision: 4, Delete: true, NewValue: "n", TTL: keyTTL, SessionID: 2},
		ExpireKeys{Epoch: 1, Keys: []KeyTTL{{Key: "k", ModRevision: 3, TTL: keyTTL}}},
		EndLockDelays{Epoch: 1, Delays: []LockDelay{{Lease: leaseA, Revision: 5, Delay: lockDelay}}},
		NewEpoch{},
		SetMember{ID: "n1", APIAddress: "10.0.0.1:7480", Version: 2, EtcdAddress: "10.0.0.1:2379"},
		CollectLeases{Epoch: 3, Leases: []IdleLease{{Lease: leaseA, Revision: 8, GCAfter: gcAfter, IdleSince: 1_700_000_000_000_000_000}}},
		SetPreferred{Lease: leaseA, Identity: "web-2"},
		SetVersion{Version: 2},
		AskStepDown{Lease: leaseA, Token: 9, Reason: "max-hold"},
		Txn{
			Compares: []TxnCompare{{Key: "k", End: "l", Target: TargetMod, Op: CmpLess, Number: 4, Value: "v"}},
			Success:  []TxnOp{{Type: OpPut, Key: "k", Value: "v", Lease: 7, IgnoreValue: true, IgnoreLease: true}, {Type: OpRange, Key: "a", End: "\x00", Revision: 3}},
			Failure:  []TxnOp{{Type: OpTxn, Txn: &Txn{Success: []TxnOp{{Type: OpDelete, Key: "a", End: "b"}}}}},
			Actor:    &Actor{Principal: "alice", Identities: []string{"web-*"}},
		},
		Compact{Revision: 12},
		SetAlarm{Member: "n1", Alarm: AlarmNoSpace, Active: true},
		AuthChange{Op: AuthRoleGrantPermission, Role: "r", Perm: AuthPerm{Type: PermReadWrite, Key: "k/", RangeEnd: "k0"}},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	forms := []struct {
		name   string
		encode func(int64, Command) ([]byte, error)
		flag   byte
	}{
		{"binary", Encode, binaryFlag},
		{"JSON", EncodeJSON, 0},
	}
	kinds := map[Kind]bool{}
	for _, cmd := range sampleCommands() {
		kinds[cmd.Kind()] = true
		for _, form := range forms {
			for _, now := range []int64{0, 1_700_000_000_000_000_000, -1, math.MaxInt64, math.MinInt64} {
				data, err := form.encode(now, cmd)
				if err != nil {
					t.Fatalf("%s Encode(%T): %v", form.name, cmd, err)
				}
				expect(t, form.name+" kind byte", data[0], byte(cmd.Kind())|form.flag)
				gotNow, got, err := Decode(data)
				if err != nil {
					t.Fatalf("Decode(%s %T): got = %v, expected: nil", form.name, cmd, err)
				}
				expect(t, "now", gotNow, now)
				expect(t, "command", got, cmd)
			}
		}
	}
	for k := KindOpenSession; k <= lastKind; k++ {
		if !kinds[k] {
			t.Errorf("kind %d: got = no sample command, expected: one", k)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	header := func(k Kind) []byte {
		b := make([]byte, headerLen)
		b[0] = byte(k)
		binary.BigEndian.PutUint64(b[1:], 42)
		return b
	}
	with := func(k Kind, body string) []byte { return append(header(k), body...) }
	put, _ := Encode(42, Put{Key: "k", Value: "v"})
	tests := []struct {
		name string
		data []byte
	}{
		{"an empty entry is refused", nil},
		{"an entry shorter than its header is refused", []byte{byte(KindPut), 0, 0, 0}},
		{"an entry of kind 0 is refused", with(0, `{}`)},
		{"an entry of a kind after the last is refused", with(lastKind+1, `{}`)},
		{"an entry of kind 255 is refused", with(255, `{}`)},
		{"a header without a body is refused", header(KindPut)},
		{"a body that is not JSON is refused", with(KindAcquire, `{"session_id":`)},
		{"a body of the wrong JSON type is refused", with(KindRelease, `{"token":"nine"}`)},
		{"a body with trailing data is refused", with(KindCloseSession, `{"session_id":1} {}`)},
		{"a new epoch without a body is refused", header(KindNewEpoch)},
		// The binary form.
		{"a binary body cut short is refused", put[:len(put)-1]},
		{"a binary body with a byte after it is refused", append(bytes.Clone(put), 0)},
		{"a string longer than the body is refused", binaryEntry(KindDelete, 5, 'a', 0)},
		{"a boolean that is neither 0 nor 1 is refused", binaryEntry(KindDelete, 1, 'a', 2)},
		{"a varint that never ends is refused", binaryEntry(KindCompact, 0x80, 0x80)},
		{"a varint over 64 bits is refused", binaryEntry(KindCompact, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)},
		{"an enumeration over 255 is refused", binaryEntry(KindCompareAndSwap, 1, 'k', 0x80, 0x02)},
		{"labels out of order are refused", binaryEntry(KindOpenSession, 0, 2, 2, 1, 'b', 0, 1, 'a', 0, 0, 0)},
		{"labels with a key twice are refused", binaryEntry(KindOpenSession, 0, 2, 2, 1, 'a', 0, 1, 'a', 0, 0, 0)},
		{"a count over the bytes left is refused", binaryEntry(KindExpireSession, 2, 200, 1)},
		{"a binary entry of kind 0 is refused", binaryEntry(0)},
		{"a binary entry of a kind after the last is refused", binaryEntry(lastKind + 1)},
		{"Txns nested past the bound are refused", binaryEntry(KindTxn, deepTxn(maxTxnDepth+1)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cmd, err := Decode(tt.data)
			if !errors.Is(err, ErrUnknownCommand) {
				t.Errorf("Err: got = %v, expected: %v", err, ErrUnknownCommand)
			}
			if cmd != nil {
				t.Errorf("command: got = %#v, expected: nil", cmd)
			}
		})
	}
}

// fuzzFixture returns a machine with sessions, holders, waiters, keys and
// a lock-delay, for decoded commands to run against.
func fuzzFixture(t testing.TB) *Machine {
	m := New()
	for _, c := range []Command{
		open("a"), open("b"), open("c"), // 1, 2, 3
		withDelay(acquire(1, leaseA)),                                  // 4
		wait(2, leaseA),                                                // 5
		semaphore(2, leaseB, 2, false), semaphore(3, leaseB, 2, false), // 6, 7
		Put{Key: "k", Value: "v", TTL: keyTTL}, Put{Key: "b", Value: "v", SessionID: 3}, // 8, 9
		open("d"), withDelay(acquire(10, LeaseID{Namespace: "ns", Name: "c"})), expire(0, 10), // 10, 11, 12..13
	} {
		applyOK(t, m, 1, c)
	}
	return m
}

func FuzzDecode(f *testing.F) {
	for _, cmd := range sampleCommands() {
		for _, encode := range []func(int64, Command) ([]byte, error){Encode, EncodeJSON} {
			data, err := encode(12345, cmd)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Add([]byte{byte(KindAcquire), 0, 0, 0, 0, 0, 0, 0, 1, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		now, cmd, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrUnknownCommand) {
				t.Fatalf("Err: got = %v, expected: it wraps %v", err, ErrUnknownCommand)
			}
			if cmd != nil {
				t.Fatalf("command with an error: got = %#v, expected: nil", cmd)
			}
			return
		}
		// What decodes re-encodes, and the re-encoding is a fixed point.
		again, err := Encode(now, cmd)
		if err != nil {
			t.Fatalf("Encode(Decode(x)): %v", err)
		}
		now2, cmd2, err := Decode(again)
		if err != nil {
			t.Fatalf("Decode(Encode(Decode(x))): got = %v, expected: nil", err)
		}
		if now2 != now || cmd2.Kind() != cmd.Kind() {
			t.Fatalf("round trip: got = %d %T, expected: %d %T", now2, cmd2, now, cmd)
		}
		third, err := Encode(now2, cmd2)
		if err != nil || !bytes.Equal(third, again) {
			t.Fatalf("second round trip: got = %q (%v), expected: %q", third, err, again)
		}
		for _, m := range []*Machine{New(), fuzzFixture(t)} {
			if IsBinary(data) {
				// raftnode applies a binary entry only from BinaryVersion on.
				m.Apply(now, SetVersion{Version: BinaryVersion})
			}
			before := snapshotBytes(t, m)
			rev := m.Revision()
			res := m.Apply(now, cmd2)
			checkRevisions(t, rev, m, res)
			if res.Err != nil {
				if len(res.Events) != 0 {
					t.Fatalf("events of a failed command: got = %v, expected: none", eventTypes(res))
				}
				if after := snapshotBytes(t, m); !bytes.Equal(before, after) {
					t.Fatalf("state after a failed command:\ngot = %s\nexpected: %s", after, before)
				}
			}
			checkInvariants(t, m)
			// The state it left must survive a snapshot.
			restored := New()
			snap := snapshotBytes(t, m)
			if err := restored.Restore(bytes.NewReader(snap)); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if got := snapshotBytes(t, restored); !bytes.Equal(got, snap) {
				t.Fatalf("restored snapshot:\ngot = %s\nexpected: %s", got, snap)
			}
		}
	})
}
