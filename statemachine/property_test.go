package statemachine

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The property tests draw command sequences from a small universe (a few
// sessions, three leases, three keys, current and stale tokens, current and
// wrong epochs) so that contention, queues, delays and stale requests are
// common, and check the safety rules after every command.

var (
	propLeases = []LeaseID{{Namespace: "p", Name: "x"}, {Namespace: "p", Name: "y"}, {Namespace: "q", Name: "x"}}
	propKeys   = []string{"a", "a/b", "b"}
)

// world draws commands against a machine's state and checks each result
// against what it knew before the command.
type world struct {
	m        *Machine
	now      int64
	sessions []int64             // every session ID ever opened
	tokens   map[LeaseID][]int64 // every token ever granted, per lease

	lastToken  map[LeaseID]int64 // the highest token granted, per lease, across deletions
	ended      map[int64]bool    // sessions closed or expired
	identities map[int64]string  // every session's identity

	// From cluster version 5: the keys as they were at each KV revision,
	// and every key event applied, to check the history against.
	models    map[int64][]KeyValue
	keyEvents []keyEvent
	// lastKVRevision is the KV revision before the command being
	// checked.
	lastKVRevision int64
}

func newWorld() *world {
	return &world{
		m:          New(),
		now:        1_700_000_000_000_000_000,
		tokens:     map[LeaseID][]int64{},
		lastToken:  map[LeaseID]int64{},
		ended:      map[int64]bool{},
		identities: map[int64]string{},
		models:     map[int64][]KeyValue{},
	}
}

// start draws the cluster version the machine starts at: the keys'
// history (version 5) is as common as the versions before it.
func (w *world) start(t *rapid.T) {
	if v := rapid.SampledFrom([]int{0, 4, 5, 5}).Draw(t, "start version"); v > 0 {
		w.step(t, w.tick(t), SetVersion{Version: v})
	}
}

// tick advances the leader's clock by a random step.
func (w *world) tick(t *rapid.T) int64 {
	w.now += rapid.Int64Range(0, int64(3*time.Second)).Draw(t, "elapsed")
	return w.now
}

// session draws a session ID: most of the time an open one, otherwise
// one that ended or never was.
func (w *world) session(t *rapid.T) int64 {
	if open := w.m.Sessions(); len(open) > 0 && rapid.IntRange(0, 9).Draw(t, "open session") > 1 {
		return rapid.SampledFrom(open).Draw(t, "session").ID
	}
	return rapid.SampledFrom(append(slices.Clone(w.sessions), 0, 999)).Draw(t, "session")
}

func (w *world) lease(t *rapid.T) LeaseID { return rapid.SampledFrom(propLeases).Draw(t, "lease") }

// token draws, most of the time, a current holder's token, and otherwise
// any token ever granted (most of them stale, some of another lease) or
// one never granted.
func (w *world) token(t *rapid.T, id LeaseID) int64 {
	if l, ok := w.m.Lease(id); ok && len(l.Holders) > 0 && rapid.Bool().Draw(t, "current token") {
		return rapid.SampledFrom(l.Holders).Draw(t, "holder").Token
	}
	all := []int64{0, w.m.Revision(), w.m.Revision() + 1}
	for _, id := range propLeases {
		all = append(all, w.tokens[id]...)
	}
	return rapid.SampledFrom(all).Draw(t, "token")
}

func (w *world) epoch(t *rapid.T) int64 {
	e := w.m.Epoch()
	return rapid.SampledFrom([]int64{e, e, e, e - 1, e + 1}).Draw(t, "epoch")
}

func (w *world) value(t *rapid.T) string {
	return rapid.SampledFrom([]string{"", "v1", "v2"}).Draw(t, "value")
}

func (w *world) draw(t *rapid.T) Command {
	kinds := []Kind{
		KindOpenSession, KindOpenSession, KindCloseSession, KindExpireSession, KindExpireSession,
		KindAcquire, KindAcquire, KindAcquire, KindAcquire, KindRelease, KindRelease,
		KindSetValue, KindRevoke, KindCancelWait, KindPut, KindPut, KindDelete,
		KindCompareAndSwap, KindCompareAndSwap, KindExpireKeys, KindEndLockDelays,
		KindEndLockDelays, KindEndLockDelays, KindNewEpoch,
		KindCollectLeases, KindCollectLeases, KindSetPreferred, KindSetPreferred, KindSetVersion,
		KindAskStepDown, KindTxn, KindTxn, KindTxn, KindCompact,
	}
	switch rapid.SampledFrom(kinds).Draw(t, "kind") {
	case KindOpenSession:
		if len(w.m.Sessions()) >= 4 {
			return wait(w.session(t), w.lease(t))
		}
		return OpenSession{
			Identity:       rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, "identity"),
			TTL:            ttl,
			Labels:         rapid.SampledFrom([]map[string]string{nil, {"zone": "z"}}).Draw(t, "labels"),
			MaxPerIdentity: rapid.IntRange(0, 2).Draw(t, "max per identity"),
			LeaseID:        w.chosenLeaseID(t),
		}
	case KindTxn:
		return w.txn(t, 0)
	case KindCompact:
		c, kv := w.m.CompactRevision(), w.m.KVRevision()
		return Compact{Revision: rapid.SampledFrom([]int64{c - 1, c, c + 1, (c + kv) / 2, kv, kv, kv + 1}).Draw(t, "compact revision")}
	case KindCloseSession:
		return CloseSession{SessionID: w.session(t), Actor: w.actor(t)}
	case KindExpireSession:
		ids := rapid.SliceOfN(rapid.Custom(w.session), 0, 3).Draw(t, "ids")
		return ExpireSessions{Epoch: w.epoch(t), IDs: ids}
	case KindAcquire:
		id := w.lease(t)
		// Mostly the capacity the lease is used with, sometimes another.
		capacity := 1
		if id == propLeases[1] {
			capacity = 2
		}
		if rapid.IntRange(0, 4).Draw(t, "other capacity") == 0 {
			capacity = 3 - capacity
		}
		return Acquire{
			SessionID:  w.session(t),
			Lease:      id,
			Capacity:   capacity,
			Wait:       rapid.Bool().Draw(t, "wait"),
			Value:      w.value(t),
			Labels:     rapid.SampledFrom([]map[string]string{nil, {"app": "x"}}).Draw(t, "labels"),
			LockDelay:  rapid.SampledFrom([]int64{0, lockDelay}).Draw(t, "lock delay"),
			MaxWaiters: rapid.IntRange(0, 2).Draw(t, "max waiters"),
			Exclusive:  rapid.IntRange(0, 3).Draw(t, "exclusive") == 0,
			GCAfter:    rapid.SampledFrom([]int64{0, gcAfter, gcAfter}).Draw(t, "gc after"),
			MaxHold:    rapid.SampledFrom([]int64{0, ttl}).Draw(t, "max hold"),
			Actor:      w.actor(t),
		}
	case KindRelease:
		id := w.lease(t)
		return Release{Lease: id, Token: w.token(t, id), Actor: w.actor(t)}
	case KindSetValue:
		id := w.lease(t)
		return SetValue{Lease: id, Token: w.token(t, id), Value: w.value(t), Actor: w.actor(t)}
	case KindRevoke:
		id := w.lease(t)
		token := int64(0)
		if rapid.Bool().Draw(t, "one token") {
			token = w.token(t, id)
		}
		return Revoke{Lease: id, Token: token, Reason: rapid.SampledFrom([]string{"", "drain"}).Draw(t, "reason")}
	case KindCancelWait:
		return CancelWait{SessionID: w.session(t), Lease: w.lease(t), ReleaseIfHeld: rapid.Bool().Draw(t, "release if held"), Actor: w.actor(t)}
	case KindPut:
		return Put{
			Key:       rapid.SampledFrom(propKeys).Draw(t, "key"),
			Value:     w.value(t),
			TTL:       rapid.SampledFrom([]int64{0, keyTTL}).Draw(t, "ttl"),
			SessionID: w.boundSession(t),
			Actor:     w.actor(t),
		}
	case KindDelete:
		return Delete{
			Key:    rapid.SampledFrom(append([]string{"", "a/"}, propKeys...)).Draw(t, "key"),
			Prefix: rapid.Bool().Draw(t, "prefix"),
		}
	case KindCompareAndSwap:
		key := rapid.SampledFrom(propKeys).Draw(t, "key")
		revs := []int64{0, w.m.Revision()}
		if kv, ok := w.m.Key(key); ok {
			revs = append(revs, kv.ModRevision, kv.ModRevision)
		}
		return CompareAndSwap{
			Key:         key,
			Target:      CompareTarget(rapid.IntRange(0, 4).Draw(t, "target")),
			Value:       w.value(t),
			ModRevision: rapid.SampledFrom(revs).Draw(t, "mod revision"),
			Delete:      rapid.Bool().Draw(t, "delete"),
			NewValue:    w.value(t),
			TTL:         rapid.SampledFrom([]int64{0, keyTTL}).Draw(t, "ttl"),
			SessionID:   w.boundSession(t),
			Actor:       w.actor(t),
		}
	case KindExpireKeys:
		due := w.m.Deadlines().Keys
		keys := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) KeyTTL {
			if len(due) > 0 && rapid.Bool().Draw(t, "due") {
				return rapid.SampledFrom(due).Draw(t, "key ttl")
			}
			return KeyTTL{
				Key:         rapid.SampledFrom(propKeys).Draw(t, "key"),
				ModRevision: rapid.Int64Range(0, w.m.Revision()).Draw(t, "mod revision"),
			}
		}), 0, 3).Draw(t, "keys")
		return ExpireKeys{Epoch: w.epoch(t), Keys: keys}
	case KindEndLockDelays:
		due := w.m.Deadlines().Delays
		delays := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) LockDelay {
			if len(due) > 0 && rapid.IntRange(0, 3).Draw(t, "due") > 0 {
				return rapid.SampledFrom(due).Draw(t, "delay")
			}
			return LockDelay{Lease: w.lease(t), Revision: rapid.Int64Range(0, w.m.Revision()).Draw(t, "revision")}
		}), 0, 2).Draw(t, "delays")
		return EndLockDelays{Epoch: w.epoch(t), Delays: delays}
	case KindCollectLeases:
		due := w.m.Deadlines().Idle
		leases := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) IdleLease {
			if len(due) > 0 && rapid.IntRange(0, 3).Draw(t, "due") > 0 {
				return rapid.SampledFrom(due).Draw(t, "idle lease")
			}
			// Anything else: a busy lease, a stale revision, a deleted one.
			return IdleLease{Lease: w.lease(t), Revision: rapid.Int64Range(0, w.m.Revision()).Draw(t, "revision")}
		}), 0, 3).Draw(t, "leases")
		return CollectLeases{Epoch: w.epoch(t), Leases: leases}
	case KindAskStepDown:
		id := w.lease(t)
		return AskStepDown{Lease: id, Token: w.token(t, id), Reason: "max-hold"}
	case KindSetVersion:
		return SetVersion{Version: rapid.IntRange(0, Version+1).Draw(t, "version")}
	case KindSetPreferred:
		return SetPreferred{Lease: w.lease(t), Identity: rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, "preferred")}
	default:
		return NewEpoch{}
	}
}

