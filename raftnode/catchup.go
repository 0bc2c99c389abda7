package raftnode

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// A node whose log lost entries it may have acknowledged — damage that
// a repair cut off, synced batches, perhaps counted toward a commit —
// must not help elect a leader that lacks them: with its shorter log it
// would vote for such a candidate, and a committed write would be lost
// (Alagappan et al., FAST '18, showed etcd, ZooKeeper and LogCabin doing
// just that from one damaged entry on one node). So the repair records
// where the log ended before the cut, the catch-up point (the last index
// it may have held, and a term no lower than that entry's: the hard
// state's, since no entry is of a later term than the node's own),
// durably in the meta store. Until the log reaches that index again, or
// ends in an entry of a later term than the point's (it then holds the
// log of a leader of that term, and with it every entry committed in the
// node's own terms: an acknowledgement counts only toward its own term's
// commits), and the leader's heartbeat shows nothing more is owed, the
// node
//
//   - votes and pre-votes by raft's up-to-date rule against the catch-up
//     point rather than its shortened log: as it would have voted had it
//     kept every entry, so no candidate without them gets its vote, and
//     a candidate that holds them (the cluster's most up-to-date member)
//     can still be elected with it. (Refusing every vote instead, the
//     first version of this rule, stopped a cluster for good when two of
//     three members were catching up at once: internal/sim's seed 53,
//     docs/testing.md.)
//   - never campaigns (its election clock does not tick, and a
//     leadership transfer to it is dropped): its own log lacks entries,
//     and a voter behind it would elect it.
//   - steps the leader's heartbeats with their commit index cut to its
//     log's end (raft would panic past it, commitTo, and checkLog would
//     take it for a lost data dir), so that it answers them and the
//     leader's check-quorum counts it active;
//   - and asks the leader to hand its leadership on. raft's leader never
//     moves a follower's progress back below what the follower once
//     acknowledged (Progress.Match, even when probing), so it would
//     resend from past the hole forever; only a new term's leader starts
//     every follower's progress afresh, and probes back to where this
//     log ends. The request is a MsgUnreachable sent over the wire,
//     which raft otherwise only ever raises locally; the leader answers
//     it by transferring leadership to its most up-to-date other voter,
//     at most once per failover (HandOvers: twice Config.ElectionTimeout).
//     A cluster of two voters has no one to hand over to, and waits for
//     an operator (docs/operations.md).
//
// catchUpKey holds the catch-up index in the meta store, and
// catchUpTermKey the catch-up point's term; absent or 0: none. A term of
// 0 with an index (the hard state could not be read at the repair)
// makes the node refuse every vote until it has caught up.
var (
	catchUpKey     = []byte("tenure_catch_up")
	catchUpTermKey = []byte("tenure_catch_up_term")
)

// membersKey holds how many members (voters and learners) the applied
// configuration has, for a start that finds its log damaged: with
// others to catch up from, the node repairs itself; alone it refuses.
var membersKey = []byte("tenure_members")

// loadCatchUp reads the catch-up point at start.
func (e *engine) loadCatchUp() error {
	v, err := e.disk.meta.GetUint64(catchUpKey)
	if err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return fmt.Errorf("raftnode: read the catch-up index: %w", err)
	}
	term, err := e.disk.meta.GetUint64(catchUpTermKey)
	if err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return fmt.Errorf("raftnode: read the catch-up term: %w", err)
	}
	e.catchUp.Store(v)
	e.catchUpTerm.Store(term)
	if v > 0 {
		e.n.log.Warn("raft: this node's log lost entries it may have acknowledged; until it holds them again from the leader it votes only for a candidate whose log reaches where its own did, and does not campaign",
			"catch_up_to", v, "catch_up_term", term, "last_index", e.lastIndex.Load())
	}
	return nil
}

// CatchUp is a catch-up point (see above): the index the log must reach
// again and the point's term; the zero value owes nothing. Its methods,
// CutDamage and CatchUpAfterCut are the rule itself, with no goroutine,
// clock or store of their own: the engine runs them on its goroutines,
// and internal/sim runs the same code on its simulated ones.
type CatchUp struct {
	Index, Term uint64
}

// Owes reports whether the node still owes entries; while it does, its
// election clock does not tick, so that it never campaigns.
func (c CatchUp) Owes() bool { return c.Index > 0 }

// CatchUpStep is what the rule makes of one message that reached a node.
type CatchUpStep struct {
	Drop bool           // not stepped
	Msg  raftpb.Message // what to step: the message, a heartbeat's commit cut to the log's end
	// HandOver: send the message's sender, the leader, a hand-over
	// request (HandOverRequest).
	HandOver bool
	// Next is the point from now on, to be recorded when it differs:
	// raised by a heartbeat whose commit is past it, zero once a
	// heartbeat shows the log holds everything owed: it reached the
	// point, or it ends in an entry of a later term than the point's.
	Next CatchUp
}

