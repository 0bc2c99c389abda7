package statemachine

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
)

// checkUsage checks the count kept as commands apply against a recount.
func checkUsage(t tb, m *Machine) {
	t.Helper()
	u, costs := m.recount()
	if m.Usage() != u {
		t.Fatalf("bytes held: got = %+v as applied, expected: %+v counted afresh", m.Usage(), u)
	}
	kept := make(map[LeaseID]int64, m.leases.len())
	for l := range m.leases.all() {
		kept[l.LeaseID] = l.cost
	}
	if !maps.Equal(kept, costs) {
		t.Fatalf("bytes per lease: got = %v as applied, expected: %v counted afresh", kept, costs)
	}
}

func TestUsageCountsWhatAKeyAndItsHistoryHold(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: Version})
	expect(t, "an empty machine", m.Usage(), Usage{})

	applyOK(t, m, 2, Put{Key: "key", Value: strings.Repeat("v", 1000)})
	// The version is the key as it is: only its own overhead.
	expect(t, "after a put", m.Usage(), Usage{Keys: KeyOverhead + 3 + 1000, History: VersionOverhead})

	applyOK(t, m, 3, Put{Key: "key", Value: "short"})
	// The first version is history now, at what the key cost then.
	expect(t, "after an overwrite", m.Usage(), Usage{
		Keys:    KeyOverhead + 3 + 5,
		History: VersionOverhead + (VersionOverhead + KeyOverhead + 3 + 1000) + 0,
	})

	applyOK(t, m, 4, Delete{Key: "key"})
	expect(t, "after a delete", m.Usage(), Usage{
		History: (VersionOverhead + KeyOverhead + 3 + 1000) + (VersionOverhead + KeyOverhead + 3 + 5) + (VersionOverhead + 3),
	})

	applyOK(t, m, 5, Compact{Revision: m.KVRevision()})
	expect(t, "after compacting it all", m.Usage(), Usage{})
	checkUsage(t, m)
}

func TestUsageCountsSessionsAndLeases(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: Version})
	res := applyOK(t, m, 2, OpenSession{Identity: "web-1", TTL: ttl, Labels: map[string]string{"zone": "a"}})
	expect(t, "sessions", m.Usage().Sessions, int64(SessionOverhead+len("web-1")+len("zone")+len("a")))
	applyOK(t, m, 3, Acquire{SessionID: res.Session.ID, Lease: leaseA, Capacity: 1, Value: "10.0.0.1"})
	expect(t, "leases", m.Usage().Leases, int64(LeaseOverhead+len("ns")+len("a")+GrantOverhead+len("web-1")+len("10.0.0.1")))
	applyOK(t, m, 4, CloseSession{SessionID: res.Session.ID})
	expect(t, "sessions after the close", m.Usage().Sessions, int64(0))
	// The record stays with its last grant.
	expect(t, "leases after the close", m.Usage().Leases, int64(LeaseOverhead+len("ns")+len("a")+GrantOverhead+len("web-1")+len(EndReleased)+len("session closed")))
	checkUsage(t, m)
}

// Random keys, values of random sizes, Txns, deletes, sessions with keys
// bound to them, leases and compactions: after each command the count
// kept equals a recount, and after a snapshot round trip the restored
// machine counts the same bytes.
func TestUsageIsKeptExactlyAndSurvivesASnapshot(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 29))
			m := New()
			applyOK(t, m, 1, SetVersion{Version: Version})
			key := func() string { return fmt.Sprintf("/k/%d", r.IntN(20)) }
			value := func() string { return strings.Repeat("x", r.IntN(5000)) }
			short := func() string { return strings.Repeat("y", r.IntN(100)) }
			var sessions []int64
			for i := range 2000 {
				now := int64(i + 2)
				var cmd Command
				switch r.IntN(10) {
				case 0:
					cmd = OpenSession{Identity: fmt.Sprint("id-", r.IntN(3)), TTL: ttl, Labels: map[string]string{"n": short()}}
				case 1:
					if len(sessions) > 0 {
						cmd = CloseSession{SessionID: sessions[r.IntN(len(sessions))]}
					}
				case 2:
					if len(sessions) > 0 {
						cmd = Acquire{SessionID: sessions[r.IntN(len(sessions))], Lease: LeaseID{Namespace: "ns", Name: key()}, Capacity: 2, Wait: true, Value: short(), GCAfter: gcAfter}
					}
				case 3:
					cmd = Delete{Key: "/k/1", Prefix: r.IntN(2) == 0}
				case 4:
					c, kv := m.CompactRevision(), m.KVRevision()
					if kv > c+1 {
						cmd = Compact{Revision: c + 1 + r.Int64N(kv-c)}
					}
				case 5:
					cmd = Txn{Success: []TxnOp{{Type: OpPut, Key: key(), Value: value()}, {Type: OpDelete, Key: key()}}}
				case 6:
					if len(sessions) > 0 {
						cmd = Put{Key: key(), Value: value(), SessionID: sessions[r.IntN(len(sessions))]}
					}
				default:
					cmd = Put{Key: key(), Value: value()}
				}
				if cmd == nil {
					continue
				}
				res := m.Apply(now, cmd)
				if res.Session != nil {
					sessions = append(sessions, res.Session.ID)
				}
				checkUsage(t, m)
			}
			if m.Usage().History == 0 || m.Usage().Keys == 0 {
				t.Fatalf("usage %+v: expected keys and history to hold bytes after 2,000 commands", m.Usage())
			}
			restored := New()
			if err := restored.Restore(bytes.NewReader(snapshotBytes(t, m))); err != nil {
				t.Fatal(err)
			}
			expect(t, "bytes held after a snapshot round trip", restored.Usage(), m.Usage())
			checkUsage(t, restored)
		})
	}
}