// chosenLeaseID is, most of the time, none; otherwise an ID that is free,
// or that a later session's ID will be (so that it needs an alias), or
// one an open session answers to or has as its ID.
func (w *world) chosenLeaseID(t *rapid.T) int64 {
	if rapid.IntRange(0, 2).Draw(t, "choose lease ID") > 0 {
		return 0
	}
	r := w.m.Revision()
	ids := []int64{7, r + 1, r + 2, r + 3, 1<<62 | (r + 2), -1}
	for _, s := range w.m.Sessions() {
		ids = append(ids, s.ID, s.EtcdLeaseID())
	}
	return rapid.SampledFrom(ids).Draw(t, "lease ID")
}

// etcdLease draws the lease a Txn's put attaches its key to: none, an
// open session's, a session's ID that may not be its lease, or nothing
// known.
func (w *world) etcdLease(t *rapid.T) int64 {
	ids := []int64{0, 0, 0, 999}
	for _, s := range w.m.Sessions() {
		ids = append(ids, s.EtcdLeaseID(), s.EtcdLeaseID(), s.ID)
	}
	return rapid.SampledFrom(ids).Draw(t, "etcd lease")
}

// txn draws a Txn over the property keys, nested once at most.
func (w *world) txn(t *rapid.T, depth int) Txn {
	c, kv := w.m.CompactRevision(), w.m.KVRevision()
	key := func(t *rapid.T) string {
		return rapid.SampledFrom(append([]string{"c"}, propKeys...)).Draw(t, "txn key")
	}
	end := func(t *rapid.T) string {
		return rapid.SampledFrom([]string{"", "", "b", "\x00", "a"}).Draw(t, "txn end")
	}
	compare := rapid.Custom(func(t *rapid.T) TxnCompare {
		return TxnCompare{
			Key:    key(t),
			End:    end(t),
			Target: TxnTarget(rapid.IntRange(1, 5).Draw(t, "compare target")),
			Op:     CmpOp(rapid.IntRange(1, 4).Draw(t, "compare op")),
			Number: rapid.SampledFrom([]int64{0, 1, 2, kv, kv - 1, w.m.Revision()}).Draw(t, "compare number"),
			Value:  w.value(t),
		}
	})
	op := rapid.Custom(func(t *rapid.T) TxnOp {
		kinds := []TxnOpType{OpPut, OpPut, OpPut, OpDelete, OpRange}
		if depth == 0 {
			kinds = append(kinds, OpTxn)
		}
		switch typ := rapid.SampledFrom(kinds).Draw(t, "op type"); typ {
		case OpPut:
			return TxnOp{
				Type:        OpPut,
				Key:         key(t),
				Value:       w.value(t),
				Lease:       w.etcdLease(t),
				IgnoreValue: rapid.IntRange(0, 5).Draw(t, "ignore value") == 0,
				IgnoreLease: rapid.IntRange(0, 5).Draw(t, "ignore lease") == 0,
			}
		case OpDelete:
			return TxnOp{Type: OpDelete, Key: key(t), End: end(t)}
		case OpRange:
			revs := []int64{0, 0, kv, kv - 1, c, c - 1, kv + 1}
			return TxnOp{Type: OpRange, Key: key(t), End: end(t), Revision: rapid.SampledFrom(revs).Draw(t, "range revision")}
		default:
			nested := w.txn(t, depth+1)
			return TxnOp{Type: OpTxn, Txn: &nested}
		}
	})
	txn := Txn{
		Compares: rapid.SliceOfN(compare, 0, 2).Draw(t, "compares"),
		Success:  rapid.SliceOfN(op, 0, 3).Draw(t, "success"),
		Failure:  rapid.SliceOfN(op, 0, 2).Draw(t, "failure"),
	}
	if depth == 0 {
		txn.Actor = w.actor(t)
	}
	return txn
}

