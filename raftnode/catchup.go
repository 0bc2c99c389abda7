package raftnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
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
// durably in the meta store. Until the log reaches that index again and
// the leader's heartbeat shows nothing more is owed, the node
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
//     at most once an election timeout. A cluster of two voters has no
//     one to hand over to, and waits for an operator (docs/operations.md).
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

// catchingUp applies the rules above to m while the node owes entries.
// It reports whether m is to be dropped; a heartbeat is changed in
// place (its commit cut to the log's end) and stepped.
func (e *engine) catchingUp(m *raftpb.Message) (drop bool) {
	target := e.catchUp.Load()
	if target == 0 {
		return false
	}
	switch m.Type {
	case raftpb.MsgVote, raftpb.MsgPreVote:
		term := e.catchUpTerm.Load()
		return term == 0 || m.LogTerm < term || m.LogTerm == term && m.Index < target
	case raftpb.MsgTimeoutNow:
		return true
	case raftpb.MsgHeartbeat:
		last := e.lastIndex.Load()
		if m.Commit > last {
			if m.Commit > target {
				e.setCatchUp(m.Commit, max(e.catchUpTerm.Load(), m.Term))
			}
			e.trans.Send([]raftpb.Message{{Type: raftpb.MsgUnreachable, From: e.rid, To: m.From}})
			m.Commit = last
			return false
		}
		if last >= target {
			e.setCatchUp(0, 0)
			e.n.log.Info("raft: this node's log holds again every entry it had lost; it votes and campaigns as before", "last_index", last)
		}
	}
	return false
}

// setCatchUp records the catch-up point, durably. A failure to write it
// is logged and the point is kept in memory: the node stays careful
// until it restarts.
func (e *engine) setCatchUp(index, term uint64) {
	e.catchUp.Store(index)
	e.catchUpTerm.Store(term)
	if err := recordCatchUp(e.disk.meta, index, term); err != nil {
		e.n.log.Error("raft: cannot record the catch-up point", "index", index, "term", term, "error", err)
	}
}

// recordCatchUp writes the catch-up point to the meta store: the term
// first, so that a crash between the two writes leaves an index with a
// term no lower than its own, never a new index with an old term.
func recordCatchUp(meta raft.StableStore, index, term uint64) error {
	err := meta.SetUint64(catchUpTermKey, term)
	if err == nil {
		err = meta.SetUint64(catchUpKey, index)
	}
	if err != nil {
		return fmt.Errorf("raftnode: record the catch-up point: %w", err)
	}
	return nil
}

// handOverRequest is a follower's request that the leader hand its
// leadership on, so that a new leader catches the follower up (see
// above): a MsgUnreachable from the wire. It reports whether m was one.
func (e *engine) handOverRequest(m raftpb.Message) bool {
	if m.Type != raftpb.MsgUnreachable {
		return false
	}
	if !e.isLeader() {
		return true
	}
	now := time.Now().UnixNano()
	last := e.lastHandOver.Load()
	if now-last < int64(e.n.election) || !e.lastHandOver.CompareAndSwap(last, now) {
		return true
	}
	var target, best uint64
	for id, pr := range e.raft().Status().Progress {
		if id != e.rid && id != m.From && !pr.IsLearner && (target == 0 || pr.Match > best) {
			target, best = id, pr.Match
		}
	}
	if target == 0 {
		e.n.log.Warn("raft: a member lost log entries it had acknowledged, and no other voter can take over leadership so that it catches up; add a member, or remove it and join it again",
			"member", e.memberName(m.From))
		return true
	}
	e.n.log.Info("raft: handing leadership on, so that the new leader catches up a member whose log lost entries it had acknowledged",
		"member", e.memberName(m.From), "to", e.memberName(target))
	ctx, cancel := context.WithTimeout(context.Background(), e.n.election)
	defer cancel()
	e.raft().TransferLeadership(ctx, e.rid, target)
	return true
}

// recordMembers stores how many members the configuration has, when it
// changed.
func (e *engine) recordMembers(cs raftpb.ConfState) {
	n := uint64(len(cs.Voters) + len(cs.Learners))
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
// only member of its configuration: what it has is all there is. The
// configuration is read once the whole log is applied, since a restart
// applies its membership entries again one by one.
func (e *engine) catchUpAlone() {
	if e.catchUp.Load() == 0 || e.n.applier.applied.Load() < e.lastIndex.Load() {
		return
	}
	e.members.mu.RLock()
	n := len(e.members.conf.Voters) + len(e.members.conf.Learners)
	e.members.mu.RUnlock()
	if n == 1 {
		e.setCatchUp(0, 0)
		e.n.log.Warn("raft: this node is its cluster's only member: no one holds the entries its log lost, and it goes on without them")
	}
}
