package statemachine

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"
)

// tb is what both *testing.T and *rapid.T offer the helpers below.
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Shared fixtures for the tests of this package. Session IDs and tokens
// are revisions, and the machine is deterministic, so the tables name them
// as plain numbers: the nth event of a fresh machine has revision n.

const (
	ttl       = int64(10 * time.Second)
	lockDelay = int64(5 * time.Second)
	keyTTL    = int64(7 * time.Second)
	gcAfter   = int64(time.Hour)
	// cmdTime is the now of the command under test; setup step i runs at
	// (i+1)*setupTick.
	cmdTime   = int64(1_000_000)
	setupTick = int64(1_000)
)

var (
	leaseA = LeaseID{Namespace: "ns", Name: "a"}
	leaseB = LeaseID{Namespace: "ns", Name: "b"}
)

// sentinels are all the errors Result.Err may wrap.
var sentinels = []error{
	ErrSessionNotFound, ErrLeaseNotFound, ErrKeyNotFound, ErrNotHolder,
	ErrLocked, ErrCompareFailed, ErrCapacityMismatch, ErrTooManyWaiters,
	ErrTooManySessions, ErrNotWaiting, ErrNotSupported, ErrNotOwner, ErrUnknownCommand,
	ErrCompacted, ErrFutureRevision, ErrLeaseExists, ErrNoSpace,
}

func open(identity string) OpenSession { return OpenSession{Identity: identity, TTL: ttl} }

func acquire(session int64, id LeaseID) Acquire {
	return Acquire{SessionID: session, Lease: id, Capacity: 1}
}

func wait(session int64, id LeaseID) Acquire {
	return Acquire{SessionID: session, Lease: id, Capacity: 1, Wait: true}
}

func semaphore(session int64, id LeaseID, capacity int, wait bool) Acquire {
	return Acquire{SessionID: session, Lease: id, Capacity: capacity, Wait: wait}
}

func withDelay(a Acquire) Acquire {
	a.LockDelay = lockDelay
	return a
}

func release(id LeaseID, token int64) Release { return Release{Lease: id, Token: token} }

func expire(epoch int64, ids ...int64) ExpireSessions {
	return ExpireSessions{Epoch: epoch, IDs: ids}
}

// machineCase is one command applied to the state its setup built. Setup
// commands must all succeed. When err is set, the runner checks that the
// command failed with it and changed nothing; check then inspects the rest.
type machineCase struct {
	name  string
	setup []Command
	cmd   Command
	err   error
	check func(t *testing.T, m *Machine, res Result)
}

func runCases(t *testing.T, cases []machineCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New()
			for i, c := range tc.setup {
				applyOK(t, m, int64(i+1)*setupTick, c)
			}
			before := snapshotBytes(t, m)
			rev := m.Revision()
			res := m.Apply(cmdTime, tc.cmd)
			checkRevisions(t, rev, m, res)
			if tc.err != nil {
				if !errors.Is(res.Err, tc.err) {
					t.Fatalf("Err: got = %v, expected: %v", res.Err, tc.err)
				}
				if len(res.Events) != 0 {
					t.Errorf("events of a failed command: got = %v, expected: none", eventTypes(res))
				}
				if m.Revision() != rev {
					t.Errorf("revision after a failed command: got = %d, expected: %d", m.Revision(), rev)
				}
				if after := snapshotBytes(t, m); !bytes.Equal(before, after) {
					t.Errorf("state after a failed command:\ngot = %s\nexpected: %s", after, before)
				}
			} else if res.Err != nil {
				t.Fatalf("Err: got = %v, expected: nil", res.Err)
			}
			if tc.check != nil {
				tc.check(t, m, res)
			}
		})
	}
}

// applyOK applies a command that must succeed.
func applyOK(t tb, m *Machine, now int64, cmd Command) Result {
	t.Helper()
	rev := m.Revision()
	res := m.Apply(now, cmd)
	if res.Err != nil {
		t.Fatalf("%T %+v: got = %v, expected: nil", cmd, cmd, res.Err)
	}
	checkRevisions(t, rev, m, res)
	return res
}

// checkRevisions checks that a result's events have contiguous revisions
// from prev+1 up to the machine's revision, stamped with the command's time.
func checkRevisions(t tb, prev int64, m *Machine, res Result) {
	t.Helper()
	for i, e := range res.Events {
		if e.Revision != prev+int64(i)+1 {
			t.Fatalf("revision of event %d (%v): got = %d, expected: %d", i, e.Type, e.Revision, prev+int64(i)+1)
		}
	}
	if expected := prev + int64(len(res.Events)); m.Revision() != expected {
		t.Fatalf("Machine.Revision after %d events: got = %d, expected: %d", len(res.Events), m.Revision(), expected)
	}
	if res.Revision != m.Revision() {
		t.Fatalf("Result.Revision: got = %d, expected: %d", res.Revision, m.Revision())
	}
}

func snapshotBytes(t tb, m *Machine) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := m.Snapshot(&buf); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return buf.Bytes()
}

func eventTypes(res Result) []EventType {
	out := make([]EventType, len(res.Events))
	for i, e := range res.Events {
		out[i] = e.Type
	}
	return out
}

// expect reports got != expected with the package's failure format.
func expect[T any](t tb, what string, got, expected T) {
	t.Helper()
	if !reflect.DeepEqual(got, expected) {
		t.Errorf("%s: got = %+v, expected: %+v", what, got, expected)
	}
}

func expectEvents(t tb, res Result, expected ...EventType) {
	t.Helper()
	if got := eventTypes(res); !slices.Equal(got, expected) {
		t.Errorf("events: got = %v, expected: %v", got, expected)
	}
}

func mustLease(t tb, m *Machine, id LeaseID) Lease {
	t.Helper()
	l, ok := m.Lease(id)
	if !ok {
		t.Fatalf("lease %s: got = absent, expected: present", id)
	}
	return l
}

// holders returns the session IDs holding a lease, in grant order.
func holders(t tb, m *Machine, id LeaseID) []int64 {
	t.Helper()
	var out []int64
	for _, g := range mustLease(t, m, id).Holders {
		out = append(out, g.SessionID)
	}
	return out
}

func tokens(t tb, m *Machine, id LeaseID) []int64 {
	t.Helper()
	var out []int64
	for _, g := range mustLease(t, m, id).Holders {
		out = append(out, g.Token)
	}
	return out
}

// waiters returns the session IDs in a lease's queue, head first.
func waiters(t tb, m *Machine, id LeaseID) []int64 {
	t.Helper()
	var out []int64
	for _, w := range mustLease(t, m, id).Waiters {
		out = append(out, w.SessionID)
	}
	return out
}

func keys(m *Machine) []string {
	kvs, _ := m.Range("", 0)
	var out []string
	for _, kv := range kvs {
		out = append(out, kv.Key)
	}
	return out
}
