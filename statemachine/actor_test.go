package statemachine

import (
	"errors"
	"testing"
)

// The actors of these tests: team-a's principal may act as "a" and "a/*";
// team-b's as "b"; the admin may break in.
var (
	teamA = &Actor{Principal: "team-a", Identities: []string{"a", "a/*"}}
	teamB = &Actor{Principal: "team-b", Identities: []string{"b"}}
	admin = &Actor{Principal: "root", Breaker: true}
	v4    = SetVersion{Version: 4}
)

// In most cases below session 1 (identity "a") holds lease a with token
// 2: SetVersion leaves the revision alone, so the Open is revision 1 and
// the grant revision 2.
func TestOnlyTheOwnerActsDecidedWhereItIsApplied(t *testing.T) {
	owned := []Command{v4, open("a"), acquire(1, leaseA)}
	runCases(t, []machineCase{
		{name: "another principal's acquire for the session is refused", setup: owned,
			cmd: Acquire{SessionID: 1, Lease: leaseB, Capacity: 1, Actor: teamB}, err: ErrNotOwner},
		{name: "the owner's acquire goes through", setup: owned,
			cmd: Acquire{SessionID: 1, Lease: leaseB, Capacity: 1, Actor: teamA},
			check: func(t *testing.T, m *Machine, res Result) {
				expect(t, "holders of b", holders(t, m, leaseB), []int64{1})
			}},
		{name: "an identity under a granted pattern is the owner's", setup: []Command{v4, open("a/worker-1")},
			cmd: Acquire{SessionID: 1, Lease: leaseA, Capacity: 1, Actor: teamA}},
		{name: "another principal's release of the grant is refused", setup: owned,
			cmd: Release{Lease: leaseA, Token: 2, Actor: teamB}, err: ErrNotOwner},
		{name: "an admin may break a grant", setup: owned,
			cmd: Release{Lease: leaseA, Token: 2, Actor: admin}},
		{name: "another principal may not set the grant's value", setup: owned,
			cmd: SetValue{Lease: leaseA, Token: 2, Value: "x", Actor: teamB}, err: ErrNotOwner},
		{name: "an admin may not set the grant's value either", setup: owned,
			cmd: SetValue{Lease: leaseA, Token: 2, Value: "x", Actor: admin}, err: ErrNotOwner},
		{name: "another principal may not close the session", setup: owned,
			cmd: CloseSession{SessionID: 1, Actor: teamB}, err: ErrNotOwner},
		{name: "an admin may close any session", setup: owned,
			cmd: CloseSession{SessionID: 1, Actor: admin}},
		{name: "an admin may not acquire as the session", setup: owned,
			cmd: Acquire{SessionID: 1, Lease: leaseB, Capacity: 1, Actor: admin}, err: ErrNotOwner},
		{name: "another principal may not bind a key to the session", setup: owned,
			cmd: Put{Key: "k", Value: "v", SessionID: 1, Actor: teamB}, err: ErrNotOwner},
		{name: "another principal's compare-and-swap may not bind a key to the session", setup: owned,
			cmd: CompareAndSwap{Key: "k", Target: CompareAbsent, NewValue: "v", SessionID: 1, Actor: teamB}, err: ErrNotOwner},
		{name: "a refused compare-and-swap says nothing of the key", setup: append(owned, Put{Key: "k", Value: "secret"}),
			cmd: CompareAndSwap{Key: "k", Target: CompareValue, Value: "guess", NewValue: "v", SessionID: 1, Actor: teamB}, err: ErrNotOwner,
			check: func(t *testing.T, m *Machine, res Result) {
				if res.KV != nil {
					t.Errorf("KV of a refused compare-and-swap: got = %+v, expected: nil", res.KV)
				}
			}},
		{name: "another principal may not cancel the session's wait", setup: []Command{v4, open("a"), open("c"), acquire(2, leaseA), wait(1, leaseA)},
			cmd: CancelWait{SessionID: 1, Lease: leaseA, Actor: teamB}, err: ErrNotOwner},
		{name: "a node acting for itself is not checked", setup: owned,
			cmd: Release{Lease: leaseA, Token: 2}},
		{name: "before cluster version 4 no replica checks, so that none applies differently", setup: []Command{open("a"), acquire(1, leaseA)},
			cmd: Release{Lease: leaseA, Token: 2, Actor: teamB}},
	})
}

// The attack of issue 21: a principal aims a command at the next
// revision before the session that will have that ID exists. Checked at
// apply time, the command meets the session as it is then, and fails.
func TestACommandAimedAtAFutureSessionIDMeetsItsOwnerAtApply(t *testing.T) {
	m := New()
	applyOK(t, m, 1, v4)
	next := m.Revision() + 1
	// The attacker's check at the edge would have seen no session next;
	// the victim's Open is ordered first in the log.
	applyOK(t, m, 2, open("a"))
	for _, cmd := range []Command{
		CloseSession{SessionID: next, Actor: teamB},
		Acquire{SessionID: next, Lease: leaseA, Capacity: 1, Actor: teamB},
		Put{Key: "k", SessionID: next, Actor: teamB},
	} {
		if res := m.Apply(3, cmd); res.Err == nil || !isNotOwner(res.Err) {
			t.Errorf("%T on the victim's session: got = %v, expected: %v", cmd, res.Err, ErrNotOwner)
		}
	}
	if _, ok := m.Session(next); !ok {
		t.Fatalf("the victim's session %d: got = closed, expected: open", next)
	}
	// And the victim's own grant, the next revision again.
	tok := m.Revision() + 1
	applyOK(t, m, 4, Acquire{SessionID: next, Lease: leaseA, Capacity: 1, Actor: teamA})
	if res := m.Apply(5, Release{Lease: leaseA, Token: tok, Actor: teamB}); !isNotOwner(res.Err) {
		t.Errorf("Release of the victim's grant: got = %v, expected: %v", res.Err, ErrNotOwner)
	}
	expect(t, "tokens of a", tokens(t, m, leaseA), []int64{tok})
}

func isNotOwner(err error) bool { return errors.Is(err, ErrNotOwner) }

// The actor travels in the log entry: every command that acts on a
// session or grant carries it through Encode and Decode, and a command
// that acts on neither is left as it is.
func TestTheActorIsWrittenToTheLogWithItsCommand(t *testing.T) {
	for _, cmd := range []Command{
		CloseSession{SessionID: 1}, acquire(1, leaseA), release(leaseA, 2), SetValue{Lease: leaseA, Token: 2},
		CancelWait{SessionID: 1, Lease: leaseA}, Put{Key: "k", SessionID: 1}, CompareAndSwap{Key: "k", SessionID: 1},
	} {
		data, err := Encode(1, WithActor(cmd, teamA))
		if err != nil {
			t.Fatal(err)
		}
		_, back, err := Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if a := ActorOf(back); a == nil || a.Principal != teamA.Principal || len(a.Identities) != len(teamA.Identities) {
			t.Errorf("%T's actor after the log: got = %+v, expected: %+v", cmd, a, teamA)
		}
	}
	if cmd := WithActor(Revoke{Lease: leaseA}, teamA); ActorOf(cmd) != nil {
		t.Errorf("Revoke with an actor: got = %+v, expected: no actor (it acts as an admin, not as an owner)", ActorOf(cmd))
	}
}
