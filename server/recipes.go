package server

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/tenurehq/tenure/statemachine"
)

// recipeTracker follows etcd's recipe locks (statemachine.RecipeLocks)
// through the applied key events, for what their keys do not say: when
// each contender's key was created, and when the holder became the
// holder ("since"). It also counts their grants, waits and holds in the
// per-lease metrics.
//
// Why here and not in the replicated state: the keys carry no time, and
// recording one would change the snapshot format and need a cluster
// version gate, for a display field. Every node applies the same events
// with the leader's time in them, so every node that saw a handover
// tells the same since. What a node did not see — a holder that took
// over before this process started and before the snapshot it restored
// — it does not guess: since is unknown (0), shown as such, until the
// lock changes hands again. Replayed log entries carry their own times,
// so a restart learns whatever happened after its snapshot.
//
// The index holds only recipe keys, so each event costs a lookup in the
// contenders of one prefix, never a range over the keyspace.
type recipeTracker struct {
	metrics *leaseMetrics

	mu    sync.Mutex              // guards locks
	locks map[string]*recipeTrack // by prefix
}

// recipeTrack is one lock's contenders as the events showed them.
type recipeTrack struct {
	contenders []trackedContender // by create revision: the first holds
	since      int64              // when contenders[0] became the holder; 0: unknown
}

type trackedContender struct {
	key     string
	create  int64
	session int64
	joined  int64 // when its key was created; 0: unknown
}

func newRecipeTracker(lm *leaseMetrics) *recipeTracker {
	return &recipeTracker{metrics: lm, locks: map[string]*recipeTrack{}}
}

// reset starts again from m, the state a snapshot restore just put in
// place, with every time unknown. It runs under the state's write lock,
// before any command applies to m: the next command's events then move
// the index from exactly the state they start from. (Seeding at the
// next command instead, from the state that command left, lost that
// command's handover.) A node that starts with no snapshot starts with
// an empty state and an empty index, which agree.
func (rt *recipeTracker) reset(m *statemachine.Machine) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	clear(rt.locks)
	if m == nil {
		return
	}
	for _, l := range m.RecipeLocks() {
		t := &recipeTrack{}
		for _, c := range l.Contenders {
			t.contenders = append(t.contenders, trackedContender{key: c.Key, create: c.CreateRevision, session: c.SessionID})
		}
		rt.locks[l.Prefix] = t
	}
}

// observe follows one command's key events. It runs on the FSM
// goroutine under the state write lock (Server.observe), after the
// command: m is the state it left. Maps and counters only.
func (rt *recipeTracker) observe(m *statemachine.Machine, events []statemachine.Event) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var expired map[int64]bool // sessions this command expired
	for i := range events {
		if e := &events[i]; e.Type == statemachine.EventSessionExpired {
			if expired == nil {
				expired = map[int64]bool{}
			}
			expired[e.SessionID] = true
		}
	}
	for i := range events {
		e := &events[i]
		if e.KV == nil {
			continue
		}
		key := e.KV.Key
		// A deletion, or a put that detached the key from its lease,
		// takes the key out of its lock.
		pfx, isRecipe := statemachine.RecipePrefix(key, e.KV.EtcdLease())
		if isRecipe = isRecipe && e.Type == statemachine.EventKeyPut; !isRecipe {
			pfx = recipePrefixOf(key)
		}
		t := rt.locks[pfx]
		if t == nil && !isRecipe {
			continue
		}
		if t == nil {
			t = &recipeTrack{}
			rt.locks[pfx] = t
		}
		before, held := t.holder()
		at := slices.IndexFunc(t.contenders, func(c trackedContender) bool { return c.key == key })
		switch {
		case isRecipe && at < 0:
			c := trackedContender{key: key, create: e.KV.CreateRevision, session: e.KV.SessionID, joined: e.Time}
			n, _ := slices.BinarySearchFunc(t.contenders, c.create, func(c trackedContender, rev int64) int {
				return cmp.Compare(c.create, rev)
			})
			t.contenders = slices.Insert(t.contenders, n, c)
		case isRecipe:
			// An election's proclamation, or a lock taken again: the
			// same key, the same create revision.
		case at >= 0:
			t.contenders = slices.Delete(t.contenders, at, at+1)
		}
		if after, holds := t.holder(); held != holds || after.key != before.key || after.create != before.create {
			rt.handoverLocked(pfx, t, before, held, e, expired)
		}
		if len(t.contenders) == 0 {
			delete(rt.locks, pfx)
		}
	}
}

// handoverLocked records that the holder of t changed at event e: the
// old holder's hold ended, the new one's (if any) began.
func (rt *recipeTracker) handoverLocked(pfx string, t *recipeTrack, before trackedContender, held bool, e *statemachine.Event, expired map[int64]bool) {
	holdSince := t.since
	t.since = 0
	var next *trackedContender
	if len(t.contenders) > 0 {
		next = &t.contenders[0]
		t.since = e.Time
	}
	rt.metrics.recipeHandover(pfx, recipeChange{
		time:      e.Time,
		ended:     held,
		heldSince: holdSince,
		expired:   held && expired[before.session],
		granted:   next != nil,
		// A key that waited: created before this event. One that
		// holds from its own creation did not wait.
		waitedSince: waitedSince(next, e),
		idle:        next == nil,
	})
}

func waitedSince(next *trackedContender, e *statemachine.Event) int64 {
	if next == nil || next.joined == 0 || next.key == e.KV.Key {
		return 0
	}
	return next.joined
}

// holder is the contender holding the lock, if any.
func (t *recipeTrack) holder() (trackedContender, bool) {
	if len(t.contenders) == 0 {
		return trackedContender{}, false
	}
	return t.contenders[0], true
}

// times returns when l's holder became the holder and when each of its
// contenders' keys was created (0: not seen by this node). Called under
// the state's read lock with l read from that state, so the index and l
// agree; a contender that does not match (another create revision) is
// unknown all the same.
func (rt *recipeTracker) times(l statemachine.RecipeLock) (since int64, joined []int64) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	joined = make([]int64, len(l.Contenders))
	t := rt.locks[l.Prefix]
	if t == nil {
		return 0, joined
	}
	for i, c := range l.Contenders {
		at := slices.IndexFunc(t.contenders, func(tc trackedContender) bool { return tc.key == c.Key && tc.create == c.CreateRevision })
		if at < 0 {
			continue
		}
		joined[i] = t.contenders[at].joined
		if i == 0 && at == 0 {
			since = t.since
		}
	}
	return since, joined
}

// recipePrefixOf is the prefix key would contend under: up to its last
// "/", or "" when it has none.
func recipePrefixOf(key string) string { return key[:strings.LastIndexByte(key, '/')+1] }