// head is the session a lease's queue q grants next: the first waiter
// with the preferred identity, else the first.
func (w *world) head(id LeaseID, q []int64) int64 {
	l, _ := w.m.Lease(id)
	for _, sid := range q {
		if s, ok := w.identity(sid); ok && l.PreferredHolder != "" && s == l.PreferredHolder {
			return sid
		}
	}
	return q[0]
}

// identity is a session's identity, from the state or, for one ended in
// this command, from its opening.
func (w *world) identity(sid int64) (string, bool) {
	if s, ok := w.m.Session(sid); ok {
		return s.Identity, true
	}
	id, ok := w.identities[sid]
	return id, ok
}

// actor draws who proposes a command that acts on a session or grant:
// mostly a node (nil), else a principal that may act as "a", one that may
// act as "b", or an admin.
func (w *world) actor(t *rapid.T) *Actor {
	return rapid.SampledFrom([]*Actor{nil, nil, nil,
		{Principal: "pa", Identities: []string{"a"}},
		{Principal: "pb", Identities: []string{"b", "session-*"}},
		{Principal: "root", Breaker: true},
	}).Draw(t, "actor")
}

// boundSession is no session most of the time.
func (w *world) boundSession(t *rapid.T) int64 {
	if rapid.IntRange(0, 2).Draw(t, "bound") > 0 {
		return 0
	}
	return w.session(t)
}

