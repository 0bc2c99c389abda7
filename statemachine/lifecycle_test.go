package statemachine

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// v2 is the cluster version the lifecycle commands need.
var v2 = SetVersion{Version: 2}

func collectable(a Acquire) Acquire {
	a.GCAfter = gcAfter
	return a
}

func TestRecordsOutliveTheirHolder(t *testing.T) {
	runCases(t, []machineCase{
		{
			name:  "a release keeps the last holder and says it was released",
			setup: []Command{open("a"), acquire(1, leaseA)},
			cmd:   release(leaseA, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "last", *mustLease(t, m, leaseA).Last, EndedGrant{
					SessionID: 1, Holder: "a", Token: 2, AcquireTime: 2 * setupTick,
					RenewTime: cmdTime, EndTime: cmdTime, Ended: EndReleased, Reason: "released",
				})
			},
		},
		{
			name:  "an expiry keeps the last heartbeat the leader saw as the renew time",
			setup: []Command{open("a"), acquire(1, leaseA), NewEpoch{}},
			cmd:   ExpireSessions{Epoch: 1, IDs: []int64{1}, Renewed: []int64{cmdTime - 500}},
			check: func(t *testing.T, m *Machine, res Result) {
				last := mustLease(t, m, leaseA).Last
				expect(t, "ended", last.Ended, EndExpired)
				expect(t, "renew time", last.RenewTime, cmdTime-500)
				expect(t, "end time", last.EndTime, cmdTime)
				expect(t, "holder", last.Holder, "a")
			},
		},
		{
			name:  "an expiry keeps the session's last renewal even when it came before the grant",
			setup: []Command{open("a"), acquire(1, leaseA), NewEpoch{}},
			cmd:   ExpireSessions{Epoch: 1, IDs: []int64{1}, Renewed: []int64{setupTick}},
			check: func(t *testing.T, m *Machine, res Result) {
				// Opened at setupTick and never heard from again: the
				// expiry was timed from then, not from the grant.
				expect(t, "renew time", mustLease(t, m, leaseA).Last.RenewTime, setupTick)
			},
		},
		{
			name:  "an expiry the leader never heard about keeps the logged renew time",
			setup: []Command{open("a"), acquire(1, leaseA), NewEpoch{}},
			cmd:   expire(1, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "renew time", mustLease(t, m, leaseA).Last.RenewTime, 2*setupTick)
			},
		},
		{
			name:  "a revoke says revoked, with its reason",
			setup: []Command{open("a"), acquire(1, leaseA)},
			cmd:   Revoke{Lease: leaseA, Reason: "stuck"},
			check: func(t *testing.T, m *Machine, res Result) {
				last := mustLease(t, m, leaseA).Last
				expect(t, "ended", [2]any{last.Ended, last.Reason}, [2]any{EndRevoked, "stuck"})
			},
		},
		{
			name:  "closing the session is a release",
			setup: []Command{open("a"), acquire(1, leaseA)},
			cmd:   CloseSession{SessionID: 1},
			check: func(t *testing.T, m *Machine, res Result) {
				last := mustLease(t, m, leaseA).Last
				expect(t, "ended", [2]any{last.Ended, last.Reason}, [2]any{EndReleased, "session closed"})
			},
		},
		{
			name:  "a new grant leaves the last ended one on the record",
			setup: []Command{open("a"), open("b"), acquire(1, leaseA), wait(2, leaseA)},
			cmd:   release(leaseA, 3),
			check: func(t *testing.T, m *Machine, res Result) {
				l := mustLease(t, m, leaseA)
				expect(t, "holder", l.Holders[0].Holder, "b")
				expect(t, "last", [2]any{l.Last.Holder, l.Last.Token}, [2]any{"a", int64(3)})
			},
		},
	})
}

