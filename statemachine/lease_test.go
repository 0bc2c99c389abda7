package statemachine

import (
	"strings"
	"testing"
)

func TestAcquire(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "a free lease is granted with the revision as its token",
			setup: []Command{open("a")},
			cmd:   Acquire{SessionID: 1, Lease: leaseA, Capacity: 1, Value: "10.0.0.1", Labels: map[string]string{"app": "x"}},
			check: func(t *testing.T, m *Machine, res Result) {
				expected := Grant{SessionID: 1, Holder: "a", Token: 2, AcquireTime: cmdTime, RenewTime: cmdTime, Value: "10.0.0.1"}
				expect(t, "grant", *res.Grant, expected)
				expect(t, "queued", res.Queued, false)
				expectEvents(t, res, EventLeaseAcquired)
				e := res.Events[0]
				expect(t, "event", [4]any{e.Token, e.SessionID, e.Holder, e.Value}, [4]any{int64(2), int64(1), "a", "10.0.0.1"})
				l := mustLease(t, m, leaseA)
				expect(t, "lease", l, Lease{
					LeaseID: leaseA, Capacity: 1, Holders: []Grant{expected},
					Labels: map[string]string{"app": "x"}, CreateRevision: 2, ModRevision: 2,
				})
				expect(t, "Result.Lease", *res.Lease, l)
				held, _, _ := m.SessionHoldings(1)
				expect(t, "held", held, []LeaseID{leaseA})
			},
		},
		{
			name:  "a capacity of zero means a mutex",
			setup: []Command{open("a")},
			cmd:   Acquire{SessionID: 1, Lease: leaseA},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "capacity", mustLease(t, m, leaseA).Capacity, 1)
			},
		},
		{
			name:  "a try on a held lease fails with ErrLocked and changes nothing",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA)},
			cmd:   acquire(2, leaseA),
			err:   ErrLocked,
			check: func(t *testing.T, m *Machine, res Result) {
				if !strings.Contains(res.Err.Error(), "held by a") {
					t.Errorf("error: got = %v, expected: it names the holder a", res.Err)
				}
			},
		},
		{
			name:  "a waiting acquire on a held lease is queued",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA)},
			cmd:   wait(2, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "queued", res.Queued, true)
				expect(t, "grant", res.Grant, (*Grant)(nil))
				expectEvents(t, res, EventLeaseWaiting)
				expect(t, "event session", res.Events[0].SessionID, int64(2))
				expect(t, "waiters", waiters(t, m, leaseA), []int64{2})
				expect(t, "Result.Lease waiters", len(res.Lease.Waiters), 1)
				_, waiting, _ := m.SessionHoldings(2)
				expect(t, "waiting", waiting, []LeaseID{leaseA})
			},
		},
		{
			name:  "re-acquiring a held lease returns the same grant without a new revision",
			setup: []Command{open("a"), acquire(1, leaseA), Put{Key: "k"}},
			cmd:   acquire(1, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "token", res.Grant.Token, int64(2))
				expect(t, "acquire time", res.Grant.AcquireTime, 2*setupTick)
				expectEvents(t, res)
				expect(t, "revision", res.Revision, int64(3))
			},
		},
		{
			name:  "re-acquiring while queued returns queued without a new revision",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), wait(2, leaseA)},
			cmd:   wait(2, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "queued", res.Queued, true)
				expectEvents(t, res)
				expect(t, "waiters", waiters(t, m, leaseA), []int64{2})
			},
		},
		{
			name:  "a semaphore gives each holder its own token",
			setup: []Command{open("a"), open("b"), semaphore(1, leaseA, 2, false)},
			cmd:   semaphore(2, leaseA, 2, false),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "token", res.Grant.Token, int64(4))
				expect(t, "tokens", tokens(t, m, leaseA), []int64{3, 4})
				expect(t, "holders", holders(t, m, leaseA), []int64{1, 2})
			},
		},
		{
			name:  "a full semaphore refuses a try",
			setup: []Command{open("a"), open("b"), open("c"), semaphore(1, leaseA, 2, false), semaphore(2, leaseA, 2, false)},
			cmd:   semaphore(3, leaseA, 2, false),
			err:   ErrLocked,
		},
		{
			name:  "a full semaphore queues a waiting acquire",
			setup: []Command{open("a"), open("b"), open("c"), semaphore(1, leaseA, 2, false), semaphore(2, leaseA, 2, false)},
			cmd:   semaphore(3, leaseA, 2, true),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "queued", res.Queued, true)
			},
		},
		{
			name:  "a capacity other than the lease's fails while the lease has holders",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA)},
			cmd:   semaphore(2, leaseA, 2, true),
			err:   ErrCapacityMismatch,
		},
		{
			name:  "an idle lease takes the capacity of the next acquire",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), release(leaseA, 3)},
			cmd:   semaphore(2, leaseA, 2, false),
			check: func(t *testing.T, m *Machine, res Result) {
				l := mustLease(t, m, leaseA)
				expect(t, "capacity", l.Capacity, 2)
				expect(t, "create revision", l.CreateRevision, int64(3))
			},
		},
		{
			name:  "a waiter beyond MaxWaiters is refused",
			setup: []Command{open("a"), open("b"), open("c"), acquire(1, leaseA), Acquire{SessionID: 2, Lease: leaseA, Wait: true, MaxWaiters: 1}},
			cmd:   Acquire{SessionID: 3, Lease: leaseA, Wait: true, MaxWaiters: 1},
			err:   ErrTooManyWaiters,
		},
		{
			name: "an acquire by an unknown session fails",
			cmd:  acquire(5, leaseA),
			err:  ErrSessionNotFound,
		},
		{
			name:  "transitions count the changes of holder",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), release(leaseA, 3), acquire(2, leaseA), release(leaseA, 5)},
			cmd:   acquire(1, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "transitions", mustLease(t, m, leaseA).Transitions, int64(2))
			},
		},
	})
}

