package sim

// The invariants. Most are checked as the thing they speak of happens,
// which is at every step that could break them: an election won, an
// entry applied, a grant learnt, a heartbeat acknowledged. The one-holder
// rule is checked after every step; linearizability and the survival of
// acknowledged writes once at the end, on the whole history.

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/internal/linearizability"
	"github.com/tenurehq/tenure/statemachine"
)

// Invariant names, as a violation reports them.
const (
	invOneLeader    = "at most one leader per term"
	invCommitted    = "a committed entry never changes or disappears"
	invSameSequence = "replicas apply the same sequence"
	invOneHolder    = "at most one valid holder of a lock"
	invTokens       = "fencing tokens strictly rise"
	invSessionTTL   = "no session ends before its TTL after its last acknowledged heartbeat"
	invAckedWrites  = "acknowledged writes survive"
	invLinearizable = "client histories are linearizable"
	invWatch        = "watches deliver each event once, in order"
	invRepairs      = "a member whose log is damaged starts and repairs it without an operator"
)

type committedEntry struct {
	term      uint64
	digest    uint64
	revision  int64
	underTerm uint64 // the highest term won anywhere when it was first applied
}

type checker struct {
	s         *Sim
	leaders   map[uint64]uint64 // term → leader
	maxTerm   uint64            // the highest term won
	committed map[uint64]committedEntry
	maxCommit uint64

	lastToken map[statemachine.LeaseID]int64 // in log order
	grants    map[grantRef]int64             // token granted in the log

	beats   map[int64]int64 // session → latest acknowledged heartbeat send time + TTL
	expired map[int64]int64 // session → when its expiry was first applied

	kvOps, leaseOps []porcupine.Operation

	// For acknowledged writes: per key, every value written, and when
	// each write was acknowledged (0: not, or unknown).
	writes map[string]map[string]*write

	// keyEvents are the committed key events by KV revision, in the
	// order their command made them: what a watch must deliver.
	keyEvents map[int64][]statemachine.Event
}

type write struct {
	acked   bool
	ackedAt int64
	callAt  int64
}

func newChecker(s *Sim) *checker {
	return &checker{
		s: s, leaders: map[uint64]uint64{}, committed: map[uint64]committedEntry{},
		lastToken: map[statemachine.LeaseID]int64{}, grants: map[grantRef]int64{},
		beats: map[int64]int64{}, expired: map[int64]int64{},
		writes: map[string]map[string]*write{}, keyEvents: map[int64][]statemachine.Event{},
	}
}

func (c *checker) count(name string) { c.s.stats.Checks[name]++ }

func (c *checker) leader(id, term uint64) {
	c.count(invOneLeader)
	if other, ok := c.leaders[term]; ok && other != id {
		c.s.fail(invOneLeader, "nodes %d and %d both lead term %d", other, id, term)
	}
	c.leaders[term] = id
	c.maxTerm = max(c.maxTerm, term)
}

// leaderComplete is raft's Leader Completeness property, checked when a
// node becomes leader of term T: its log holds every entry committed in
// a term before T, as it was applied. Such an entry is one first applied
// while the highest term anyone had won was below T (the entry was
// committed by a leader of that term or earlier). A leader of a stale
// term may lack later entries: it can commit nothing, since everyone
// who made them commit is past its term.
func (c *checker) leaderComplete(n *node, term uint64) {
	c.count(invCommitted)
	need := uint64(0)
	for i := c.maxCommit; i > 0; i-- {
		if e, ok := c.committed[i]; ok && e.underTerm < term {
			need = i
			break
		}
	}
	if need == 0 {
		return
	}
	if last := lastIndex(n.ms); last < need {
		c.s.fail(invCommitted, "node %d leads term %d with a log that ends at %d, but index %d was committed in an earlier term", n.id, term, last, need)
	}
	first, _ := n.ms.FirstIndex()
	if first > need {
		return
	}
	ents, err := n.ms.Entries(first, need+1, 1<<62)
	if err != nil {
		return
	}
	for _, e := range ents {
		if want, ok := c.committed[e.Index]; ok && want.digest != digest(e) {
			c.s.fail(invCommitted, "node %d leads term %d with entry %d of term %d, but the entry committed there was of term %d", n.id, term, e.Index, e.Term, want.term)
		}
	}
}

