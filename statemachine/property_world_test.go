package statemachine

import (
	"bytes"
	"errors"
	"slices"
	"time"

	"pgregory.net/rapid"
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
