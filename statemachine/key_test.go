package statemachine

import (
	"errors"
	"testing"
)

func TestPutAndDelete(t *testing.T) {
	runCases(t, []machineCase{
		{
			name: "a new key has the create and mod revision of its put and version 1",
			cmd:  Put{Key: "k1", Value: "v1"},
			check: func(t *testing.T, m *Machine, res Result) {
				expected := KeyValue{Key: "k1", Value: "v1", CreateRevision: 1, ModRevision: 1, Version: 1}
				expect(t, "KV", *res.KV, expected)
				expect(t, "PrevKV", res.PrevKV, (*KeyValue)(nil))
				expectEvents(t, res, EventKeyPut)
				expect(t, "event KV", *res.Events[0].KV, expected)
				got, ok := m.Key("k1")
				expect(t, "Key found", ok, true)
				expect(t, "Key", got, expected)
			},
		},
		{
			name:  "a second put keeps the create revision, moves the mod revision and version, and returns the previous key",
			setup: []Command{Put{Key: "k1", Value: "v1", TTL: keyTTL}, Put{Key: "k2", Value: "x"}},
			cmd:   Put{Key: "k1", Value: "v2"},
			check: func(t *testing.T, m *Machine, res Result) {
				prev := KeyValue{Key: "k1", Value: "v1", CreateRevision: 1, ModRevision: 1, Version: 1, TTL: keyTTL}
				expect(t, "KV", *res.KV, KeyValue{Key: "k1", Value: "v2", CreateRevision: 1, ModRevision: 3, Version: 2})
				expect(t, "PrevKV", *res.PrevKV, prev)
				expect(t, "event PrevKV", *res.Events[0].PrevKV, prev)
				expect(t, "key TTLs", m.Deadlines().Keys, []KeyTTL(nil))
			},
		},
		{
			name: "a put bound to an unknown session fails",
			cmd:  Put{Key: "k", Value: "v", SessionID: 4},
			err:  ErrSessionNotFound,
		},
		{
			name:  "a put bound to a session is counted in its holdings",
			setup: []Command{open("a")},
			cmd:   Put{Key: "k", Value: "v", SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "event session", res.Events[0].SessionID, int64(1))
				_, _, n := m.SessionHoldings(1)
				expect(t, "keys bound", n, 1)
			},
		},
		{
			name:  "deleting a key returns it",
			setup: []Command{Put{Key: "k1", Value: "v1"}},
			cmd:   Delete{Key: "k1"},
			check: func(t *testing.T, m *Machine, res Result) {
				prev := KeyValue{Key: "k1", Value: "v1", CreateRevision: 1, ModRevision: 1, Version: 1}
				expect(t, "deleted", res.Deleted, int64(1))
				expect(t, "PrevKV", *res.PrevKV, prev)
				expectEvents(t, res, EventKeyDeleted)
				expect(t, "event KV", *res.Events[0].KV, KeyValue{Key: "k1", ModRevision: 2})
				expect(t, "event PrevKV", *res.Events[0].PrevKV, prev)
				_, ok := m.Key("k1")
				expect(t, "Key found", ok, false)
			},
		},
		{
			name:  "a key written again after a delete starts at version 1",
			setup: []Command{Put{Key: "k1", Value: "v1"}, Put{Key: "k1", Value: "v2"}, Delete{Key: "k1"}},
			cmd:   Put{Key: "k1", Value: "v3"},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "KV", *res.KV, KeyValue{Key: "k1", Value: "v3", CreateRevision: 4, ModRevision: 4, Version: 1})
			},
		},
		{
			name:  "deleting an absent key does nothing",
			setup: []Command{Put{Key: "k1", Value: "v1"}},
			cmd:   Delete{Key: "k2"},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "deleted", res.Deleted, int64(0))
				expectEvents(t, res)
				expect(t, "revision", res.Revision, int64(1))
			},
		},
		{
			name:  "deleting a prefix removes every key with the prefix and no other",
			setup: []Command{Put{Key: "a/1"}, Put{Key: "a/2"}, Put{Key: "ab"}, Put{Key: "b"}, Put{Key: "a"}},
			cmd:   Delete{Key: "a/", Prefix: true},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "deleted", res.Deleted, int64(2))
				expectEvents(t, res, EventKeyDeleted, EventKeyDeleted)
				expect(t, "deleted keys", [2]string{res.Events[0].KV.Key, res.Events[1].KV.Key}, [2]string{"a/1", "a/2"})
				expect(t, "keys", keys(m), []string{"a", "ab", "b"})
			},
		},
		{
			name:  "deleting the empty prefix removes every key",
			setup: []Command{Put{Key: "a/1"}, Put{Key: "b"}},
			cmd:   Delete{Prefix: true},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "deleted", res.Deleted, int64(2))
				expect(t, "keys", keys(m), []string(nil))
			},
		},
		{
			name:  "deleting a session's key unbinds it from the session",
			setup: []Command{open("a"), Put{Key: "k", SessionID: 1}},
			cmd:   Delete{Key: "k"},
			check: func(t *testing.T, m *Machine, res Result) {
				_, _, n := m.SessionHoldings(1)
				expect(t, "keys bound", n, 0)
				res = applyOK(t, m, cmdTime, CloseSession{SessionID: 1})
				expectEvents(t, res, EventSessionClosed)
			},
		},
	})
}