// step applies a command and checks the safety rules on its result.
func (w *world) step(t *rapid.T, now int64, cmd Command) Result {
	t.Helper()
	m := w.m
	before := snapshotBytes(t, m)
	pre := map[LeaseID]Lease{}
	for _, l := range m.Leases("") {
		pre[l.LeaseID] = l
	}
	refuse := w.ownerRefuses(cmd, pre)
	rev := m.Revision()
	res := m.Apply(now, cmd)
	checkRevisions(t, rev, m, res)
	if got := errors.Is(res.Err, ErrNotOwner); got != refuse {
		t.Fatalf("%T %+v (actor %+v): refused as not owner: got = %v (%v), expected: %v", cmd, cmd, ActorOf(cmd), got, res.Err, refuse)
	}

	if res.Err != nil {
		if len(res.Events) != 0 {
			t.Fatalf("%T failed with %v: events: got = %v, expected: none", cmd, res.Err, eventTypes(res))
		}
		if after := snapshotBytes(t, m); !bytes.Equal(before, after) {
			t.Fatalf("%T failed with %v: state:\ngot = %s\nexpected: %s", cmd, res.Err, after, before)
		}
		if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(res.Err, s) }) {
			t.Fatalf("%T: error %v wraps no sentinel of the package", cmd, res.Err)
		}
	}
	w.checkToken(t, cmd, pre, res)
	w.checkEvents(t, cmd, pre, res)
	checkInvariants(t, m)
	w.checkTxn(t, cmd, res)
	w.recordKeys(res)
	w.checkKeyHistory(t, false)

	for _, e := range res.Events {
		switch e.Type {
		case EventSessionOpened:
			w.sessions = append(w.sessions, e.SessionID)
			w.identities[e.SessionID] = e.Session.Identity
		case EventLeaseAcquired:
			w.tokens[e.Lease] = append(w.tokens[e.Lease], e.Token)
		}
	}
	return res
}