// applied is called for every entry a node applies, before n.applied
// moves: the node must apply in index order, and the entry at an index
// (and the state after it) must be the same on every node, for the
// whole run. The first application anywhere also checks the entry's
// effects, once for the cluster.
func (c *checker) applied(n *node, ent raftpb.Entry, res statemachine.Result, revision int64) {
	c.count(invSameSequence)
	c.count(invCommitted)
	if ent.Index != n.applied+1 {
		c.s.fail(invSameSequence, "node %d applied index %d after index %d", n.id, ent.Index, n.applied)
	}
	d := digest(ent)
	prev, ok := c.committed[ent.Index]
	if !ok {
		c.committed[ent.Index] = committedEntry{term: ent.Term, digest: d, revision: revision, underTerm: c.maxTerm}
		c.maxCommit = max(c.maxCommit, ent.Index)
		c.events(res)
		return
	}
	if prev.digest != d {
		c.s.fail(invCommitted, "node %d applied entry %d of term %d, but the entry committed there was of term %d", n.id, ent.Index, ent.Term, prev.term)
	}
	if prev.revision != revision {
		c.s.fail(invSameSequence, "node %d is at revision %d after entry %d; the first node to apply it was at %d", n.id, revision, ent.Index, prev.revision)
	}
}

func (c *checker) restored(n *node, index uint64, revision int64) {
	if prev, ok := c.committed[index]; ok && prev.revision != revision {
		c.s.fail(invSameSequence, "node %d restored a snapshot at %d with revision %d; the entry there left revision %d", n.id, index, revision, prev.revision)
	}
}

// events checks an entry's effects in log order: grants' tokens, and
// expiries against the heartbeats clients had acknowledged; and records
// its key events for the watches.
func (c *checker) events(res statemachine.Result) {
	for _, ev := range res.Events {
		if ev.Type.IsKey() && ev.KV != nil {
			c.keyEvents[ev.KV.ModRevision] = append(c.keyEvents[ev.KV.ModRevision], ev)
		}
		switch ev.Type {
		case statemachine.EventLeaseAcquired:
			c.count(invTokens)
			if ev.Token <= c.lastToken[ev.Lease] {
				c.s.fail(invTokens, "lease %s granted token %d after token %d", ev.Lease, ev.Token, c.lastToken[ev.Lease])
			}
			c.lastToken[ev.Lease] = ev.Token
			c.grants[grantRef{ev.Lease, ev.SessionID}] = ev.Token
		case statemachine.EventSessionExpired:
			c.count(invSessionTTL)
			if _, seen := c.expired[ev.SessionID]; !seen {
				c.expired[ev.SessionID] = c.s.now
			}
			if until, ok := c.beats[ev.SessionID]; ok && c.s.now < until {
				c.s.fail(invSessionTTL, "session %d expired at %s, before %s: TTL after a heartbeat it acknowledged", ev.SessionID, fmtTime(c.s.now), fmtTime(until))
			}
		}
	}
}

// grantRef is a session's grant of a lease. A session holds a mutex at
// most once at a time, and the checker keeps only the latest token.
type grantRef struct {
	lease   statemachine.LeaseID
	session int64
}

// granted is a client learning that it holds lease with token.
func (c *checker) granted(cl *client, lease statemachine.LeaseID, token int64) {
	c.count(invTokens)
	if logged, ok := c.grants[grantRef{lease, cl.session}]; ok && logged != token {
		c.s.fail(invTokens, "client %d was told token %d for %s; the log granted its session %d token %d", cl.id, token, lease, cl.session, logged)
	}
	// Clients may learn of grants out of token order: the answer to a
	// waiter whose grant already ended (its session expired meanwhile)
	// can arrive after the next holder's (seed 108216). That is what
	// fencing is for; a resource that remembers the highest token it saw
	// refuses the older one. So only the log's order is checked.
}

