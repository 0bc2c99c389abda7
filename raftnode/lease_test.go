package raftnode

import (
	"testing"
	"time"
)

// leaseTick is the tick of the leases the pure tests step: a second's
// election timeout, the simulator's.
const leaseTick = 100 * time.Millisecond

// newTestLease is a lease on leaseTick, and the time d after it was made.
func newTestLease() (*LeaderLease, func(d time.Duration) time.Time) {
	t0 := time.Now()
	return NewLeaderLease(leaseTick, t0), func(d time.Duration) time.Time { return t0.Add(d) }
}

// The lease is the round's start plus three ticks short of the election
// timeout, in the term it was begun, and nothing else extends it.
func TestTheLeaderLeaseHoldsFromAConfirmedRoundsStart(t *testing.T) {
	t.Parallel()
	l, at := newTestLease()
	t0 := at(0)
	if l.Held(t0) {
		t.Fatal("got = held before any round, expected: not held")
	}
	if !l.Due(t0) {
		t.Fatal("got = not due without a lease, expected: due")
	}

	l.Begin(1, 5, at(10*time.Millisecond))
	if l.Due(at(50 * time.Millisecond)) {
		t.Fatal("got = due again within a tick of the last round, expected: not due")
	}
	if l.Held(at(20 * time.Millisecond)) {
		t.Fatal("got = held before the round was confirmed, expected: not held")
	}
	l.Confirmed(1, 5)
	length := (electionTicks - 3) * leaseTick // 700ms
	for _, c := range []struct {
		at   time.Duration
		held bool
		due  bool
	}{
		{20 * time.Millisecond, true, false},
		{10*time.Millisecond + length/2 - time.Millisecond, true, false},
		{10*time.Millisecond + length/2 + time.Millisecond, true, true},
		{10*time.Millisecond + length - time.Millisecond, true, true},
		{10*time.Millisecond + length, false, true},
	} {
		if got := l.Held(at(c.at)); got != c.held {
			t.Errorf("at %v: got = held %v, expected: %v", c.at, got, c.held)
		}
		if got := l.Due(at(c.at)); got != c.due {
			t.Errorf("at %v: got = due %v, expected: %v", c.at, got, c.due)
		}
	}

	// A later confirmation of an earlier-begun round never shortens it;
	// an answer for another term, or after the leadership ended, counts
	// for nothing.
	l.Begin(2, 5, at(300*time.Millisecond))
	l.Begin(3, 5, at(400*time.Millisecond))
	l.Confirmed(3, 5)
	l.Confirmed(2, 5)
	if !l.Held(at(400*time.Millisecond+length-time.Millisecond)) || l.Held(at(400*time.Millisecond+length)) {
		t.Error("got = the lease not ending at the latest confirmed start + its length")
	}
	l.Begin(4, 5, at(500*time.Millisecond))
	l.Confirmed(4, 6)
	if l.Held(at(400*time.Millisecond + length)) {
		t.Error("got = a round confirmed in another term extending the lease")
	}
	l.End()
	if l.Held(at(450 * time.Millisecond)) {
		t.Error("got = held after End, expected: not held")
	}
	l.Confirmed(4, 5)
	if l.Held(at(600 * time.Millisecond)) {
		t.Error("got = a round of an ended leadership confirmed after End, expected: not held")
	}
}

// A leader that starts a transfer has no lease, and rounds begun in the
// next two election timeouts do not give it one: the transferee's
// election ignores the followers' leases.
func TestALeadershipTransferVoidsTheLease(t *testing.T) {
	t.Parallel()
	l, at := newTestLease()
	l.Begin(1, 2, at(0))
	l.Confirmed(1, 2)
	l.Void(at(100 * time.Millisecond))
	if l.Held(at(100 * time.Millisecond)) {
		t.Fatal("got = held right after a transfer began, expected: not held")
	}
	l.Begin(2, 2, at(200*time.Millisecond))
	l.Confirmed(2, 2)
	if l.Held(at(300 * time.Millisecond)) {
		t.Fatal("got = a round begun during the transfer giving a lease, expected: not held")
	}
	start := 100*time.Millisecond + 2*electionTicks*leaseTick
	l.Begin(3, 2, at(start))
	l.Confirmed(3, 2)
	if !l.Held(at(start + time.Millisecond)) {
		t.Fatal("got = no lease from a round begun two election timeouts after the transfer, expected: held")
	}
}

// The lease at the log's level: a leader cut off from its followers
// stops holding its lease before either of them is elected, though raft
// may still say it leads. Every millisecond, no other node may lead
// while the old one holds its lease.
func TestAnIsolatedLeaderLosesItsLeaseBeforeAnotherIsElected(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3)
	old := c.leader()
	waitFor(t, "the leader to hold its lease", func() bool { return old.LeaseHeld(time.Now()) })
	for _, n := range c.others(old) {
		if n.LeaseHeld(time.Now()) {
			t.Fatalf("got = follower %s holding a lease, expected: only the leader", n.ID())
		}
	}

	c.isolate(old)
	deadline := time.Now().Add(10 * time.Second)
	for {
		next := false
		for _, n := range c.others(old) {
			next = next || n.IsLeader()
		}
		// Read the lease after the others: a lease seen held after a
		// successor was seen is a lease held beside it.
		if held := old.LeaseHeld(time.Now()); next && held {
			t.Fatal("got = the isolated leader holding its lease while another node leads, expected: its lease ended first")
		} else if next {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no other leader 10s after the leader was isolated")
		}
		time.Sleep(time.Millisecond)
	}
}

// A leader that is its configuration's one voter holds its lease for as
// long as it leads, rounds or not: nobody else can be elected. A member
// of three holds one only as long as its last confirmed round says.
func TestASoleVoterHoldsItsLeaseWhileItLeads(t *testing.T) {
	t.Parallel()
	alone := openFake(t, testConfig(t.TempDir(), ""), nil)
	waitLeader(t, alone)
	waitFor(t, "the single node to apply its configuration", func() bool { return alone.LeaseHeld(time.Now().Add(time.Hour)) })

	c := newTestCluster(t, 3)
	l := c.leader()
	waitFor(t, "the leader to hold its lease", func() bool { return l.LeaseHeld(time.Now()) })
	if l.LeaseHeld(time.Now().Add(time.Hour)) {
		t.Fatal("got = a leader of three holding its lease an hour from now, expected: only until its last round's start + 0.7 election timeouts")
	}
}