func TestGarbageCollection(t *testing.T) {
	idle := func(m *Machine) []IdleLease { return m.Deadlines().Idle }
	runCases(t, []machineCase{
		{
			name:  "a release that leaves a lease idle dates it and tells the lessor",
			setup: []Command{v2, open("a"), collectable(acquire(1, leaseA))},
			cmd:   release(leaseA, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "gc_after on the event", res.Events[0].GCAfter, gcAfter)
				expect(t, "idle since", mustLease(t, m, leaseA).IdleSince, cmdTime)
				expect(t, "deadlines", idle(m), []IdleLease{{Lease: leaseA, Revision: 3, GCAfter: gcAfter, IdleSince: cmdTime}})
			},
		},
		{
			name:  "a release that grants a waiter leaves nothing to collect",
			setup: []Command{v2, open("a"), open("b"), collectable(acquire(1, leaseA)), collectable(wait(2, leaseA))},
			cmd:   release(leaseA, 3),
			check: func(t *testing.T, m *Machine, res Result) {
				for _, e := range res.Events {
					expect(t, "gc_after on "+e.Type.String(), e.GCAfter, int64(0))
				}
				expect(t, "deadlines", idle(m), []IdleLease(nil))
			},
		},
		{
			name:  "a lease without gc_after is kept forever",
			setup: []Command{v2, open("a"), acquire(1, leaseA)},
			cmd:   release(leaseA, 2),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "gc_after", res.Events[0].GCAfter, int64(0))
				expect(t, "deadlines", idle(m), []IdleLease(nil))
			},
		},
		{
			name:  "an expiry in a lock-delay is not idle until the delay ends",
			setup: []Command{v2, open("a"), collectable(withDelay(acquire(1, leaseA))), NewEpoch{}},
			cmd:   expire(1, 1),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "deadlines", idle(m), []IdleLease(nil))
				res = applyOK(t, m, cmdTime+1, EndLockDelays{Epoch: 1, Delays: m.Deadlines().Delays})
				expect(t, "gc_after", res.Events[0].GCAfter, gcAfter)
				expect(t, "idle", len(idle(m)), 1)
			},
		},
		{
			name:  "a collection deletes an idle lease and emits deleted",
			setup: []Command{v2, open("a"), collectable(acquire(1, leaseA)), release(leaseA, 2), NewEpoch{}},
			cmd:   CollectLeases{Epoch: 1, Leases: []IdleLease{{Lease: leaseA, Revision: 3}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseDeleted)
				e := res.Events[0]
				expect(t, "event", [3]any{e.Lease, e.Holder, e.Token}, [3]any{leaseA, "a", int64(2)})
				if _, ok := m.Lease(leaseA); ok {
					t.Fatalf("lease: got = still there, expected: deleted")
				}
				expect(t, "deadlines", idle(m), []IdleLease(nil))
			},
		},
		{
			name: "a collection never deletes a held lease, one with waiters, or one changed since",
			setup: []Command{
				v2, open("a"), open("b"), NewEpoch{},
				collectable(acquire(1, leaseA)), collectable(wait(2, leaseA)), // A held, with a waiter
				collectable(acquire(1, leaseB)), release(leaseB, 5), // B idle at 6
				SetPreferred{Lease: leaseB, Identity: "x"}, // B changed at 7
			},
			cmd: CollectLeases{Epoch: 1, Leases: []IdleLease{{Lease: leaseA, Revision: 4}, {Lease: leaseA, Revision: 3}, {Lease: leaseB, Revision: 6}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				mustLease(t, m, leaseA)
				mustLease(t, m, leaseB)
			},
		},
		{
			name:  "a cluster at version 1 collects nothing",
			setup: []Command{open("a"), collectable(acquire(1, leaseA)), release(leaseA, 2), NewEpoch{}},
			cmd:   CollectLeases{Epoch: 1, Leases: []IdleLease{{Lease: leaseA, Revision: 3}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				mustLease(t, m, leaseA)
			},
		},
		{
			name:  "a collection of an earlier epoch is ignored",
			setup: []Command{v2, open("a"), collectable(acquire(1, leaseA)), release(leaseA, 2), NewEpoch{}, NewEpoch{}},
			cmd:   CollectLeases{Epoch: 1, Leases: []IdleLease{{Lease: leaseA, Revision: 3}}},
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
				mustLease(t, m, leaseA)
			},
		},
		{
			name: "a lease deleted and acquired again gets a new, higher token",
			setup: []Command{
				v2, open("a"), collectable(acquire(1, leaseA)), release(leaseA, 2), NewEpoch{},
				CollectLeases{Epoch: 1, Leases: []IdleLease{{Lease: leaseA, Revision: 3}}},
			},
			cmd: collectable(acquire(1, leaseA)),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "token", res.Grant.Token, int64(5))
				l := mustLease(t, m, leaseA)
				expect(t, "fresh record", [3]any{l.CreateRevision, l.Transitions, l.Last}, [3]any{int64(5), int64(0), (*EndedGrant)(nil)})
			},
		},
	})

	t.Run("a snapshot keeps what dates a collection", func(t *testing.T) {
		m := New()
		for i, c := range []Command{open("a"), collectable(acquire(1, leaseA)), release(leaseA, 2)} {
			applyOK(t, m, int64(i+1)*setupTick, c)
		}
		restored := New()
		if err := restored.Restore(bytes.NewReader(snapshotBytes(t, m))); err != nil {
			t.Fatal(err)
		}
		expect(t, "deadlines", restored.Deadlines().Idle, m.Deadlines().Idle)
		expect(t, "idle since", restored.Deadlines().Idle[0].IdleSince, 3*setupTick)
	})
}