// ownerRefuses reports whether rule 10 refuses cmd: from cluster version
// 4, an actor acting on a session or a grant whose identity it may not
// use, unless it only ends it as an admin. pre is the leases before cmd.
func (w *world) ownerRefuses(cmd Command, pre map[LeaseID]Lease) bool {
	a := ActorOf(cmd)
	if a == nil || w.m.ClusterVersion() < 4 {
		return false
	}
	session := func(id int64) (string, bool) {
		s, ok := w.m.Session(id)
		return s.Identity, ok
	}
	grant := func(id LeaseID, token int64) (string, bool) {
		for _, g := range pre[id].Holders {
			if g.Token == token {
				return g.Holder, true
			}
		}
		return "", false
	}
	var identity string
	var found, ending bool
	switch c := cmd.(type) {
	case Txn:
		return w.m.usesKVRevision() && w.txnRefused(&c, a)
	case CloseSession:
		identity, found = session(c.SessionID)
		ending = true
	case Acquire:
		identity, found = session(c.SessionID)
	case CancelWait:
		_, known := pre[c.Lease]
		identity, found = session(c.SessionID)
		found = found && known
	case Put:
		identity, found = session(c.SessionID)
		found = found && c.SessionID != 0
	case CompareAndSwap:
		identity, found = session(c.SessionID)
		found = found && c.SessionID != 0 && !c.Delete
	case Release:
		identity, found = grant(c.Lease, c.Token)
		ending = true
	case SetValue:
		identity, found = grant(c.Lease, c.Token)
	}
	if !found || ending && a.Breaker {
		return false
	}
	return !slices.ContainsFunc(a.Identities, func(p string) bool { return matchPattern(p, identity) })
}

// txnRefused reports whether rule 10 refuses a Txn: a put on the branches
// its compares choose binds a key to the session of another identity,
// and no check before it fails otherwise. Checks run in etcd's order:
// every put (the key a put ignores the value or lease of exists, then
// its lease), and the ranges only after them.
func (w *world) txnRefused(c *Txn, a *Actor) bool {
	current, _ := w.m.Range("", 0)
	var walk func(c *Txn) (refused, failed bool)
	walk = func(c *Txn) (refused, failed bool) {
		for _, op := range c.branch(modelCompares(current, c.Compares)) {
			switch op.Type {
			case OpPut:
				if (op.IgnoreValue || op.IgnoreLease) && !slices.ContainsFunc(current, func(kv KeyValue) bool { return kv.Key == op.Key }) {
					return false, true
				}
				if op.Lease != 0 {
					i := slices.IndexFunc(w.m.Sessions(), func(s Session) bool { return s.EtcdLeaseID() == op.Lease })
					if i < 0 {
						return false, true
					}
					identity := w.m.Sessions()[i].Identity
					if !slices.ContainsFunc(a.Identities, func(p string) bool { return matchPattern(p, identity) }) {
						return true, false
					}
				}
			case OpTxn:
				if op.Txn == nil {
					return false, true
				}
				if refused, failed := walk(op.Txn); refused || failed {
					return refused, failed
				}
			}
		}
		return false, false
	}
	refused, _ := walk(c)
	return refused
}

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
		head := max(l.preferredWaiter(), 0)
		// Version 1 let a waiter leave the head of a queue without
		// letting the next one in; version 2 fixed it.
		if m.atLeast(2) && len(l.Waiters) > 0 && fits(l.Holders, l.Capacity, l.Waiters[head].Exclusive) && l.DelayRevision == 0 {
			t.Fatalf("%v: waiters %v are left waiting with %d of %d places taken and no lock-delay", l.LeaseID, l.Waiters, len(l.Holders), l.Capacity)
		}
		if (l.IdleSince != 0) != (l.Idle() && l.GCAfter > 0) {
			t.Fatalf("%v: idle since %d with %d holders, %d waiters, delay revision %d, gc_after %d", l.LeaseID, l.IdleSince, len(l.Holders), len(l.Waiters), l.DelayRevision, l.GCAfter)
		}
		// Holders are in the preferred waiter's way when it does not fit
		// beside them; one that fits waits only for a lock-delay.
		if pw := l.preferredWaiter(); len(l.Holders) > 0 && pw >= 0 && !fits(l.Holders, l.Capacity, l.Waiters[pw].Exclusive) &&
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

