package raftnode

// The Ready loop: the one goroutine that talks to raft's Ready channel,
// ticks it, writes what raft asks to be durable (entries to the WAL and
// the MemoryStorage, the hard state, a received snapshot) and sends its
// messages in the order durability allows. It is apart from apply so
// that committed entries are applied while the next write is under way,
// as etcd's raftNode does; everything it shares with the other
// goroutines goes through a channel (applyTask) or an atomic.

import (
	"encoding/binary"
	"errors"
	"slices"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

type bootstrapRequest struct {
	peers []etcdraft.Peer
	done  chan error
}

// run is the Ready loop.
func (e *engine) run() {
	defer e.wg.Done()
	defer close(e.applyCh)
	ticker := time.NewTicker(e.tick)
	defer ticker.Stop()
	for {
		node := e.raft()
		select {
		case <-ticker.C:
			// A node that owes entries never campaigns (catchup.go).
			if e.catchUp.Load() == 0 {
				node.Tick()
			} else {
				e.catchUpAlone()
			}
		case rd := <-node.Ready():
			if !e.handleReady(node, rd) {
				return
			}
		case req := <-e.bootstrapCh:
			req.done <- e.bootstrap(node, req.peers)
		case <-e.stop:
			return
		}
	}
}

// handleReady does one Ready's work; false means the engine is stopping.
func (e *engine) handleReady(node etcdraft.Node, rd etcdraft.Ready) bool {
	task := applyTask{}
	if rd.SoftState != nil {
		task.stepDown = e.setRole(rd.SoftState.RaftState, rd.SoftState.Lead)
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if rd.HardState.Term > e.term.Load() {
			task.term = rd.HardState.Term
		}
		e.term.Store(rd.HardState.Term)
		e.commit.Store(rd.HardState.Commit)
	}
	// What needs nothing durable goes first: above all the leader's
	// appends, which followers write while the leader writes its own copy.
	later := e.sendBeforeWrite(rd.Messages)
	task.ents = rd.CommittedEntries
	if slices.ContainsFunc(task.ents, isConfChange) {
		task.confApplied = make(chan []resolved, 1)
	}
	task.persisted = make(chan struct{})
	hasWork := len(task.ents) > 0 || task.stepDown || task.term > 0
	// Committed entries are durable on a quorum already, so they are
	// applied while this Ready's new entries are written, as etcd's
	// server does: otherwise every commit would wait for the next write
	// too. A snapshot is the exception: it is written first.
	if etcdraft.IsEmptySnap(rd.Snapshot) && hasWork && !e.handOver(task) {
		return false
	}
	if !e.persist(node, rd) {
		return false
	}
	close(task.persisted)
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		snap := rd.Snapshot
		task.snap = &snap
		if !e.handOver(task) {
			return false
		}
	}
	e.trans.Send(later)
	for _, rs := range rd.ReadStates {
		e.reads.done(binary.BigEndian.Uint64(rs.RequestCtx), readResult{index: rs.Index})
	}
	if task.stepDown || task.term > 0 {
		e.reads.failAll(e.n.notLeader)
	}
	var answers []resolved
	if task.confApplied != nil {
		select {
		case answers = <-task.confApplied:
		case <-e.stop:
			return false
		}
	}
	node.Advance()
	for _, a := range answers {
		e.proposals.answer(a.req, proposalResult{res: a.res})
	}
	return true
}

// handOver queues a task for apply; false means the engine is stopping.
func (e *engine) handOver(task applyTask) bool {
	select {
	case e.applyCh <- task:
		return true
	case <-e.stop:
		return false
	}
}