func TestPreferredHolder(t *testing.T) {
	pref := func(identity string) SetPreferred { return SetPreferred{Lease: leaseA, Identity: identity} }
	runCases(t, []machineCase{
		{
			name:  "naming a waiting identity asks the holder to step down, and takes nothing from it",
			setup: []Command{v2, open("a"), open("p"), acquire(1, leaseA), wait(2, leaseA)},
			cmd:   pref("p"),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeasePreferred, EventLeaseStepDown)
				e := res.Events[1]
				expect(t, "asked", [3]any{e.SessionID, e.Token, e.Holder}, [3]any{int64(1), int64(3), "a"})
				if !strings.Contains(e.Reason, "preferred holder p") {
					t.Errorf("reason: got = %q, expected: it names the preferred holder", e.Reason)
				}
				expect(t, "holders", holders(t, m, leaseA), []int64{1})
				expect(t, "step down on the grant", mustLease(t, m, leaseA).Holders[0].StepDown, e.Reason)
			},
		},
		{
			name:  "the preferred identity arriving asks the holder to step down",
			setup: []Command{v2, open("a"), open("p"), acquire(1, leaseA), pref("p")},
			cmd:   wait(2, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaiting, EventLeaseStepDown)
			},
		},
		{
			name:  "a holder is asked once",
			setup: []Command{v2, open("a"), open("p"), open("p"), acquire(1, leaseA), pref("p"), wait(2, leaseA)},
			cmd:   wait(3, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaiting)
			},
		},
		{
			name:  "the preferred waiter is granted ahead of the queue",
			setup: []Command{v2, open("a"), open("b"), open("p"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA), pref("p")},
			cmd:   release(leaseA, 4),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "holders", holders(t, m, leaseA), []int64{3})
				expect(t, "waiters", waiters(t, m, leaseA), []int64{2})
			},
		},
		{
			name:  "a holder with the preferred identity is not asked to make way for itself",
			setup: []Command{v2, open("p"), open("p"), acquire(1, leaseA), pref("p")},
			cmd:   wait(2, leaseA),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaiting)
			},
		},
		{
			name:  "in a semaphore only as many holders as must go are asked, oldest first",
			setup: []Command{v2, open("a"), open("b"), open("p"), semaphore(1, leaseA, 2, false), semaphore(2, leaseA, 2, false), pref("p")},
			cmd:   semaphore(3, leaseA, 2, true),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseWaiting, EventLeaseStepDown)
				expect(t, "asked", res.Events[1].SessionID, int64(1))
			},
		},
		{
			name:  "clearing the preference lets the queue's head go first again",
			setup: []Command{v2, open("a"), open("b"), open("p"), acquire(1, leaseA), wait(2, leaseA), wait(3, leaseA), pref("p"), pref("")},
			cmd:   release(leaseA, 4),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "holders", holders(t, m, leaseA), []int64{2})
			},
		},
		{
			name:  "setting the same preference again changes nothing",
			setup: []Command{v2, open("a"), acquire(1, leaseA), pref("p")},
			cmd:   pref("p"),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res)
			},
		},
		{
			name:  "an unknown lease cannot be given a preference",
			setup: []Command{v2},
			cmd:   pref("p"),
			err:   ErrLeaseNotFound,
		},
	})

	// Before every member runs version 2, an older replica would grant in
	// FIFO order where this one grants the preferred waiter.
	runCases(t, []machineCase{{
		name:  "a cluster at version 1 refuses a preference",
		setup: []Command{open("a"), acquire(1, leaseA)},
		cmd:   pref("p"),
		err:   ErrNotSupported,
	}})
}