func TestProperties(t *testing.T) {
	t.Run("the safety rules hold after every command", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			w := newWorld()
			w.start(t)
			steps := rapid.IntRange(1, 100).Draw(t, "steps")
			for range steps {
				cmd := w.draw(t)
				w.step(t, w.tick(t), cmd)
			}
			w.checkKeyHistory(t, true)
		})
	})

	t.Run("a restored snapshot has identical state and identical future behaviour", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			w := newWorld()
			w.start(t)
			for range rapid.IntRange(0, 60).Draw(t, "steps before") {
				cmd := w.draw(t)
				w.step(t, w.tick(t), cmd)
			}
			snap := snapshotBytes(t, w.m)

			// Restore replaces whatever state the machine had.
			other := newWorld()
			for range rapid.IntRange(0, 10).Draw(t, "steps of the other machine") {
				cmd := other.draw(t)
				other.step(t, other.tick(t), cmd)
			}
			restored := other.m
			if err := restored.Restore(bytes.NewReader(snap)); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if got := snapshotBytes(t, restored); !bytes.Equal(got, snap) {
				t.Fatalf("restored snapshot:\ngot = %s\nexpected: %s", got, snap)
			}
			expect(t, "revision", restored.Revision(), w.m.Revision())
			expect(t, "epoch", restored.Epoch(), w.m.Epoch())
			expect(t, "identities", restored.identities, w.m.identities)
			expect(t, "bytes held, counted as applied and counted on restore", restored.Usage(), w.m.Usage())
			expect(t, "deadlines", restored.Deadlines(), w.m.Deadlines())
			for _, s := range w.m.Sessions() {
				h1, w1, n1 := w.m.SessionHoldings(s.ID)
				h2, w2, n2 := restored.SessionHoldings(s.ID)
				expect(t, "holdings", [3]any{h2, w2, n2}, [3]any{h1, w1, n1})
			}
			checkInvariants(t, restored)

			for range rapid.IntRange(0, 60).Draw(t, "steps after") {
				cmd := w.draw(t)
				now := w.tick(t)
				expected := w.step(t, now, cmd)
				got := restored.Apply(now, cmd)
				compareResults(t, cmd, expected, got)
			}
			if a, b := snapshotBytes(t, w.m), snapshotBytes(t, restored); !bytes.Equal(a, b) {
				t.Fatalf("final snapshot of the restored machine:\ngot = %s\nexpected: %s", b, a)
			}
		})
	})

	t.Run("two machines applying the same commands write the same snapshot", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			w := newWorld()
			twin := New()
			if v := rapid.SampledFrom([]int{0, 5}).Draw(t, "start version"); v > 0 {
				compareResults(t, v5, w.step(t, w.tick(t), v5), twin.Apply(w.now, v5))
			}
			for range rapid.IntRange(1, 80).Draw(t, "steps") {
				cmd := w.draw(t)
				now := w.tick(t)
				compareResults(t, cmd, w.step(t, now, cmd), twin.Apply(now, cmd))
			}
			if a, b := snapshotBytes(t, w.m), snapshotBytes(t, twin); !bytes.Equal(a, b) {
				t.Fatalf("snapshot of the twin:\ngot = %s\nexpected: %s", b, a)
			}
		})
	})
}