func TestRange(t *testing.T) {
	m := New()
	for _, k := range []string{"b/1", "a/3", "a/1", "a/2", "a"} {
		applyOK(t, m, 1, Put{Key: k, Value: "v-" + k})
	}
	names := func(kvs []KeyValue) []string {
		var out []string
		for _, kv := range kvs {
			out = append(out, kv.Key)
		}
		return out
	}
	tests := []struct {
		name   string
		prefix string
		limit  int
		keys   []string
		more   bool
	}{
		{"a prefix returns its keys sorted", "a/", 0, []string{"a/1", "a/2", "a/3"}, false},
		{"a limit below the count says there are more", "a/", 2, []string{"a/1", "a/2"}, true},
		{"a limit equal to the count says there are no more", "a/", 3, []string{"a/1", "a/2", "a/3"}, false},
		{"a prefix without keys returns none", "c", 0, nil, false},
		{"the empty prefix returns every key", "", 0, []string{"a", "a/1", "a/2", "a/3", "b/1"}, false},
		{"a whole key is its own prefix", "b/1", 0, []string{"b/1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvs, more := m.Range(tt.prefix, tt.limit)
			expect(t, "keys", names(kvs), tt.keys)
			expect(t, "more", more, tt.more)
		})
	}
	kv, ok := m.Key("a/2")
	expect(t, "Key(a/2)", [2]any{kv, ok}, [2]any{KeyValue{Key: "a/2", Value: "v-a/2", CreateRevision: 4, ModRevision: 4, Version: 1}, true})
	expect(t, "KeyCount", m.KeyCount(), 5)
}

func TestCompareAndSwap(t *testing.T) {
	// k: value v2, create revision 1, mod revision 2, version 2.
	setup := []Command{Put{Key: "k", Value: "v1"}, Put{Key: "k", Value: "v2"}}
	current := &KeyValue{Key: "k", Value: "v2", CreateRevision: 1, ModRevision: 2, Version: 2}
	failsWithCurrent := func(t *testing.T, m *Machine, res Result) {
		expect(t, "Result.KV", res.KV, current)
	}
	runCases(t, []machineCase{
		{
			name:  "absent holds for a key that was never written",
			setup: setup,
			cmd:   CompareAndSwap{Key: "new", Target: CompareAbsent, NewValue: "x", TTL: keyTTL},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "KV", *res.KV, KeyValue{Key: "new", Value: "x", CreateRevision: 3, ModRevision: 3, Version: 1, TTL: keyTTL})
				expect(t, "PrevKV", res.PrevKV, (*KeyValue)(nil))
				expectEvents(t, res, EventKeyPut)
			},
		},
		{
			name:  "absent fails for an existing key",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareAbsent, NewValue: "x"},
			err:   ErrCompareFailed,
			check: failsWithCurrent,
		},
		{
			name:  "value holds when it is the current value",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareValue, Value: "v2", NewValue: "v3"},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "KV", *res.KV, KeyValue{Key: "k", Value: "v3", CreateRevision: 1, ModRevision: 3, Version: 3})
				expect(t, "PrevKV", res.PrevKV, current)
			},
		},
		{
			name:  "value fails when it is not the current value",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareValue, Value: "v1", NewValue: "v3"},
			err:   ErrCompareFailed,
			check: failsWithCurrent,
		},
		{
			name:  "value fails when the key is absent",
			setup: setup,
			cmd:   CompareAndSwap{Key: "new", Target: CompareValue, Value: "", NewValue: "v3"},
			err:   ErrCompareFailed,
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "Result.KV", res.KV, (*KeyValue)(nil))
			},
		},
		{
			name:  "mod revision holds when it is the current mod revision",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareModRevision, ModRevision: 2, NewValue: "v3"},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "KV", *res.KV, KeyValue{Key: "k", Value: "v3", CreateRevision: 1, ModRevision: 3, Version: 3})
			},
		},
		{
			name:  "mod revision fails when the key was written since",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareModRevision, ModRevision: 1, NewValue: "v3"},
			err:   ErrCompareFailed,
			check: failsWithCurrent,
		},
		{
			name:  "mod revision 0 holds for an absent key",
			setup: setup,
			cmd:   CompareAndSwap{Key: "new", Target: CompareModRevision, ModRevision: 0, NewValue: "x"},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "KV version", res.KV.Version, int64(1))
			},
		},
		{
			name:  "mod revision 0 fails for an existing key",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareModRevision, ModRevision: 0, NewValue: "x"},
			err:   ErrCompareFailed,
			check: failsWithCurrent,
		},
		{
			name:  "a compare-and-delete deletes the key",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareModRevision, ModRevision: 2, Delete: true},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventKeyDeleted)
				expect(t, "deleted", res.Deleted, int64(1))
				expect(t, "PrevKV", res.PrevKV, current)
				expect(t, "keys", keys(m), []string(nil))
			},
		},
		{
			name:  "a compare-and-delete of an absent key does nothing",
			setup: setup,
			cmd:   CompareAndSwap{Key: "new", Target: CompareAbsent, Delete: true},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				expect(t, "deleted", res.Deleted, int64(0))
			},
		},
		{
			name:  "a failed compare-and-delete keeps the key",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: CompareValue, Value: "v1", Delete: true},
			err:   ErrCompareFailed,
			check: failsWithCurrent,
		},
		{
			name:  "an unknown compare target fails",
			setup: setup,
			cmd:   CompareAndSwap{Key: "k", Target: 9, NewValue: "x"},
			err:   ErrCompareFailed,
		},
		{
			name:  "a swap bound to an unknown session fails",
			setup: setup,
			cmd:   CompareAndSwap{Key: "new", Target: CompareAbsent, NewValue: "x", SessionID: 9},
			err:   ErrSessionNotFound,
		},
		{
			name:  "a swap bound to a session goes with the session",
			setup: append([]Command{open("a")}, setup...),
			cmd:   CompareAndSwap{Key: "k", Target: CompareValue, Value: "v2", NewValue: "mine", SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				res = applyOK(t, m, cmdTime, CloseSession{SessionID: 1})
				expectEvents(t, res, EventKeyDeleted, EventSessionClosed)
			},
		},
	})
}