// setRole publishes this node's role and leader, and reports whether it
// stopped leading.
func (e *engine) setRole(role etcdraft.StateType, leader uint64) (steppedDown bool) {
	wasLeader := etcdraft.StateType(e.role.Swap(int32(role))) == etcdraft.StateLeader
	e.leader.Store(leader)
	isLeader := role == etcdraft.StateLeader
	if wasLeader != isLeader {
		e.n.metrics.isLeader.Set(map[bool]float64{true: 1}[isLeader])
		e.n.publishLeader(isLeader)
	}
	return wasLeader && !isLeader
}

// resume publishes raft's own view of the role again once the log can
// be written after a failure: raft never learnt of the pause, so no
// Ready will say the role changed.
func (e *engine) resume(node etcdraft.Node) {
	st := node.Status()
	e.setRole(st.RaftState, st.Lead)
	e.n.log.Info("raft: the log can be written again", "role", roleName(st.RaftState))
}

// sendBeforeWrite sends the messages that may leave before this Ready's
// write is durable and returns the others: votes and append
// acknowledgements, which promise that the write is done (the same split
// raft makes itself with asynchronous storage writes).
func (e *engine) sendBeforeWrite(msgs []raftpb.Message) (later []raftpb.Message) {
	now := msgs[:0:0]
	for _, m := range msgs {
		switch m.Type {
		case raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
			later = append(later, m)
		default:
			now = append(now, m)
		}
	}
	e.trans.Send(now)
	return later
}

// persist writes a Ready's snapshot, hard state and entries, retrying
// while the disk refuses (full): nothing after it may happen before it,
// and the node stops heartbeating meanwhile, so another node leads. It
// returns false if the engine stops first.
func (e *engine) persist(node etcdraft.Node, rd etcdraft.Ready) bool {
	for attempt := 0; ; attempt++ {
		err := e.write(rd)
		if err == nil {
			if attempt > 0 {
				e.resume(node)
			}
			return true
		}
		if attempt == 0 {
			// Calls that need the leader now fail at once, naming the
			// disk (notLeader), instead of waiting on a write that cannot
			// happen; a cluster elects another leader meanwhile, since
			// this node has stopped heartbeating. What is in flight may
			// still commit there (the followers have it), so it fails as
			// a lost leadership, outcome unknown.
			e.setRole(etcdraft.StateFollower, 0)
			e.proposals.failBefore(0)
			e.reads.failAll(e.n.notLeader)
		}
		if attempt%60 == 0 {
			e.n.log.Error("raft: cannot write the log; retrying, and not acknowledging anything meanwhile", "error", err)
		}
		select {
		case <-time.After(time.Second):
		case <-e.stop:
			return false
		}
	}
}

func (e *engine) write(rd etcdraft.Ready) error {
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		if err := e.disk.saveSnapshot(rd.Snapshot); err != nil {
			return err
		}
		if err := e.ms.ApplySnapshot(rd.Snapshot); err != nil && !errors.Is(err, etcdraft.ErrSnapOutOfDate) {
			return err
		}
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if err := e.disk.saveHardState(rd.HardState); err != nil {
			return err
		}
	}
	if err := e.disk.append(rd.Entries); err != nil {
		return err
	}
	if err := e.ms.Append(rd.Entries); err != nil {
		return err
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if err := e.ms.SetHardState(rd.HardState); err != nil {
			return err
		}
	}
	if n := len(rd.Entries); n > 0 {
		e.lastIndex.Store(rd.Entries[n-1].Index)
	} else if !etcdraft.IsEmptySnap(rd.Snapshot) {
		e.lastIndex.Store(rd.Snapshot.Metadata.Index)
	}
	return nil
}

// bootstrap forms a cluster on a node that has no state, replacing the
// raft node that was waiting to be added.
func (e *engine) bootstrap(node etcdraft.Node, peers []etcdraft.Peer) error {
	if last, _ := e.ms.LastIndex(); last > 0 || e.term.Load() > 0 {
		return ErrAlreadyFormed
	}
	node.Stop()
	c := e.cfg
	e.node.Store(&raftHandle{etcdraft.StartNode(&c, peers)})
	return nil
}