// beatAcked is a client's heartbeat (or open) sent at sent being
// acknowledged: the session must not end before sent + ttl.
func (c *checker) beatAcked(session, sent, ttl int64) {
	c.count(invSessionTTL)
	until := sent + ttl
	if at, ok := c.expired[session]; ok && at < until {
		c.s.fail(invSessionTTL, "session %d had a heartbeat sent at %s acknowledged, but expired at %s, before its TTL of %s",
			session, fmtTime(sent), fmtTime(at), time.Duration(ttl))
	}
	c.beats[session] = max(c.beats[session], until)
}

// step runs after every step: at most one client trusts a grant of
// each lock.
func (c *checker) step() {
	c.count(invOneHolder)
	var holders [2]*client
	for _, cl := range c.s.clients {
		if !cl.held {
			continue
		}
		i := 0
		if cl.kind == mutexClient {
			i = 1
			if c.s.now >= cl.validUntil() {
				continue
			}
		}
		if other := holders[i]; other != nil {
			c.s.fail(invOneHolder, "clients %d (token %d) and %d (token %d) both hold %s", other.id, other.token, cl.id, cl.token, []string{"lin/a", "mx/b"}[i])
		}
		holders[i] = cl
	}
}

// watchDelivered checks a batch of events that reached watch client w
// from node n, revision by revision: each revision is above the last it
// received (not twice, not out of order), no revision between holds a
// committed event of its keys (nothing missing since the start of its
// span), and the revision's events are the committed ones of its keys,
// all of them, in order, each equal in key, value, type and revision.
func (c *checker) watchDelivered(w *watchClient, n *node, evs []statemachine.Event) {
	c.count(invWatch)
	for i := 0; i < len(evs); {
		rev := evs[i].Revision
		j := i
		for j < len(evs) && evs[j].Revision == rev {
			j++
		}
		got := evs[i:j]
		i = j
		if rev <= w.last {
			c.s.fail(invWatch, "%s got revision %d from n%d after revision %d: delivered twice or out of order", w.name(), rev, n.id, w.last)
		}
		for q := w.last + 1; q < rev; q++ {
			if want := c.watched(w, q); len(want) > 0 {
				c.s.fail(invWatch, "%s (from revision %d) got revision %d from n%d after %d: revision %d, %s, is missing", w.name(), w.from, rev, n.id, w.last, q, describeEvent(want[0]))
			}
		}
		want := c.watched(w, rev)
		if len(got) != len(want) {
			c.s.fail(invWatch, "%s got %d events of revision %d from n%d; %d were committed there for its keys", w.name(), len(got), rev, n.id, len(want))
		}
		for k, e := range got {
			if !sameKeyEvent(e, want[k]) {
				c.s.fail(invWatch, "%s got %s from n%d; the committed event is %s", w.name(), describeEvent(e), n.id, describeEvent(want[k]))
			}
		}
		w.last = rev
		c.s.stats.WatchEvents += len(got)
	}
}

// watched is the committed events of revision rev that w watches.
func (c *checker) watched(w *watchClient, rev int64) []statemachine.Event {
	var evs []statemachine.Event
	for _, e := range c.keyEvents[rev] {
		if w.wants(e.KV.Key) {
			e.Revision = rev // a feed names an event by its KV revision
			evs = append(evs, e)
		}
	}
	return evs
}

// sameKeyEvent compares what a watch promises of an event: key, value
// (a deletion has none), type and revision.
func sameKeyEvent(a, b statemachine.Event) bool {
	return a.Type == b.Type && a.Revision == b.Revision && a.KV.ModRevision == b.KV.ModRevision &&
		a.KV.Key == b.KV.Key && (a.Type != statemachine.EventKeyPut || a.KV.Value == b.KV.Value)
}

func describeEvent(e statemachine.Event) string {
	return fmt.Sprintf("%s %s=%q at revision %d", e.Type, e.KV.Key, e.KV.Value, e.Revision)
}

func (c *checker) wrote(key, val string) {
	if c.writes[key] == nil {
		c.writes[key] = map[string]*write{}
	}
	c.writes[key][val] = &write{callAt: c.s.now}
}

func (c *checker) putDone(key, val string, acked bool) {
	if w := c.writes[key][val]; w != nil && acked {
		w.acked, w.ackedAt = true, c.s.now
	}
}