// Receive applies the rule to m, at a node whose log ends at last, an
// entry of term lastTerm (0: unknown).
func (c CatchUp) Receive(m raftpb.Message, last, lastTerm uint64) CatchUpStep {
	s := CatchUpStep{Msg: m, Next: c}
	if !c.Owes() {
		return s
	}
	switch m.Type {
	case raftpb.MsgVote, raftpb.MsgPreVote:
		s.Drop = c.Term == 0 || m.LogTerm < c.Term || m.LogTerm == c.Term && m.Index < c.Index
	case raftpb.MsgTimeoutNow:
		s.Drop = true
	case raftpb.MsgHeartbeat:
		switch {
		case m.Commit > last:
			if m.Commit > c.Index {
				s.Next = CatchUp{Index: m.Commit, Term: max(c.Term, m.Term)}
			}
			s.HandOver = true
			s.Msg.Commit = last
		case last >= c.Index:
			s.Next = CatchUp{}
		case c.Term > 0 && lastTerm > c.Term:
			// The log ends in an entry of a later term than any entry
			// the node had, so it holds the log of a leader of that term
			// up to there (raft's log matching), and with it every entry
			// committed in the node's earlier terms: an old
			// acknowledgement counted only toward its own term's
			// commits, which that leader has. The point may be past
			// anything the cluster will write again (a repair that could
			// not read how far the damaged segment reached owes a bound,
			// not a count); this ends the debt all the same.
			s.Next = CatchUp{}
		case m.Commit == last:
			// The log holds everything the leader has committed, and
			// nothing it has not, yet the point lies beyond: a bound
			// past what the cluster has written. In a cluster that
			// writes nothing more, only a later term's entry ends the
			// debt (the case above), so the member asks for a
			// hand-over, whose new leader appends one at once. Without
			// this a member stayed owing, refusing every vote, until
			// the cluster wrote as far as the bound (e2e/cluster
			// TestADamagedFollowerRepairsItselfFromItsPeers: a point of
			// 325 over a log of 38).
			s.HandOver = true
		}
	}
	return s
}

// EndsAlone reports whether a node that owes entries may stop owing them
// because it is now the only member of its configuration (members,
// Members of it): what it has is all there is. The configuration counts
// only once the whole log is applied (applied reaches last), since a
// restart applies its membership entries again one by one.
func (c CatchUp) EndsAlone(applied, last, members uint64) bool {
	return c.Owes() && applied >= last && members == 1
}

// Members is how many members cs has, voters and learners: the count
// the engine records (membersKey) and the rule decides by.
func Members(cs raftpb.ConfState) uint64 {
	return uint64(len(cs.Voters) + len(cs.Learners))
}

// CutDamage decides a start that finds its log damaged: true, cut the
// damage off, and owe what was cut (CatchUpAfterCut); false, refuse to
// start. A node with others to catch up from (members, the voters and
// learners last recorded, two or more) repairs itself; alone it refuses,
// unless the operator accepted the loss (repairLog, Config.RepairLog).
func CutDamage(members uint64, repairLog bool) bool {
	return repairLog || members >= 2
}

// CatchUpAfterCut is the catch-up point after a repair cut entries up to
// owed (0: none) from a node whose point was had: raised to owed, with a
// term no lower than the hard state's (hsTerm; 0 when unreadable, which
// refuses every vote until caught up), since no entry is of a later term
// than the node's own. Only a node with others to catch up from owes
// anything; alone it has all there is. record reports whether the point
// moved and must be recorded.
func CatchUpAfterCut(had CatchUp, owed, members, hsTerm uint64) (point CatchUp, record bool) {
	if owed == 0 || members < 2 || owed <= had.Index {
		return had, false
	}
	return CatchUp{Index: owed, Term: max(had.Term, hsTerm)}, true
}

// catchUpPoint is the node's catch-up point.
func (e *engine) catchUpPoint() CatchUp {
	return CatchUp{Index: e.catchUp.Load(), Term: e.catchUpTerm.Load()}
}

// catchingUp applies the rule to m while the node owes entries. It
// reports whether m is to be dropped; a heartbeat is changed in place
// (its commit cut to the log's end) and stepped.
func (e *engine) catchingUp(m *raftpb.Message) (drop bool) {
	c := e.catchUpPoint()
	if !c.Owes() {
		return false
	}
	last := e.lastIndex.Load()
	lastTerm, _ := e.ms.Term(last) // 0 when not in memory: no end by term
	s := c.Receive(*m, last, lastTerm)
	if s.Next != c {
		e.setCatchUp(s.Next)
		if !s.Next.Owes() {
			e.n.log.Info("raft: this node's log holds again every entry it had lost; it votes and campaigns as before", "last_index", last)
		}
	}
	if s.HandOver {
		e.trans.Send([]raftpb.Message{HandOverRequest(e.rid, m.From)})
	}
	*m = s.Msg
	return s.Drop
}