func TestRelease(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "the holder's token releases the lease, which stays as a record",
			setup: []Command{open("a"), acquire(1, leaseA)},
			cmd:   release(leaseA, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseReleased)
				e := res.Events[0]
				expect(t, "event", [3]any{e.Token, e.SessionID, e.Reason}, [3]any{int64(2), int64(1), "released"})
				l := mustLease(t, m, leaseA)
				expect(t, "holders", len(l.Holders), 0)
				expect(t, "mod revision", l.ModRevision, int64(3))
				held, _, _ := m.SessionHoldings(1)
				expect(t, "held", held, []LeaseID(nil))
			},
		},
		{
			name:  "a stale token is rejected and cannot release the new holder's grant",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), release(leaseA, 3), acquire(2, leaseA)},
			cmd:   release(leaseA, 3),
			err:   ErrNotHolder,
			check: func(t *testing.T, m *Machine, res Result) {
				if !strings.Contains(res.Err.Error(), "current token 5") {
					t.Errorf("error: got = %v, expected: it names the current token 5", res.Err)
				}
			},
		},
		{
			name:  "a token of another lease is rejected",
			setup: []Command{open("a"), acquire(1, leaseA), acquire(1, leaseB)},
			cmd:   release(leaseB, 2),
			err:   ErrNotHolder,
		},
		{
			name:  "a token that was never granted is rejected",
			setup: []Command{open("a"), acquire(1, leaseA)},
			cmd:   release(leaseA, 0),
			err:   ErrNotHolder,
		},
		{
			name:  "a second release with the same token is rejected",
			setup: []Command{open("a"), acquire(1, leaseA), release(leaseA, 2)},
			cmd:   release(leaseA, 2),
			err:   ErrNotHolder,
		},
		{
			name: "releasing a lease that was never acquired fails",
			cmd:  release(leaseA, 1),
			err:  ErrLeaseNotFound,
		},
		{
			name:  "a release grants the head of the queue in the same apply",
			setup: []Command{open("a"), open("b"), open("c"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA)},
			cmd:   release(leaseA, 4),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseReleased, EventLeaseAcquired)
				expect(t, "granted", [2]int64{res.Events[1].SessionID, res.Events[1].Token}, [2]int64{2, 8})
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
				expect(t, "waiters", waiters(t, m, leaseA), []int64{3})
				expect(t, "transitions", mustLease(t, m, leaseA).Transitions, int64(1))
				held, waiting, _ := m.SessionHoldings(2)
				expect(t, "held by 2", held, []LeaseID{leaseA})
				expect(t, "waited by 2", waiting, []LeaseID(nil))
			},
		},
		{
			name: "a semaphore release grants one waiter only",
			setup: []Command{
				open("a"), open("b"), open("c"), open("d"),
				semaphore(1, leaseA, 2, false), semaphore(2, leaseA, 2, false), // tokens 5, 6
				semaphore(3, leaseA, 2, true), semaphore(4, leaseA, 2, true),
			},
			cmd: release(leaseA, 5),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseReleased, EventLeaseAcquired)
				expect(t, "tokens", tokens(t, m, leaseA), []int64{6, 10})
				expect(t, "holders", holders(t, m, leaseA), []int64{2, 3})
				expect(t, "waiters", waiters(t, m, leaseA), []int64{4})
			},
		},
		{
			name:  "a granted waiter holds the value it asked with",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), Acquire{SessionID: 2, Lease: leaseA, Wait: true, Value: "b-addr"}},
			cmd:   release(leaseA, 3),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "event value", res.Events[1].Value, "b-addr")
				expect(t, "grant value", mustLease(t, m, leaseA).Holders[0].Value, "b-addr")
			},
		},
	})
}

