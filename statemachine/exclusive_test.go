package statemachine

import (
	"testing"
)

func reader(session int64, wait bool) Acquire {
	return Acquire{SessionID: session, Lease: leaseA, Capacity: 100, Wait: wait}
}

func writer(session int64, wait bool) Acquire {
	a := reader(session, wait)
	a.Exclusive = true
	return a
}

func holderSessions(m *Machine) []int64 {
	l, _ := m.Lease(leaseA)
	var ids []int64
	for _, g := range l.Holders {
		ids = append(ids, g.SessionID)
	}
	return ids
}

// TestReadersWriterLock drives the readers-writer use of a lease: readers
// share up to the capacity, a writer holds it alone, and a queued writer
// is not overtaken by readers that arrive after it.
func TestReadersWriterLock(t *testing.T) {
	m := New()
	var s [5]int64
	for i := range s {
		s[i] = m.Apply(1, open("s")).Session.ID
	}
	mustOK := func(cmd Command) Result {
		t.Helper()
		res := m.Apply(2, cmd)
		if res.Err != nil {
			t.Fatalf("%T: %v", cmd, res.Err)
		}
		return res
	}
	r0 := mustOK(reader(s[0], false))
	r1 := mustOK(reader(s[1], false))
	if r0.Grant == nil || r1.Grant == nil {
		t.Fatalf("got = %v, %v, expected: two readers granted together", r0.Grant, r1.Grant)
	}
	if res := m.Apply(3, writer(s[2], false)); res.Err == nil {
		t.Fatalf("got = writer granted beside readers, expected: ErrLocked")
	}
	if w := mustOK(writer(s[2], true)); !w.Queued {
		t.Fatalf("got = %+v, expected: writer queued", w)
	}
	// A reader arriving behind the queued writer waits for it.
	if r := mustOK(reader(s[3], true)); !r.Queued {
		t.Fatalf("got = %+v, expected: reader queued behind the writer", r)
	}
	if res := m.Apply(3, reader(s[4], false)); res.Err == nil {
		t.Fatalf("got = late reader granted past a waiting writer, expected: ErrLocked")
	}
	mustOK(release(leaseA, r0.Grant.Token))
	if got := holderSessions(m); len(got) != 1 || got[0] != s[1] {
		t.Fatalf("holders got = %v, expected: only reader %d while the writer waits", got, s[1])
	}
	mustOK(release(leaseA, r1.Grant.Token))
	if got := holderSessions(m); len(got) != 1 || got[0] != s[2] {
		t.Fatalf("holders got = %v, expected: writer %d alone", got, s[2])
	}
	l, _ := m.Lease(leaseA)
	if !l.Holders[0].Exclusive {
		t.Fatalf("got = %+v, expected: the writer's grant marked exclusive", l.Holders[0])
	}
	mustOK(release(leaseA, l.Holders[0].Token))
	if got := holderSessions(m); len(got) != 1 || got[0] != s[3] {
		t.Fatalf("holders got = %v, expected: queued reader %d granted after the writer", got, s[3])
	}
}