// final checks what only the whole run can show.
func (c *checker) final() {
	// The cluster, healed, must still hold every committed entry: the
	// leader's log reaches the highest index ever applied and agrees
	// with it wherever it still holds entries.
	var lead *node
	for _, n := range c.s.nodes {
		if n.up && n.failed == "" && n.role == 2 /* StateLeader */ {
			lead = n
		}
	}
	if lead != nil {
		c.count(invCommitted)
		if last := lastIndex(lead.ms); last < c.maxCommit {
			c.s.fail(invCommitted, "leader %d's log ends at %d, but index %d was committed", lead.id, last, c.maxCommit)
		}
		first, _ := lead.ms.FirstIndex()
		if first <= c.maxCommit {
			ents, err := lead.ms.Entries(first, c.maxCommit+1, 1<<62)
			if err == nil {
				for _, e := range ents {
					if want := c.committed[e.Index]; want.digest != 0 && want.digest != digest(e) {
						c.s.fail(invCommitted, "leader %d holds entry %d of term %d, but the entry committed there was of term %d", lead.id, e.Index, e.Term, want.term)
					}
				}
			}
		}
	} else {
		c.s.tracef(0, "no leader after the heal phase: the final log check is skipped")
		c.s.stats.Checks["no leader after heal"]++
	}
	// Acknowledged writes are read from a node that has applied every
	// committed entry, the leader or not.
	var full *node
	for _, n := range c.s.nodes {
		if n.up && n.failed == "" && n.applied >= c.maxCommit && (full == nil || n == lead) {
			full = n
		}
	}
	if full != nil {
		c.ackedWritesSurvive(full)
	} else {
		c.s.stats.Checks["no node applied every committed entry"]++
	}
	c.linearizable()
}

// ackedWritesSurvive: every acknowledged write is readable unless
// overwritten. Each key's value on a node that applied everything
// committed must have been written by a client, and no write
// acknowledged after that value's own write was called may be missing
// (it would have overwritten it).
func (c *checker) ackedWritesSurvive(lead *node) {
	for _, key := range kvKeys {
		c.count(invAckedWrites)
		kv, found := lead.m.Key(key)
		ws := c.writes[key]
		if !found {
			for v, w := range ws {
				if w.acked {
					c.s.fail(invAckedWrites, "key %s is absent, but the write of %q was acknowledged", key, v)
				}
			}
			continue
		}
		w, ok := ws[kv.Value]
		if !ok {
			c.s.fail(invAckedWrites, "key %s holds %q, which no client wrote", key, kv.Value)
		}
		// A write acknowledged before this one was called must have been
		// overwritten by it, never the reverse: the value must not be
		// older than an acknowledged write that followed it in real time.
		for v, o := range ws {
			if o.acked && w.acked && o.callAt > w.ackedAt {
				c.s.fail(invAckedWrites, "key %s holds %q, acknowledged at %s, but %q was written after that (called %s) and acknowledged: it was lost",
					key, kv.Value, fmtTime(w.ackedAt), v, fmtTime(o.callAt))
			}
		}
	}
}

func (c *checker) linearizable() {
	for _, h := range []struct {
		name  string
		model porcupine.Model
		ops   []porcupine.Operation
	}{
		{"kv", linearizability.KVModel.ToModel(), c.kvOps},
		{"lease", linearizability.LeaseModel.ToModel(), c.leaseOps},
	} {
		c.count(invLinearizable)
		ops := slices.Clone(h.ops)
		res := porcupine.CheckOperationsTimeout(h.model, ops, 20*time.Second)
		switch res {
		case porcupine.Illegal:
			c.s.fail(invLinearizable, "the %s history of %d operations is not linearizable (%s)", h.name, len(ops), describeOps(h.model, ops))
		case porcupine.Unknown:
			c.s.stats.Checks["linearizability timed out"]++
		}
	}
}

func describeOps(m porcupine.Model, ops []porcupine.Operation) string {
	const show = 6
	var s []string
	for _, op := range ops[max(0, len(ops)-show):] {
		s = append(s, fmt.Sprintf("c%d %s", op.ClientId, m.DescribeOperation(op.Input, op.Output)))
	}
	return "last: " + fmt.Sprint(s)
}