func TestSetValue(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "the holder's token sets the value",
			setup: []Command{open("a"), Acquire{SessionID: 1, Lease: leaseA, Value: "old"}},
			cmd:   SetValue{Lease: leaseA, Token: 2, Value: "new"},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseValueSet)
				e := res.Events[0]
				expect(t, "event", [3]any{e.Token, e.Value, e.SessionID}, [3]any{int64(2), "new", int64(1)})
				g := mustLease(t, m, leaseA).Holders[0]
				expect(t, "grant", g, Grant{SessionID: 1, Holder: "a", Token: 2, AcquireTime: 2 * setupTick, RenewTime: cmdTime, Value: "new"})
				expect(t, "mod revision", mustLease(t, m, leaseA).ModRevision, int64(3))
			},
		},
		{
			name:  "a stale token cannot set the value",
			setup: []Command{open("a"), acquire(1, leaseA), release(leaseA, 2), acquire(1, leaseA)},
			cmd:   SetValue{Lease: leaseA, Token: 2, Value: "x"},
			err:   ErrNotHolder,
		},
		{
			name: "setting the value of a lease that was never acquired fails",
			cmd:  SetValue{Lease: leaseA, Token: 2, Value: "x"},
			err:  ErrLeaseNotFound,
		},
	})
}