func TestExpireKeys(t *testing.T) {
	// k has a TTL and mod revision 1; plain has none and mod revision 2.
	setup := []Command{Put{Key: "k", Value: "v", TTL: keyTTL}, Put{Key: "plain", Value: "v"}}
	runCases(t, []machineCase{
		{
			name:  "a key still at the named mod revision is deleted",
			setup: setup,
			cmd:   ExpireKeys{Keys: []KeyTTL{{Key: "k", ModRevision: 1}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventKeyExpired)
				expect(t, "event KV", *res.Events[0].KV, KeyValue{Key: "k", ModRevision: 3})
				expect(t, "event PrevKV", *res.Events[0].PrevKV, KeyValue{Key: "k", Value: "v", CreateRevision: 1, ModRevision: 1, Version: 1, TTL: keyTTL})
				expect(t, "keys", keys(m), []string{"plain"})
			},
		},
		{
			name:  "a key written since the named revision is kept",
			setup: append(append([]Command{}, setup...), Put{Key: "k", Value: "v2", TTL: keyTTL}),
			cmd:   ExpireKeys{Keys: []KeyTTL{{Key: "k", ModRevision: 1}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				expect(t, "keys", keys(m), []string{"k", "plain"})
			},
		},
		{
			name:  "an expiry from an older epoch is ignored",
			setup: append(append([]Command{}, setup...), NewEpoch{}),
			cmd:   ExpireKeys{Epoch: 0, Keys: []KeyTTL{{Key: "k", ModRevision: 1}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
			},
		},
		{
			name:  "an expiry with the current epoch after a new epoch is applied",
			setup: append(append([]Command{}, setup...), NewEpoch{}, NewEpoch{}),
			cmd:   ExpireKeys{Epoch: 2, Keys: []KeyTTL{{Key: "k", ModRevision: 1}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventKeyExpired)
			},
		},
		{
			name:  "a key without a TTL is never expired",
			setup: setup,
			cmd:   ExpireKeys{Keys: []KeyTTL{{Key: "plain", ModRevision: 2}, {Key: "absent", ModRevision: 1}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
			},
		},
	})
}

func TestDeadlines(t *testing.T) {
	m := New()
	for _, c := range []Command{
		OpenSession{Identity: "a", TTL: ttl},        // 1
		OpenSession{Identity: "b", TTL: 2 * ttl},    // 2
		Put{Key: "k", Value: "v", TTL: keyTTL},      // 3
		Put{Key: "plain", Value: "v"},               // 4
		Put{Key: "bound", Value: "v", SessionID: 1}, // 5
		withDelay(acquire(1, leaseA)),               // 6
		acquire(2, leaseB),                          // 7
		expire(0, 1),                                // 8 lease expired, 9 key deleted, 10 session expired
		Put{Key: "j", Value: "v", TTL: 2 * keyTTL},  // 11
	} {
		applyOK(t, m, 1, c)
	}
	expect(t, "Deadlines", m.Deadlines(), Deadlines{
		Sessions: []SessionTTL{{ID: 2, TTL: 2 * ttl}},
		Keys:     []KeyTTL{{Key: "j", ModRevision: 11, TTL: 2 * keyTTL}, {Key: "k", ModRevision: 3, TTL: keyTTL}},
		Delays:   []LockDelay{{Lease: leaseA, Revision: 8, Delay: lockDelay}},
	})
	expect(t, "Deadlines of an empty machine", New().Deadlines(), Deadlines{})
}

func TestUnknownCommandType(t *testing.T) {
	m := New()
	res := m.Apply(1, &Put{Key: "k"})
	if !errors.Is(res.Err, ErrUnknownCommand) {
		t.Errorf("Err: got = %v, expected: %v", res.Err, ErrUnknownCommand)
	}
	expect(t, "revision", m.Revision(), int64(0))
	expect(t, "events", len(res.Events), 0)
}