func TestCompactionTargetFreesTheOldestHistoryFirst(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: Version})
	big := strings.Repeat("v", 10_000)
	for i := range 100 {
		applyOK(t, m, int64(i+2), Put{Key: "k", Value: big})
	}
	expect(t, "within the limit", m.CompactionTarget(m.Usage().History), int64(0))
	limit := m.Usage().History / 2
	target := m.CompactionTarget(limit)
	if target <= m.CompactRevision() || target > m.KVRevision() {
		t.Fatalf("target: got = %d, expected: within (%d, %d]", target, m.CompactRevision(), m.KVRevision())
	}
	applyOK(t, m, 200, Compact{Revision: target})
	if got := m.Usage().History; got > limit {
		t.Fatalf("history after compacting at the target: got = %d bytes, expected: at most %d", got, limit)
	}
	checkUsage(t, m)
}

func TestANoSpaceAlarmRefusesWhatAddsDataAndLetsHoldersGo(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: Version})
	s := applyOK(t, m, 2, open("web-1")).Session.ID
	grant := applyOK(t, m, 3, acquire(s, leaseA)).Grant
	applyOK(t, m, 4, Put{Key: "/a", Value: "1"})
	applyOK(t, m, 5, Put{Key: "/b", Value: "2"})
	applyOK(t, m, 6, SetAlarm{Member: "node1", Alarm: AlarmNoSpace, Active: true})
	expect(t, "alarms", m.Alarms(), []AlarmMember{{Member: "node1", Alarm: AlarmNoSpace}})
	expect(t, "no space", m.NoSpace(), true)

	refused := []Command{
		Put{Key: "/c", Value: "3"},
		Txn{Success: []TxnOp{{Type: OpPut, Key: "/c", Value: "3"}}},
		Txn{Failure: []TxnOp{{Type: OpTxn, Txn: &Txn{Success: []TxnOp{{Type: OpPut, Key: "/c"}}}}}},
		CompareAndSwap{Key: "/a", Target: CompareValue, Value: "1", NewValue: "x"},
		open("web-2"),
		acquire(s, leaseB),
		SetValue{Lease: leaseA, Token: grant.Token, Value: "more"},
	}
	for _, cmd := range refused {
		before := snapshotBytes(t, m)
		res := m.Apply(7, cmd)
		if !errors.Is(res.Err, ErrNoSpace) || !strings.Contains(res.Err.Error(), "mvcc: database space exceeded") {
			t.Errorf("%T %+v: got = %v, expected: %v", cmd, cmd, res.Err, ErrNoSpace)
		}
		expect(t, fmt.Sprintf("state after a refused %T", cmd), snapshotBytes(t, m), before)
	}
	// Reads and what frees go on.
	if _, err := m.ReadTxn(Txn{Success: []TxnOp{{Type: OpRange, Key: "/a"}}}); err != nil {
		t.Errorf("a read: got = %v, expected: nil", err)
	}
	applyOK(t, m, 8, Delete{Key: "/a"})
	applyOK(t, m, 9, Txn{Success: []TxnOp{{Type: OpDelete, Key: "/b"}}})
	applyOK(t, m, 10, CompareAndSwap{Key: "/none", Target: CompareAbsent, Delete: true})
	applyOK(t, m, 11, Compact{Revision: m.KVRevision()})
	applyOK(t, m, 12, Release{Lease: leaseA, Token: grant.Token})
	applyOK(t, m, 13, CloseSession{SessionID: s})

	// The alarm survives a snapshot, and clearing it lets writes in.
	restored := New()
	if err := restored.Restore(bytes.NewReader(snapshotBytes(t, m))); err != nil {
		t.Fatal(err)
	}
	expect(t, "alarms after a snapshot", restored.Alarms(), m.Alarms())
	if res := restored.Apply(14, Put{Key: "/c"}); !errors.Is(res.Err, ErrNoSpace) {
		t.Fatalf("a put after the restore: got = %v, expected: %v", res.Err, ErrNoSpace)
	}
	applyOK(t, restored, 15, SetAlarm{Member: "node1", Alarm: AlarmNoSpace})
	expect(t, "no space after the disarm", restored.NoSpace(), false)
	applyOK(t, restored, 16, Put{Key: "/c", Value: "3"})
}

func TestAlarmsWaitForTheirClusterVersion(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: alarmVersion - 1})
	before := snapshotBytes(t, m)
	if res := m.Apply(2, SetAlarm{Member: "node1", Alarm: AlarmNoSpace, Active: true}); !errors.Is(res.Err, ErrNotSupported) {
		t.Fatalf("SetAlarm at version %d: got = %v, expected: %v", alarmVersion-1, res.Err, ErrNotSupported)
	}
	expect(t, "state", snapshotBytes(t, m), before)
	applyOK(t, m, 3, SetVersion{Version: alarmVersion})
	if res := m.Apply(4, SetAlarm{Member: "node1", Alarm: AlarmType(9), Active: true}); !errors.Is(res.Err, ErrNotSupported) {
		t.Fatalf("SetAlarm of an unknown alarm: got = %v, expected: %v", res.Err, ErrNotSupported)
	}
	applyOK(t, m, 5, SetAlarm{Member: "node1", Alarm: AlarmNoSpace, Active: true})
}