func TestRevoke(t *testing.T) {
	semaphoreOfTwo := []Command{open("a"), open("b"), semaphore(1, leaseA, 2, false), semaphore(2, leaseA, 2, false)}
	runCases(t, []machineCase{
		{
			name:  "revoking one token ends that grant only, with the reason in the event",
			setup: semaphoreOfTwo,
			cmd:   Revoke{Lease: leaseA, Token: 4, Reason: "operator"},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseRevoked)
				expect(t, "event", [3]any{res.Events[0].Token, res.Events[0].SessionID, res.Events[0].Reason}, [3]any{int64(4), int64(2), "operator"})
				expect(t, "revoked", res.Revoked, []int64{4})
				expect(t, "holders", holders(t, m, leaseA), []int64{1})
				held, _, _ := m.SessionHoldings(2)
				expect(t, "held by 2", held, []LeaseID(nil))
			},
		},
		{
			name:  "revoking without a token ends every grant",
			setup: semaphoreOfTwo,
			cmd:   Revoke{Lease: leaseA, Reason: "drain"},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseRevoked, EventLeaseRevoked)
				expect(t, "reasons", [2]string{res.Events[0].Reason, res.Events[1].Reason}, [2]string{"drain", "drain"})
				expect(t, "revoked", res.Revoked, []int64{3, 4})
				expect(t, "holders", holders(t, m, leaseA), []int64(nil))
			},
		},
		{
			name:  "a revoke without a reason says revoked",
			setup: semaphoreOfTwo,
			cmd:   Revoke{Lease: leaseA, Token: 3},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "reason", res.Events[0].Reason, "revoked")
			},
		},
		{
			name:  "a revoke grants the waiters at once when the lease has no lock-delay",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), wait(2, leaseA)},
			cmd:   Revoke{Lease: leaseA, Reason: "operator"},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseRevoked, EventLeaseAcquired)
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
				expect(t, "delay revision", mustLease(t, m, leaseA).DelayRevision, int64(0))
			},
		},
		{
			name:  "a revoke starts the lease's lock-delay, since the revoked holder may still be working",
			setup: []Command{open("a"), open("b"), withDelay(acquire(1, leaseA)), wait(2, leaseA)},
			cmd:   Revoke{Lease: leaseA, Reason: "operator"},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseRevoked)
				expect(t, "holders", holders(t, m, leaseA), []int64(nil))
				expect(t, "delay revision", mustLease(t, m, leaseA).DelayRevision, res.Events[0].Revision)
				expect(t, "event lock delay", res.Events[0].LockDelay, lockDelay)
			},
		},
		{
			name:  "a revoke with a stale token fails",
			setup: []Command{open("a"), acquire(1, leaseA), release(leaseA, 2), acquire(1, leaseA)},
			cmd:   Revoke{Lease: leaseA, Token: 2},
			err:   ErrNotHolder,
		},
		{
			name:  "revoking every grant of a lease without holders fails",
			setup: []Command{open("a"), acquire(1, leaseA), release(leaseA, 2)},
			cmd:   Revoke{Lease: leaseA},
			err:   ErrNotHolder,
		},
		{
			name: "revoking a lease that was never acquired fails",
			cmd:  Revoke{Lease: leaseA},
			err:  ErrLeaseNotFound,
		},
	})
}

func TestCancelWait(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "cancelling a wait takes the session out of the queue",
			setup: []Command{open("a"), open("b"), open("c"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA)},
			cmd:   CancelWait{SessionID: 2, Lease: leaseA},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaitEnded)
				expect(t, "reason", res.Events[0].Reason, "wait cancelled")
				expect(t, "waiters", waiters(t, m, leaseA), []int64{3})
				_, waiting, _ := m.SessionHoldings(2)
				expect(t, "waited by 2", waiting, []LeaseID(nil))
				expect(t, "grant", res.Grant, (*Grant)(nil))
			},
		},
		{
			name:  "cancelling after a grant keeps the grant and returns it",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), wait(2, leaseA), release(leaseA, 3)},
			cmd:   CancelWait{SessionID: 2, Lease: leaseA},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				expect(t, "grant token", res.Grant.Token, int64(6))
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
			},
		},
		{
			name:  "cancelling after a grant with ReleaseIfHeld releases it and grants the next waiter",
			setup: []Command{open("a"), open("b"), open("c"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA), release(leaseA, 4)},
			cmd:   CancelWait{SessionID: 2, Lease: leaseA, ReleaseIfHeld: true},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseReleased, EventLeaseAcquired)
				expect(t, "released token", res.Events[0].Token, int64(8))
				expect(t, "reason", res.Events[0].Reason, "wait cancelled")
				expect(t, "holders", holders(t, m, leaseA), []int64{3})
				expect(t, "grant", res.Grant, (*Grant)(nil))
			},
		},
		{
			name:  "cancelling for a session that neither waits nor holds fails",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA)},
			cmd:   CancelWait{SessionID: 2, Lease: leaseA, ReleaseIfHeld: true},
			err:   ErrNotWaiting,
		},
		{
			name:  "cancelling for an unknown session fails",
			setup: []Command{open("a"), acquire(1, leaseA)},
			cmd:   CancelWait{SessionID: 9, Lease: leaseA},
			err:   ErrSessionNotFound,
		},
		{
			name:  "cancelling on a lease that was never acquired fails",
			setup: []Command{open("a")},
			cmd:   CancelWait{SessionID: 1, Lease: leaseA},
			err:   ErrLeaseNotFound,
		},
	})
}

