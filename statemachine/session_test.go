package statemachine

import (
	"testing"
)

func TestOpenSession(t *testing.T) {
	runCases(t, []machineCase{
		{
			name: "a session without an identity is named session-<id>",
			cmd:  OpenSession{TTL: ttl},
			check: func(t *testing.T, m *Machine, res Result) {
				expected := Session{ID: 1, Identity: "session-1", TTL: ttl, OpenTime: cmdTime}
				expect(t, "Result.Session", *res.Session, expected)
				expectEvents(t, res, EventSessionOpened)
				expect(t, "event session", *res.Events[0].Session, expected)
				expect(t, "event session ID", res.Events[0].SessionID, int64(1))
				got, ok := m.Session(1)
				expect(t, "Session(1) found", ok, true)
				expect(t, "Session(1)", got, expected)
			},
		},
		{
			name:  "a session's ID is the revision of its open event, so it is never reused",
			setup: []Command{Put{Key: "k", Value: "v"}, open("a"), CloseSession{SessionID: 2}},
			cmd:   open("a"),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "session ID", res.Session.ID, int64(4))
				expect(t, "event revision", res.Events[0].Revision, int64(4))
			},
		},
		{
			name: "a session keeps its identity and labels",
			cmd:  OpenSession{Identity: "web-1", TTL: ttl, Labels: map[string]string{"zone": "a"}},
			check: func(t *testing.T, m *Machine, res Result) {
				s, _ := m.Session(1)
				expect(t, "identity", s.Identity, "web-1")
				expect(t, "labels", s.Labels, map[string]string{"zone": "a"})
			},
		},
		{
			name:  "an identity at its session limit is refused",
			setup: []Command{OpenSession{Identity: "a", TTL: ttl, MaxPerIdentity: 2}, OpenSession{Identity: "a", TTL: ttl, MaxPerIdentity: 2}},
			cmd:   OpenSession{Identity: "a", TTL: ttl, MaxPerIdentity: 2},
			err:   ErrTooManySessions,
		},
		{
			name:  "the session limit counts only sessions of the same identity",
			setup: []Command{open("a"), open("a")},
			cmd:   OpenSession{Identity: "b", TTL: ttl, MaxPerIdentity: 2},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "sessions", len(m.Sessions()), 3)
			},
		},
		{
			name:  "a closed session gives its place back to its identity",
			setup: []Command{open("a"), open("a"), CloseSession{SessionID: 1}},
			cmd:   OpenSession{Identity: "a", TTL: ttl, MaxPerIdentity: 2},
		},
		{
			name:  "an expired session gives its place back to its identity",
			setup: []Command{open("a"), open("a"), expire(0, 2)},
			cmd:   OpenSession{Identity: "a", TTL: ttl, MaxPerIdentity: 2},
		},
		{
			name:  "a limit of zero means no limit",
			setup: []Command{open("a"), open("a"), open("a")},
			cmd:   OpenSession{Identity: "a", TTL: ttl},
		},
	})
}

