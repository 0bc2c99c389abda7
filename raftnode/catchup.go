package raftnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/raft/v3/raftpb"
)

// A node whose log lost entries it may have acknowledged — damage that
// a repair cut off, synced batches, perhaps counted toward a commit —
// must not help elect a leader until it holds those entries again: with
// its shorter log it would vote for a candidate that lacks them, and a
// committed write would be lost (Alagappan et al., FAST '18, showed
// etcd, ZooKeeper and LogCabin doing just that from one damaged entry
// on one node). So the repair records the index the log must reach
// again, the catch-up index, durably in the meta store, and until the
// log reaches it and the leader's heartbeat shows nothing more is owed,
// the node
//
//   - neither votes nor pre-votes (the requests are dropped, as if lost),
//   - never campaigns (its election clock does not tick, and a
//     leadership transfer to it is dropped),
//   - and asks the leader to hand its leadership on. raft's leader never
//     moves a follower's progress back below what the follower once
//     acknowledged (Progress.Match, even when probing), so it would
//     resend from past the hole forever; only a new term's leader starts
//     every follower's progress afresh, and probes back to where this
//     log ends. The request is a MsgUnreachable sent over the wire,
//     which raft otherwise only ever raises locally; the leader answers
//     it by transferring leadership to its most up-to-date other voter,
//     at most once an election timeout. The leader's heartbeats, whose
//     commit index is past this log meanwhile, are dropped rather than
//     stepped: raft would panic on them (commitTo), and checkLog would
//     take them for a lost data dir. A cluster of two voters has no one
//     to hand over to, and waits for an operator (docs/operations.md).
//
// What counts toward a commit: the old leader still credits the member
// with what it acknowledged before the loss (that stale Match is why
// the leader cannot catch it up), until it hands over; the new leader
// credits only what the member acknowledges anew, and raft's log
// matching makes a follower take new entries only on top of the ones
// before them, so it acknowledges only what it holds. A heartbeat that shows the leader
// owed more than the repair knew (damage that hid entries) raises the
// index. A node alone in its configuration has no one to catch up from:
// what it has is all there is, and it goes on without.

// catchUpKey holds the catch-up index in the meta store; absent or 0:
// none.
var catchUpKey = []byte("tenure_catch_up")

// membersKey holds how many members (voters and learners) the applied
// configuration has, for a start that finds its log damaged: with
// others to catch up from, the node repairs itself; alone it refuses.
var membersKey = []byte("tenure_members")

// loadCatchUp reads the catch-up index at start.
func (e *engine) loadCatchUp() error {
	v, err := e.disk.meta.GetUint64(catchUpKey)
	if err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return fmt.Errorf("raftnode: read the catch-up index: %w", err)
	}
	e.catchUp.Store(v)
	if v > 0 {
		e.n.log.Warn("raft: this node's log lost entries it may have acknowledged; it neither votes nor campaigns until it holds them again from the leader",
			"catch_up_to", v, "last_index", e.lastIndex.Load())
	}
	return nil
}

// catchingUp handles m while the node owes entries, and reports whether
// m was dealt with (dropped or answered) and must not be stepped.
func (e *engine) catchingUp(m raftpb.Message) bool {
	target := e.catchUp.Load()
	if target == 0 {
		return false
	}
	switch m.Type {
	case raftpb.MsgVote, raftpb.MsgPreVote, raftpb.MsgTimeoutNow:
		return true
	case raftpb.MsgHeartbeat:
		last := e.lastIndex.Load()
		if m.Commit > last {
			e.lastContact.Store(time.Now().UnixNano())
			if m.Commit > target {
				e.setCatchUp(m.Commit)
			}
			e.trans.Send([]raftpb.Message{{Type: raftpb.MsgUnreachable, From: e.rid, To: m.From}})
			return true
		}
		if last >= target {
			e.setCatchUp(0)
			e.n.log.Info("raft: this node's log holds again every entry it had lost; it votes and campaigns again", "last_index", last)
		}
	}
	return false
}

// setCatchUp records the catch-up index, durably. A failure to write it
// is logged and the index is kept in memory: the node stays careful
// until it restarts.
func (e *engine) setCatchUp(index uint64) {
	e.catchUp.Store(index)
	if err := e.disk.meta.SetUint64(catchUpKey, index); err != nil {
		e.n.log.Error("raft: cannot record the catch-up index", "index", index, "error", err)
	}
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
		e.setCatchUp(0)
		e.n.log.Warn("raft: this node is its cluster's only member: no one holds the entries its log lost, and it goes on without them")
	}
}