func TestLockDelay(t *testing.T) {
	// Session 1 holds a with a lock-delay, 2 waits, 1 expires at revision 5.
	delayed := []Command{open("a"), open("b"), withDelay(acquire(1, leaseA)), wait(2, leaseA), expire(0, 1)}
	runCases(t, []machineCase{
		{
			name:  "ending a lock-delay with its revision grants the head waiter",
			setup: delayed,
			cmd:   EndLockDelays{Epoch: 0, Delays: []LockDelay{{Lease: leaseA, Revision: 5}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLockDelayEnded, EventLeaseAcquired)
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
				expect(t, "tokens", tokens(t, m, leaseA), []int64{8})
				expect(t, "delay revision", mustLease(t, m, leaseA).DelayRevision, int64(0))
				expect(t, "delays", m.Deadlines().Delays, []LockDelay(nil))
			},
		},
		{
			name:  "ending a lock-delay with the wrong revision is ignored",
			setup: delayed,
			cmd:   EndLockDelays{Epoch: 0, Delays: []LockDelay{{Lease: leaseA, Revision: 6}, {Lease: leaseB, Revision: 5}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				expect(t, "delay revision", mustLease(t, m, leaseA).DelayRevision, int64(5))
				expect(t, "waiters", waiters(t, m, leaseA), []int64{2})
			},
		},
		{
			name:  "ending a lock-delay from an older epoch is ignored",
			setup: append(append([]Command{}, delayed...), NewEpoch{}),
			cmd:   EndLockDelays{Epoch: 0, Delays: []LockDelay{{Lease: leaseA, Revision: 5}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				expect(t, "delay revision", mustLease(t, m, leaseA).DelayRevision, int64(5))
			},
		},
		{
			name:  "a try during a lock-delay fails with ErrLocked",
			setup: append(append([]Command{}, delayed...), open("c")),
			cmd:   acquire(7, leaseA),
			err:   ErrLocked,
			check: func(t *testing.T, m *Machine, res Result) {
				if !strings.Contains(res.Err.Error(), "lock-delay") {
					t.Errorf("error: got = %v, expected: it names the lock-delay", res.Err)
				}
			},
		},
		{
			name:  "a waiting acquire during a lock-delay queues behind the waiters",
			setup: append(append([]Command{}, delayed...), open("c")),
			cmd:   wait(7, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "queued", res.Queued, true)
				expect(t, "waiters", waiters(t, m, leaseA), []int64{2, 7})
			},
		},
		{
			name: "a lease is free again after its lock-delay ends",
			setup: []Command{
				open("a"), withDelay(acquire(1, leaseA)), expire(0, 1), // delay at 3
				EndLockDelays{Delays: []LockDelay{{Lease: leaseA, Revision: 3}}}, open("b"),
			},
			cmd: acquire(6, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "token", res.Grant.Token, int64(7))
			},
		},
		{
			name: "an idle lease in its lock-delay takes the capacity of the first waiting acquire",
			setup: []Command{
				open("a"), withDelay(acquire(1, leaseA)), expire(0, 1), // delay at 3
				open("b"), open("c"), semaphore(5, leaseA, 2, true),
			},
			cmd: semaphore(6, leaseA, 2, true),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "queued", res.Queued, true)
				expect(t, "capacity", mustLease(t, m, leaseA).Capacity, 2)
				res = applyOK(t, m, cmdTime, EndLockDelays{Delays: []LockDelay{{Lease: leaseA, Revision: 3}}})
				expectEvents(t, res, EventLockDelayEnded, EventLeaseAcquired, EventLeaseAcquired)
				expect(t, "holders", holders(t, m, leaseA), []int64{5, 6})
			},
		},
		{
			name: "a semaphore keeps its other holder through a lock-delay but grants no waiter",
			setup: []Command{
				open("a"), open("b"), open("c"),
				withDelay(semaphore(1, leaseA, 2, false)), withDelay(semaphore(2, leaseA, 2, false)), // tokens 4, 5
				semaphore(3, leaseA, 2, true),
			},
			cmd: expire(0, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseExpired, EventSessionExpired)
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
				expect(t, "waiters", waiters(t, m, leaseA), []int64{3})
			},
		},
	})
}