func TestCloseSession(t *testing.T) {
	runCases(t, []machineCase{
		{
			name: "closing a session releases everything at once and grants the next waiters in the same apply",
			setup: []Command{
				open("a"), open("b"), open("c"), // sessions 1, 2, 3
				withDelay(acquire(1, leaseA)),               // token 4
				acquire(1, leaseB),                          // token 5
				wait(2, leaseA),                             // 6
				wait(3, leaseB),                             // 7
				Put{Key: "owner", Value: "a", SessionID: 1}, // 8
			},
			cmd: CloseSession{SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res,
					EventLeaseReleasedBy, EventLeaseReleasedBy, EventKeyDeleted,
					EventSessionClosed, EventLeaseAcquired, EventLeaseAcquired)
				expect(t, "released tokens", []int64{res.Events[0].Token, res.Events[1].Token}, []int64{4, 5})
				expect(t, "reason", res.Events[0].Reason, "session closed")
				expect(t, "lock-delay on a clean close", res.Events[0].LockDelay, int64(0))
				expect(t, "holders of a", holders(t, m, leaseA), []int64{2})
				expect(t, "tokens of a", tokens(t, m, leaseA), []int64{13})
				expect(t, "holders of b", holders(t, m, leaseB), []int64{3})
				expect(t, "tokens of b", tokens(t, m, leaseB), []int64{14})
				expect(t, "delay revision of a", mustLease(t, m, leaseA).DelayRevision, int64(0))
				expect(t, "waiters of a", waiters(t, m, leaseA), []int64(nil))
				expect(t, "keys", keys(m), []string(nil))
				_, ok := m.Session(1)
				expect(t, "session 1 found", ok, false)
				held, _, _ := m.SessionHoldings(2)
				expect(t, "held by 2", held, []LeaseID{leaseA})
			},
		},
		{
			name:  "closing a waiting session takes it out of the queue",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), wait(2, leaseA)},
			cmd:   CloseSession{SessionID: 2},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaitEnded, EventSessionClosed)
				expect(t, "wait-ended session", res.Events[0].SessionID, int64(2))
				expect(t, "waiters", waiters(t, m, leaseA), []int64(nil))
				expect(t, "holders", holders(t, m, leaseA), []int64{1})
			},
		},
		{
			name: "closing an unknown session fails",
			cmd:  CloseSession{SessionID: 7},
			err:  ErrSessionNotFound,
		},
		{
			name:  "closing a session twice fails the second time",
			setup: []Command{open("a"), CloseSession{SessionID: 1}},
			cmd:   CloseSession{SessionID: 1},
			err:   ErrSessionNotFound,
		},
	})
}

func TestExpireSessions(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "an expiry from an older epoch is ignored",
			setup: []Command{open("a"), NewEpoch{}},
			cmd:   expire(0, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				_, ok := m.Session(1)
				expect(t, "session 1 found", ok, true)
			},
		},
		{
			name:  "an expiry from a later epoch is ignored",
			setup: []Command{open("a")},
			cmd:   expire(1, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				_, ok := m.Session(1)
				expect(t, "session 1 found", ok, true)
			},
		},
		{
			name:  "an expiry with the current epoch ends the session and hands its lease to the next waiter",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), wait(2, leaseA), NewEpoch{}},
			cmd:   expire(1, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseExpired, EventSessionExpired, EventLeaseAcquired)
				expect(t, "expired token", res.Events[0].Token, int64(3))
				expect(t, "reason", res.Events[0].Reason, "session expired")
				expect(t, "lock-delay", res.Events[0].LockDelay, int64(0))
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
				expect(t, "tokens", tokens(t, m, leaseA), []int64{7})
			},
		},
		{
			name:  "an expiry starts a lock-delay when the lease has one, and no waiter is granted",
			setup: []Command{open("a"), open("b"), withDelay(acquire(1, leaseA)), wait(2, leaseA)},
			cmd:   expire(0, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseExpired, EventSessionExpired)
				expect(t, "event lock-delay", res.Events[0].LockDelay, lockDelay)
				l := mustLease(t, m, leaseA)
				expect(t, "delay revision", l.DelayRevision, int64(5))
				expect(t, "holders", holders(t, m, leaseA), []int64(nil))
				expect(t, "waiters", waiters(t, m, leaseA), []int64{2})
				expect(t, "delays", m.Deadlines().Delays, []LockDelay{{Lease: leaseA, Revision: 5, Delay: lockDelay}})
			},
		},
		{
			name:  "unknown session IDs in an expiry are skipped",
			setup: []Command{open("a"), open("b")},
			cmd:   expire(0, 9, 2, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventSessionExpired)
				expect(t, "expired session", res.Events[0].SessionID, int64(2))
				expect(t, "sessions", len(m.Sessions()), 1)
			},
		},
		{
			name:  "a waiter that expires leaves the queue and is never granted",
			setup: []Command{open("a"), open("b"), open("c"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA)},
			cmd:   expire(0, 2, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaitEnded, EventSessionExpired,
					EventLeaseExpired, EventSessionExpired, EventLeaseAcquired)
				expect(t, "granted session", res.Events[4].SessionID, int64(3))
				expect(t, "holders", holders(t, m, leaseA), []int64{3})
			},
		},
		{
			name:  "a waiter that expires in the same batch as the holder is never granted, whatever the order",
			setup: []Command{open("a"), open("b"), open("c"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA)},
			cmd:   expire(0, 1, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				for _, e := range res.Events {
					if e.Type == EventLeaseAcquired && e.SessionID != 3 {
						t.Errorf("grant in an expiry batch: got = session %d, expected: session 3 only", e.SessionID)
					}
				}
				expect(t, "holders", holders(t, m, leaseA), []int64{3})
				expect(t, "waiters", waiters(t, m, leaseA), []int64(nil))
			},
		},
		{
			name:  "an expiry of every holder of a semaphore starts the delay at the last of them",
			setup: []Command{open("a"), open("b"), withDelay(semaphore(1, leaseA, 2, false)), withDelay(semaphore(2, leaseA, 2, false))},
			cmd:   expire(0, 1, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseExpired, EventSessionExpired, EventLeaseExpired, EventSessionExpired)
				expect(t, "delays", m.Deadlines().Delays, []LockDelay{{Lease: leaseA, Revision: 7, Delay: lockDelay}})
			},
		},
	})
}