// setCatchUp records the catch-up point, durably. A failure to write it
// is logged and the point is kept in memory: the node stays careful
// until it restarts.
func (e *engine) setCatchUp(c CatchUp) {
	e.catchUp.Store(c.Index)
	e.catchUpTerm.Store(c.Term)
	if err := recordCatchUp(e.disk.meta, c); err != nil {
		e.n.log.Error("raft: cannot record the catch-up point", "index", c.Index, "term", c.Term, "error", err)
	}
}

// recordCatchUp writes the catch-up point to the meta store: the term
// first, so that a crash between the two writes leaves an index with a
// term no lower than its own, never a new index with an old term.
func recordCatchUp(meta raft.StableStore, c CatchUp) error {
	err := meta.SetUint64(catchUpTermKey, c.Term)
	if err == nil {
		err = meta.SetUint64(catchUpKey, c.Index)
	}
	if err != nil {
		return fmt.Errorf("raftnode: record the catch-up point: %w", err)
	}
	return nil
}

// HandOverRequest is the request a catching-up member from sends the
// leader to that it hand its leadership on (see above).
func HandOverRequest(from, to uint64) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgUnreachable, From: from, To: to}
}

// IsHandOverRequest reports whether m, from the wire, is a hand-over
// request: raft raises MsgUnreachable only locally, so one from another
// node can be nothing else, and is never stepped.
func IsHandOverRequest(m raftpb.Message) bool { return m.Type == raftpb.MsgUnreachable }

// HandOvers limits a leader's hand-overs to one per failover: a new
// leader takes up to twice Config.ElectionTimeout to be elected (raft
// draws each timeout between one and two of it), and a second hand-over
// before then would only cut the first one short. Safe for concurrent
// use: the transport delivers requests on several goroutines.
type HandOvers struct {
	every time.Duration
	last  atomic.Int64 // unix nanoseconds of the last hand-over admitted
}

// NewHandOvers limits hand-overs for a node whose Config.ElectionTimeout
// is electionTimeout.
func NewHandOvers(electionTimeout time.Duration) *HandOvers {
	return &HandOvers{every: 2 * electionTimeout}
}

// Admit reports whether a hand-over may start at now, and counts it if
// so.
func (h *HandOvers) Admit(now time.Time) bool {
	t, last := now.UnixNano(), h.last.Load()
	return t-last >= int64(h.every) && h.last.CompareAndSwap(last, t)
}

// HandOverTarget is the voter a leader, whose status st is, hands its
// leadership to so that the member asker catches up: its most up-to-date
// other voter (the highest match index; the lowest raft ID among equals,
// so that the choice does not hang on a map's order). 0: there is none.
func HandOverTarget(st etcdraft.Status, asker uint64) uint64 {
	var target, best uint64
	for _, id := range slices.Sorted(maps.Keys(st.Progress)) {
		pr := st.Progress[id]
		if id != st.ID && id != asker && !pr.IsLearner && (target == 0 || pr.Match > best) {
			target, best = id, pr.Match
		}
	}
	return target
}

// answerHandOver is the leader's side of a hand-over request. It reports
// whether m was one.
func (e *engine) answerHandOver(m raftpb.Message) bool {
	if !IsHandOverRequest(m) {
		return false
	}
	if !e.isLeader() || !e.handOvers.Admit(time.Now()) {
		return true
	}
	target := HandOverTarget(e.raft().Status(), m.From)
	if target == 0 {
		e.n.log.Warn("raft: a member lost log entries it had acknowledged, and no other voter can take over leadership so that it catches up; add a member, or remove it and join it again",
			"member", e.memberName(m.From))
		return true
	}
	e.n.log.Info("raft: handing leadership on, so that the new leader catches up a member whose log lost entries it had acknowledged",
		"member", e.memberName(m.From), "to", e.memberName(target))
	ctx, cancel := context.WithTimeout(context.Background(), e.n.election)
	defer cancel()
	e.lease.Void(time.Now())
	e.raft().TransferLeadership(ctx, e.rid, target)
	return true
}

// recordMembers stores how many members the configuration has, when it
// changed.
func (e *engine) recordMembers(cs raftpb.ConfState) {
	n := Members(cs)
	if n == e.membersStored.Load() {
		return
	}
	if err := e.disk.meta.SetUint64(membersKey, n); err != nil {
		e.n.log.Error("raft: cannot record the number of members", "error", err)
		return
	}
	e.membersStored.Store(n)
}

// catchUpAlone ends the wait of a node that owes entries but is now the
// only member of its configuration (EndsAlone).
func (e *engine) catchUpAlone() {
	e.members.mu.RLock()
	n := Members(e.members.conf)
	e.members.mu.RUnlock()
	if e.catchUpPoint().EndsAlone(e.n.applier.applied.Load(), e.lastIndex.Load(), n) {
		e.setCatchUp(CatchUp{})
		e.n.log.Warn("raft: this node is its cluster's only member: no one holds the entries its log lost, and it goes on without them")
	}
}
