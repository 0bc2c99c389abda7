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