func TestSessionBoundKeys(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "a key bound to a session is deleted when the session closes",
			setup: []Command{open("a"), Put{Key: "k", Value: "v", SessionID: 1}, Put{Key: "other", Value: "v"}},
			cmd:   CloseSession{SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventKeyDeleted, EventSessionClosed)
				expect(t, "deleted key", res.Events[0].KV, &KeyValue{Key: "k", ModRevision: 4})
				expect(t, "deleted prev", res.Events[0].PrevKV.Value, "v")
				expect(t, "keys", keys(m), []string{"other"})
			},
		},
		{
			name:  "a key bound to a session is deleted when the session expires",
			setup: []Command{open("a"), Put{Key: "k", Value: "v", SessionID: 1}, Put{Key: "other", Value: "v"}},
			cmd:   expire(0, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventKeyDeleted, EventSessionExpired)
				expect(t, "keys", keys(m), []string{"other"})
			},
		},
		{
			name:  "a key rewritten without a session survives the session",
			setup: []Command{open("a"), Put{Key: "k", Value: "v", SessionID: 1}, Put{Key: "k", Value: "v2"}},
			cmd:   CloseSession{SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventSessionClosed)
				expect(t, "keys", keys(m), []string{"k"})
			},
		},
		{
			name:  "a key rebound to another session goes with the new session only",
			setup: []Command{open("a"), open("b"), Put{Key: "k", Value: "v", SessionID: 1}, Put{Key: "k", Value: "v2", SessionID: 2}},
			cmd:   CloseSession{SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventSessionClosed)
				_, _, n := m.SessionHoldings(2)
				expect(t, "keys bound to 2", n, 1)
				res = applyOK(t, m, cmdTime, CloseSession{SessionID: 2})
				expectEvents(t, res, EventKeyDeleted, EventSessionClosed)
				expect(t, "keys", keys(m), []string(nil))
			},
		},
	})
}

func withLeaseID(identity string, lease int64) OpenSession {
	return OpenSession{Identity: identity, TTL: ttl, LeaseID: lease}
}

