package statemachine

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"

	"pgregory.net/rapid"
)

// modelCompares is etcd's applyCompares, written again over the keys as
// they are: every compare holds for every key in its range, and a range
// with no key compares as a zero key, but for values, which never hold.
func modelCompares(keys []KeyValue, cs []TxnCompare) bool {
	for _, c := range cs {
		var in []KeyValue
		for _, kv := range keys {
			if c.End == "" && kv.Key == c.Key || c.End != "" && kv.Key >= c.Key && (c.End == "\x00" || kv.Key < c.End) {
				in = append(in, kv)
			}
		}
		if len(in) == 0 {
			if c.Target == TargetValue {
				return false
			}
			in = []KeyValue{{}}
		}
		for _, kv := range in {
			var r int
			switch c.Target {
			case TargetValue:
				r = strings.Compare(kv.Value, c.Value)
			case TargetVersion:
				r = cmpInt(kv.Version, c.Number)
			case TargetCreate:
				r = cmpInt(kv.CreateRevision, c.Number)
			case TargetMod:
				r = cmpInt(kv.ModRevision, c.Number)
			case TargetLease:
				r = cmpInt(kv.EtcdLease(), c.Number)
			}
			holds := map[CmpOp]bool{CmpEqual: r == 0, CmpGreater: r > 0, CmpLess: r < 0, CmpNotEqual: r != 0}[c.Op]
			if !holds {
				return false
			}
		}
	}
	return true
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkTxn checks a Txn's branch against modelCompares on the keys before
// it, and that one that wrote took one KV revision.
func (w *world) checkTxn(t *rapid.T, cmd Command, res Result) {
	t.Helper()
	c, ok := cmd.(Txn)
	if !ok || res.Err != nil {
		return
	}
	before := w.models[w.lastKVRevision]
	if expected := modelCompares(before, c.Compares); res.Txn.Succeeded != expected {
		t.Fatalf("Txn %+v on %+v: succeeded got = %v, expected: %v", c, before, res.Txn.Succeeded, expected)
	}
	if len(res.Txn.Ops) != len(c.branch(res.Txn.Succeeded)) {
		t.Fatalf("Txn: got = %d results, expected: one per operation of the branch", len(res.Txn.Ops))
	}
	wrote := slices.ContainsFunc(res.Events, func(e Event) bool { return e.Type.IsKey() })
	if wrote && res.KVRevision != w.lastKVRevision+1 || !wrote && res.KVRevision != w.lastKVRevision {
		t.Fatalf("Txn: KV revision got = %d, expected: %d and one more if it wrote (it did: %v)", res.KVRevision, w.lastKVRevision, wrote)
	}
}

// recordKeys remembers the keys at the KV revision after a command, and
// its key events.
func (w *world) recordKeys(res Result) {
	if !w.m.usesKVRevision() {
		return
	}
	if w.lastKVRevision == 0 {
		// The history starts at the last revision of the global clock,
		// with the keys as they are.
		w.models[w.m.CompactRevision()], _ = w.m.Range("", 0)
	}
	if w.m.KVRevision() != w.lastKVRevision {
		w.models[w.m.KVRevision()], _ = w.m.Range("", 0)
	}
	w.lastKVRevision = w.m.KVRevision()
	w.keyEvents = append(w.keyEvents, appliedKeyEvents(res)...)
}

// checkKeyHistory checks RangeKeys and KeyEvents against what the world
// saw: a range at a kept revision finds the keys as they were then, and
// KeyEvents from a revision after the compact one replays exactly the
// key events applied since. all checks every revision kept, otherwise a
// few.
func (w *world) checkKeyHistory(t *rapid.T, all bool) {
	t.Helper()
	m := w.m
	if !m.usesKVRevision() {
		return
	}
	c, kv := m.CompactRevision(), m.KVRevision()
	revs := []int64{c, c + 1, (c + kv) / 2, kv - 1, kv}
	if all {
		revs = nil
		for rev := c; rev <= kv; rev++ {
			revs = append(revs, rev)
		}
	}
	for _, rev := range revs {
		if rev < max(c, 1) || rev > kv { // 0 is the current revision
			continue
		}
		expected, ok := w.models[rev]
		if !ok {
			t.Fatalf("no model of the keys at KV revision %d", rev)
		}
		if got := rangeAt(t, m, "", "\x00", rev); !slices.Equal(got, expected) {
			t.Fatalf("RangeKeys at %d (compacted at %d, now %d):\ngot = %+v\nexpected: %+v", rev, c, kv, got, expected)
		}
		if got := rangeAt(t, m, "a", "b", rev); !slices.Equal(got, slices.DeleteFunc(slices.Clone(expected), func(kv KeyValue) bool { return kv.Key >= "b" })) {
			t.Fatalf("RangeKeys of [a, b) at %d: got = %+v, expected: the keys of %+v below b", rev, got, expected)
		}
	}
	for _, from := range append(revs, kv+1) {
		// From the compact revision itself, the versions kept at it are
		// replayed too: only a fresh store's (0) has none.
		if from < c || from == c && c != 0 {
			continue
		}
		var expected []keyEvent
		for _, e := range w.keyEvents {
			if e.KV.ModRevision >= from {
				expected = append(expected, e)
			}
		}
		if got := keyEventsFrom(t, m, from); !reflect.DeepEqual(got, expected) {
			t.Fatalf("KeyEvents(%d) (compacted at %d):\ngot = %+v\nexpected: %+v", from, c, got, expected)
		}
	}
	if err := m.RangeKeys("", "\x00", kv+1, func(KeyValue) bool { return true }); !errors.Is(err, ErrFutureRevision) {
		t.Fatalf("RangeKeys at %d, after %d: got = %v, expected: %v", kv+1, kv, err, ErrFutureRevision)
	}
	if c > 1 {
		if err := m.RangeKeys("", "\x00", c-1, func(KeyValue) bool { return true }); !errors.Is(err, ErrCompacted) {
			t.Fatalf("RangeKeys at %d, compacted at %d: got = %v, expected: %v", c-1, c, err, ErrCompacted)
		}
	}
}

// matchPattern is the policy's '*' pattern, written again so that the
// test does not take the code under test's word for it.
func matchPattern(p, name string) bool {
	prefix, wild := strings.CutSuffix(p, "*")
	if !wild {
		return p == name
	}
	return strings.HasPrefix(name, prefix)
}

// checkToken checks rule 2: a release, value update or revoke naming a
// token succeeds exactly when the token is a current holder's.
func (w *world) checkToken(t *rapid.T, cmd Command, pre map[LeaseID]Lease, res Result) {
	t.Helper()
	var id LeaseID
	var token int64
	switch c := cmd.(type) {
	case Release:
		id, token = c.Lease, c.Token
	case SetValue:
		id, token = c.Lease, c.Token
	case Revoke:
		if c.Token == 0 {
			return
		}
		id, token = c.Lease, c.Token
	default:
		return
	}
	l, ok := pre[id]
	held := ok && slices.ContainsFunc(l.Holders, func(g Grant) bool { return g.Token == token })
	switch {
	case !ok && !errors.Is(res.Err, ErrLeaseNotFound):
		t.Fatalf("%T %+v on an unknown lease: got = %v, expected: %v", cmd, cmd, res.Err, ErrLeaseNotFound)
	case ok && held && res.Err != nil && !errors.Is(res.Err, ErrNotOwner):
		t.Fatalf("%T %+v with a holder's token: got = %v, expected: nil", cmd, cmd, res.Err)
	case ok && !held && !errors.Is(res.Err, ErrNotHolder):
		t.Fatalf("%T %+v with a token not held (holders %+v): got = %v, expected: %v", cmd, cmd, l.Holders, res.Err, ErrNotHolder)
	}
}

// checkEvents walks a command's events against the state before it:
// grants go to the head of the queue, never to an ended session, never
// during a lock-delay, with tokens that increase per lease; a lock-delay
// starts only on an expiry.
func (w *world) checkEvents(t *rapid.T, cmd Command, pre map[LeaseID]Lease, res Result) {
	t.Helper()
	queues := map[LeaseID][]int64{}
	delays := map[LeaseID]int64{}
	for id, l := range pre {
		for _, wt := range l.Waiters {
			queues[id] = append(queues[id], wt.SessionID)
		}
		delays[id] = l.DelayRevision
	}
	endedNow := map[int64]bool{}
	for _, e := range res.Events {
		if e.Type == EventSessionClosed || e.Type == EventSessionExpired {
			endedNow[e.SessionID] = true
		}
	}
	for _, e := range res.Events {
		switch e.Type {
		case EventSessionOpened:
			if w.ended[e.SessionID] || slices.Contains(w.sessions, e.SessionID) {
				t.Fatalf("session ID %d opened again", e.SessionID)
			}
			if e.Session == nil || e.Session.ID != e.SessionID || e.SessionID != e.Revision {
				t.Fatalf("opened session: got = %+v at revision %d, expected: ID %d = revision", e.Session, e.Revision, e.SessionID)
			}
		case EventSessionClosed, EventSessionExpired:
			w.ended[e.SessionID] = true
		case EventLeaseWaiting:
			queues[e.Lease] = append(queues[e.Lease], e.SessionID)
		case EventLeaseWaitEnded:
			queues[e.Lease] = slices.DeleteFunc(queues[e.Lease], func(id int64) bool { return id == e.SessionID })
		case EventLeaseExpired:
			if _, ok := cmd.(ExpireSessions); !ok {
				t.Fatalf("%T emitted %v", cmd, e.Type)
			}
			if e.LockDelay > 0 {
				delays[e.Lease] = e.Revision
			}
		case EventLeaseRevoked:
			if e.LockDelay > 0 {
				delays[e.Lease] = e.Revision
			}
		case EventLockDelayEnded:
			delays[e.Lease] = 0
		case EventLeaseDeleted:
			// Rule: only an idle record is collected, and only by a
			// collection of the current epoch that names its revision.
			c, ok := cmd.(CollectLeases)
			l, existed := pre[e.Lease]
			switch {
			case !ok:
				t.Fatalf("%T deleted lease %v", cmd, e.Lease)
			case !existed || len(l.Holders) > 0 || len(l.Waiters) > 0 || l.DelayRevision != 0:
				t.Fatalf("%v deleted while not idle: %+v", e.Lease, l)
			case l.GCAfter <= 0:
				t.Fatalf("%v deleted with no gc_after", e.Lease)
			case c.Epoch != w.m.Epoch() || !slices.ContainsFunc(c.Leases, func(il IdleLease) bool { return il.Lease == e.Lease && il.Revision == l.ModRevision }):
				t.Fatalf("%v deleted at mod revision %d, which the collection %+v does not name", e.Lease, l.ModRevision, c.Leases)
			}
			if _, still := w.m.Lease(e.Lease); still {
				t.Fatalf("%v: deleted event, but the lease is still there", e.Lease)
			}
		case EventLeaseAcquired:
			sid := e.SessionID
			if w.ended[sid] || endedNow[sid] {
				t.Fatalf("%v granted to session %d, which ended (%T)", e.Lease, sid, cmd)
			}
			if delays[e.Lease] != 0 {
				t.Fatalf("%v granted to session %d during the lock-delay of revision %d", e.Lease, sid, delays[e.Lease])
			}
			if e.Token != e.Revision {
				t.Fatalf("token: got = %d, expected: the grant's revision %d", e.Token, e.Revision)
			}
			if e.Token <= w.lastToken[e.Lease] {
				t.Fatalf("token of %v: got = %d, expected: above the last token %d", e.Lease, e.Token, w.lastToken[e.Lease])
			}
			w.lastToken[e.Lease] = e.Token
			q := queues[e.Lease]
			if i := slices.Index(q, sid); i >= 0 {
				if head := w.head(e.Lease, q); sid != head {
					t.Fatalf("%v granted to waiter %d, expected: the head of the queue %v, %d", e.Lease, sid, q, head)
				}
				queues[e.Lease] = slices.Delete(q, i, i+1)
				continue
			}
			// A grant to a session that did not wait is its own acquire,
			// and only when nobody waits before it.
			a, ok := cmd.(Acquire)
			if !ok || a.SessionID != sid || a.Lease != e.Lease {
				t.Fatalf("%v granted to session %d, which did not wait, by %T %+v", e.Lease, sid, cmd, cmd)
			}
			if len(q) > 0 {
				t.Fatalf("%v granted to session %d ahead of the queue %v", e.Lease, sid, q)
			}
		}
	}
	for _, l := range w.m.Leases("") {
		if l.DelayRevision != delays[l.LeaseID] {
			t.Fatalf("delay revision of %v after %T: got = %d, expected: %d", l.LeaseID, cmd, l.DelayRevision, delays[l.LeaseID])
		}
	}
	if a, ok := cmd.(Acquire); ok && res.Err == nil {
		if (res.Grant != nil) == res.Queued {
			t.Fatalf("acquire: got = grant %+v and queued %v, expected: exactly one", res.Grant, res.Queued)
		}
		if res.Grant != nil && (res.Grant.SessionID != a.SessionID || !slices.Contains(tokens(t, w.m, a.Lease), res.Grant.Token)) {
			t.Fatalf("acquire: grant %+v is not a current grant to session %d", res.Grant, a.SessionID)
		}
	}
}

// checkInvariants checks what must hold of any state.
func checkInvariants(t tb, m *Machine) {
	t.Helper()
	checkUsage(t, m)
	sessions := map[int64]Session{}
	identities := map[string]int{}
	for _, s := range m.Sessions() {
		sessions[s.ID] = s
		identities[s.Identity]++
	}
	if !maps.Equal(identities, m.identities) {
		t.Fatalf("sessions per identity: got = %v, expected: %v", m.identities, identities)
	}
	held := map[int64][]LeaseID{}
	waiting := map[int64][]LeaseID{}
	for _, l := range m.Leases("") {
		if l.Capacity < 1 || len(l.Holders) > l.Capacity {
			t.Fatalf("%v: got = %d holders, expected: at most its capacity %d", l.LeaseID, len(l.Holders), l.Capacity)
		}
		if slices.ContainsFunc(l.Holders, func(g Grant) bool { return g.Exclusive }) && len(l.Holders) > 1 {
			t.Fatalf("%v: got = %d holders beside an exclusive grant, expected: the exclusive holder alone", l.LeaseID, len(l.Holders))
		}
		seen := map[int64]bool{}
		for _, g := range l.Holders {
			if _, ok := sessions[g.SessionID]; !ok {
				t.Fatalf("%v: holder session %d does not exist", l.LeaseID, g.SessionID)
			}
			if seen[g.SessionID] {
				t.Fatalf("%v: session %d holds it twice", l.LeaseID, g.SessionID)
			}
			seen[g.SessionID] = true
			if g.Token < l.CreateRevision || g.Token > m.Revision() || g.Token > l.ModRevision {
				t.Fatalf("%v: token %d outside [create %d, mod %d]", l.LeaseID, g.Token, l.CreateRevision, l.ModRevision)
			}
			held[g.SessionID] = append(held[g.SessionID], l.LeaseID)
		}
		for _, wt := range l.Waiters {
			if _, ok := sessions[wt.SessionID]; !ok {
				t.Fatalf("%v: waiting session %d does not exist", l.LeaseID, wt.SessionID)
			}
			if seen[wt.SessionID] {
				t.Fatalf("%v: session %d both holds and waits, or waits twice", l.LeaseID, wt.SessionID)
			}
			seen[wt.SessionID] = true
			waiting[wt.SessionID] = append(waiting[wt.SessionID], l.LeaseID)
		}
		r, _ := m.leases.get(l.LeaseID)
		head := max(r.preferredWaiter(), 0)
		// Version 1 let a waiter leave the head of a queue without
		// letting the next one in; version 2 fixed it.
		if m.atLeast(2) && len(l.Waiters) > 0 && fits(r.holders, l.Capacity, l.Waiters[head].Exclusive) && l.DelayRevision == 0 {
			t.Fatalf("%v: waiters %v are left waiting with %d of %d places taken and no lock-delay", l.LeaseID, l.Waiters, len(l.Holders), l.Capacity)
		}
		if (l.IdleSince != 0) != (l.Idle() && l.GCAfter > 0) {
			t.Fatalf("%v: idle since %d with %d holders, %d waiters, delay revision %d, gc_after %d", l.LeaseID, l.IdleSince, len(l.Holders), len(l.Waiters), l.DelayRevision, l.GCAfter)
		}
		// Holders are in the preferred waiter's way when it does not fit
		// beside them; one that fits waits only for a lock-delay.
		if pw := r.preferredWaiter(); len(l.Holders) > 0 && pw >= 0 && !fits(r.holders, l.Capacity, l.Waiters[pw].Exclusive) &&
			!slices.ContainsFunc(l.Holders, func(g Grant) bool { return g.Holder == l.PreferredHolder }) &&
			!slices.ContainsFunc(l.Holders, func(g Grant) bool { return g.StepDown != "" }) {
			t.Fatalf("%v: preferred holder %s waits, but no holder in its way was asked to step down: %+v", l.LeaseID, l.PreferredHolder, l.Holders)
		}
		if l.ModRevision > m.Revision() || l.CreateRevision > l.ModRevision {
			t.Fatalf("%v: revisions create %d, mod %d at revision %d", l.LeaseID, l.CreateRevision, l.ModRevision, m.Revision())
		}
	}
	bound := map[int64]int{}
	kvs, _ := m.Range("", 0)
	if len(kvs) != m.KeyCount() {
		t.Fatalf("KeyCount: got = %d, expected: %d", m.KeyCount(), len(kvs))
	}
	for _, kv := range kvs {
		if kv.SessionID != 0 {
			if _, ok := sessions[kv.SessionID]; !ok {
				t.Fatalf("key %q is bound to session %d, which does not exist", kv.Key, kv.SessionID)
			}
			bound[kv.SessionID]++
		}
		keyClock := m.Revision()
		if m.usesKVRevision() {
			keyClock = m.KVRevision()
		}
		if kv.Version < 1 || kv.CreateRevision > kv.ModRevision || kv.ModRevision > keyClock {
			t.Fatalf("key %+v at revision %d, KV revision %d", kv, m.Revision(), m.KVRevision())
		}
	}
	checkHistory(t, m)
	for id := range sessions {
		h, w, n := m.SessionHoldings(id)
		if !slices.Equal(h, held[id]) || !slices.Equal(w, waiting[id]) || n != bound[id] {
			t.Fatalf("holdings of session %d: got = %v %v %d keys, expected: %v %v %d keys", id, h, w, n, held[id], waiting[id], bound[id])
		}
	}
	d := m.Deadlines()
	if len(d.Sessions) != len(sessions) {
		t.Fatalf("deadlines: got = %d sessions, expected: %d", len(d.Sessions), len(sessions))
	}
	for _, dl := range d.Delays {
		l, _ := m.Lease(dl.Lease)
		if l.DelayRevision == 0 || l.DelayRevision != dl.Revision {
			t.Fatalf("deadline %+v: got = lease delay revision %d", dl, l.DelayRevision)
		}
	}
	for _, il := range d.Idle {
		l, _ := m.Lease(il.Lease)
		if !l.Idle() || il.Revision != l.ModRevision || il.GCAfter != l.GCAfter || il.GCAfter <= 0 {
			t.Fatalf("gc deadline %+v of a lease that is not idle at that revision: %+v", il, l)
		}
	}
}

// compareResults checks that two machines answered a command alike.
func compareResults(t *rapid.T, cmd Command, a, b Result) {
	t.Helper()
	if (a.Err == nil) != (b.Err == nil) || a.Err != nil && a.Err.Error() != b.Err.Error() {
		t.Fatalf("%T: error: got = %v, expected: %v", cmd, b.Err, a.Err)
	}
	for _, s := range sentinels {
		if errors.Is(a.Err, s) != errors.Is(b.Err, s) {
			t.Fatalf("%T: errors.Is(%v, %v): got = %v, expected: %v", cmd, b.Err, s, errors.Is(b.Err, s), errors.Is(a.Err, s))
		}
	}
	a, b = normalize(a), normalize(b)
	a.Err, b.Err = nil, nil
	if !reflect.DeepEqual(a.Events, b.Events) {
		t.Fatalf("%T: events:\ngot = %+v\nexpected: %+v", cmd, b.Events, a.Events)
	}
	if !reflect.DeepEqual(a, b) {
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		t.Fatalf("%T: result:\ngot = %s\nexpected: %s", cmd, jb, ja)
	}
}

// normalize makes empty holder and waiter lists nil: a lease restored from
// a snapshot has nil where the original has an emptied slice, which no
// caller can tell apart.
func normalize(r Result) Result {
	if r.Lease != nil {
		l := *r.Lease
		if len(l.Holders) == 0 {
			l.Holders = nil
		}
		if len(l.Waiters) == 0 {
			l.Waiters = nil
		}
		r.Lease = &l
	}
	return r
}
