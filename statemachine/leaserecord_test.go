package statemachine

import (
	"testing"
	"unsafe"
)

// A held lock costs the machine a lease record and one holder; what few
// leases or grants have (waiters, labels, a lock-delay, a preferred
// holder; an exclusive grant, a step-down, a max hold) lives apart and
// is made only while it holds something. The sizes are the contract of
// docs/benchmarks.md's memory figures: a record of 128 bytes and a
// holder of 72 (an 80-byte slot).
func TestALeaseRecordKeepsWhatFewLeasesHaveApart(t *testing.T) {
	if got := unsafe.Sizeof(lease{}); got > 128 {
		t.Errorf("lease record: got = %d bytes, expected: at most 128", got)
	}
	if got := unsafe.Sizeof(holder{}); got > 72 {
		t.Errorf("holder: got = %d bytes, expected: at most 72", got)
	}

	m := New()
	for i, cmd := range []Command{v2, open("a"), open("p"), acquire(1, leaseA)} {
		applyOK(t, m, int64(i+1)*setupTick, cmd)
	}
	rec := func() *lease {
		t.Helper()
		l, ok := m.leases.get(leaseA)
		if !ok {
			t.Fatalf("record of %s: got = none, expected: one", leaseA)
		}
		return l
	}
	if l := rec(); l.rare != nil || l.holders[0].rare != nil {
		t.Fatalf("a plain lock: got = rare parts %+v, %+v, expected: none", l.rare, l.holders[0].rare)
	}

	// A waiter and a preferred holder make the rare parts: the queue on
	// the record, the step-down on the grant in its way.
	applyOK(t, m, 10*setupTick, wait(2, leaseA))
	applyOK(t, m, 11*setupTick, SetPreferred{Lease: leaseA, Identity: "p"})
	if l := rec(); l.rare == nil || len(l.rare.waiters) != 1 || l.rare.preferredHolder != "p" || l.holders[0].stepDown() == "" {
		t.Fatalf("with a waiter and a preferred holder: got = %+v, expected: both on the record's rare part and a step-down on the grant", l.rare)
	}
	got := mustLease(t, m, leaseA)
	expect(t, "public waiters", waiters(t, m, leaseA), []int64{2})
	expect(t, "public preferred holder", got.PreferredHolder, "p")

	// Once they are gone, the record drops its rare part.
	applyOK(t, m, 12*setupTick, CancelWait{Lease: leaseA, SessionID: 2})
	applyOK(t, m, 13*setupTick, SetPreferred{Lease: leaseA})
	if l := rec(); l.rare != nil {
		t.Fatalf("with no waiter and no preferred holder left: got = rare part %+v, expected: none", l.rare)
	}

	// What a read returns is a copy: changing it changes nothing.
	got = mustLease(t, m, leaseA)
	got.Holders[0].Holder, got.Holders[0].StepDown = "mallory", "changed"
	if got.Labels == nil {
		got.Labels = map[string]string{}
	}
	got.Labels["x"] = "y"
	again := mustLease(t, m, leaseA)
	if again.Holders[0].Holder != "a" || again.Labels["x"] != "" {
		t.Fatalf("after changing a read's copy: got = %+v, expected: the machine's lease unchanged", again)
	}
}