func TestEtcdLeaseIDs(t *testing.T) {
	const alias2 = 2 | 1<<62
	runCases(t, []machineCase{
		{
			name:  "a chosen lease ID is kept, and the session answers to it alone",
			setup: []Command{v5},
			cmd:   withLeaseID("a", 100),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "Session.LeaseID", res.Session.LeaseID, int64(100))
				expect(t, "EtcdLeaseID", res.Session.EtcdLeaseID(), int64(100))
				s, ok := m.SessionByLease(100)
				expect(t, "SessionByLease(100)", [2]any{s.ID, ok}, [2]any{int64(1), true})
				_, ok = m.SessionByLease(1)
				expect(t, "SessionByLease of its session ID", ok, false)
				res = applyOK(t, m, 1, writes(leasedPut("k", "v", 100)))
				kv, _ := m.Key("k")
				expect(t, "key", kv, KeyValue{Key: "k", Value: "v", CreateRevision: 2, ModRevision: 2, Version: 1, SessionID: 1, LeaseID: 100})
				expect(t, "its etcd lease", kv.EtcdLease(), int64(100))
				expect(t, "SessionKeys", m.SessionKeys(1), []string{"k"})
			},
		},
		{
			name:  "a session opened without one answers to its ID",
			setup: []Command{v5},
			cmd:   open("a"),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "Session.LeaseID", res.Session.LeaseID, int64(0))
				expect(t, "EtcdLeaseID", res.Session.EtcdLeaseID(), int64(1))
				s, ok := m.SessionByLease(1)
				expect(t, "SessionByLease(1)", [2]any{s.ID, ok}, [2]any{int64(1), true})
			},
		},
		{
			name:  "a lease ID another session chose is refused",
			setup: []Command{v5, withLeaseID("a", 100)},
			cmd:   withLeaseID("b", 100),
			err:   ErrLeaseExists,
		},
		{
			name:  "a lease ID that is another session's own ID is refused",
			setup: []Command{v5, open("a")},
			cmd:   withLeaseID("b", 1),
			err:   ErrLeaseExists,
		},
		{
			name:  "a lease ID that is a native session's alias is refused",
			setup: []Command{v5, withLeaseID("a", 2), open("b")},
			cmd:   withLeaseID("c", alias2),
			err:   ErrLeaseExists,
		},
		{
			name:  "a negative lease ID is refused",
			setup: []Command{v5},
			cmd:   withLeaseID("a", -1),
			err:   ErrLeaseNotFound,
		},
		{
			name: "a chosen lease ID needs cluster version 5",
			cmd:  withLeaseID("a", 100),
			err:  ErrNotSupported,
		},
		{
			name:  "a lease ID is free again when its session ends",
			setup: []Command{v5, withLeaseID("a", 100), CloseSession{SessionID: 1}, withLeaseID("a", 200), expire(0, 3)},
			cmd:   withLeaseID("b", 100),
			check: func(t *testing.T, m *Machine, res Result) {
				_, ok := m.SessionByLease(200)
				expect(t, "SessionByLease of an expired session's lease", ok, false)
				expect(t, "leases taken", m.leaseIDs, map[int64]int64{100: 5})
			},
		},
		{
			name:  "a native session whose ID a client already chose answers to the first free ID above 2^62, until it ends",
			setup: []Command{v5, withLeaseID("a", 2), withLeaseID("a", 4)}, // 1, 2
			cmd:   open("b"),                                               // 3, whose ID is free
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "EtcdLeaseID of session 3", res.Session.EtcdLeaseID(), int64(3))
				res = applyOK(t, m, 1, open("c")) // 4
				expect(t, "EtcdLeaseID of session 4", res.Session.EtcdLeaseID(), int64(4|1<<62))
				res = applyOK(t, m, 1, withLeaseID("d", 5)) // 5 takes its own ID
				expect(t, "EtcdLeaseID of session 5", res.Session.EtcdLeaseID(), int64(5))

				s, _ := m.SessionByLease(4)
				expect(t, "SessionByLease(4)", s.ID, int64(2))
				s, _ = m.SessionByLease(4 | 1<<62)
				expect(t, "SessionByLease(4|2^62)", s.ID, int64(4))
				applyOK(t, m, 1, Put{Key: "k", SessionID: 4})
				kv, _ := m.Key("k")
				expect(t, "etcd lease of a key bound to session 4", kv.EtcdLease(), int64(4|1<<62))
				applyOK(t, m, 1, CloseSession{SessionID: 4})
				_, ok := m.SessionByLease(4 | 1<<62)
				expect(t, "an alias is gone with its session", ok, false)
				applyOK(t, m, 1, withLeaseID("e", 4|1<<62))
			},
		},
		{
			name:  "a native session takes the next alias when the first is taken",
			setup: []Command{v5, withLeaseID("a", 3), withLeaseID("a", 3|1<<62)}, // 1, 2
			cmd:   open("b"),                                                     // 3
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "EtcdLeaseID", res.Session.EtcdLeaseID(), int64(3|1<<62+1))
				s, _ := m.SessionByLease(3)
				expect(t, "SessionByLease(3)", s.ID, int64(1))
				s, _ = m.SessionByLease(3 | 1<<62 + 1)
				expect(t, "SessionByLease of the alias", s.ID, int64(3))
			},
		},
	})
}