func TestMaxHold(t *testing.T) {
	v3 := SetVersion{Version: 3}
	ask := func(token int64) AskStepDown { return AskStepDown{Lease: leaseA, Token: token, Reason: "max-hold"} }
	withMaxHold := func(a Acquire) Acquire {
		a.MaxHold = ttl
		return a
	}
	runCases(t, []machineCase{
		{
			name:  "a grant records its max hold, a waiter's too once granted",
			setup: []Command{open("a"), open("b"), withMaxHold(acquire(1, leaseA)), wait(2, leaseA)},
			cmd:   release(leaseA, 3),
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "waiter's grant max hold", mustLease(t, m, leaseA).Holders[0].MaxHold, int64(0))
				m2 := New()
				for i, c := range []Command{open("a"), open("b"), acquire(1, leaseA), withMaxHold(wait(2, leaseA)), release(leaseA, 3)} {
					applyOK(t, m2, int64(i+1)*setupTick, c)
				}
				expect(t, "max hold the waiter asked for", mustLease(t, m2, leaseA).Holders[0].MaxHold, ttl)
			},
		},
		{
			name:  "asking a holder to step down marks its grant once and takes nothing",
			setup: []Command{v3, open("a"), withMaxHold(acquire(1, leaseA))},
			cmd:   ask(2),
			check: func(t *testing.T, m *Machine, res Result) {
				expectEvents(t, res, EventLeaseStepDown)
				expect(t, "reason", res.Events[0].Reason, "max-hold")
				expect(t, "holders", holders(t, m, leaseA), []int64{1})
				res = applyOK(t, m, cmdTime+1, ask(2))
				expectEvents(t, res)
			},
		},
		{
			name:  "a stale token is not a holder's",
			setup: []Command{v3, open("a"), acquire(1, leaseA), release(leaseA, 2), acquire(1, leaseA)},
			cmd:   ask(2),
			err:   ErrNotHolder,
		},
		{
			name:  "a cluster before version 3 refuses it",
			setup: []Command{v2, open("a"), acquire(1, leaseA)},
			cmd:   ask(2),
			err:   ErrNotSupported,
		},
	})
}

func TestWaiterLeavingTheHead(t *testing.T) {
	// Capacity 2: a holds a place; b waits for the lease alone, and c,
	// which would fit, waits behind b.
	setup := []Command{open("a"), open("b"), open("c"),
		semaphore(1, leaseA, 2, false),
		Acquire{SessionID: 2, Lease: leaseA, Capacity: 2, Wait: true, Exclusive: true},
		semaphore(3, leaseA, 2, true)}
	for _, end := range []Command{CancelWait{SessionID: 2, Lease: leaseA}, CloseSession{SessionID: 2}} {
		runCases(t, []machineCase{
			{
				name:  fmt.Sprintf("at version 2, %T of the head lets the next waiter in", end),
				setup: append([]Command{v2}, setup...),
				cmd:   end,
				check: func(t *testing.T, m *Machine, res Result) {
					expect(t, "holders", holders(t, m, leaseA), []int64{1, 3})
				},
			},
			{
				name:  fmt.Sprintf("at version 1, %T of the head leaves the next waiter waiting, as older builds do", end),
				setup: setup,
				cmd:   end,
				check: func(t *testing.T, m *Machine, res Result) {
					expect(t, "holders", holders(t, m, leaseA), []int64{1})
				},
			},
		})
	}
}
