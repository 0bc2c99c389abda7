package raftnode

// The Ready loop: the one goroutine that takes raft's Readys (rawraft.go
// pokes it when there may be one), ticks raft, and steps the engine's
// ReadyCore (readycore.go), which
// holds the order of a Ready's work: what is sent before the write,
// what is written (entries to the WAL and the MemoryStorage, the hard
// state, a received snapshot), and what waits for it. This file is the
// core's driver in the engine: it is apart from apply so that committed
// entries are applied while the next write is under way, as etcd's
// raftNode does; everything it shares with the other goroutines goes
// through a channel (applyTask) or an atomic.

import (
	"errors"
	"fmt"
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
			if !e.catchUpPoint().Owes() {
				node.Tick()
			} else {
				e.catchUpAlone()
			}
			e.renewLease()
		case <-node.wake:
		case req := <-e.bootstrapCh:
			req.done <- e.bootstrap(node, req.peers)
			continue
		case <-e.stop:
			return
		}
		// Every Ready there is, one after the other: a Ready's Advance
		// often makes the next (a sole voter's entries commit once its
		// own write is done).
		for {
			rd, ok := node.Ready()
			if !ok {
				break
			}
			if !e.handleReady(rd) {
				return
			}
		}
	}
}

// handleReady does one Ready's work through the engine's ReadyCore, in
// a row on this goroutine: the WAL and meta store sync every write as it
// returns, so the write is durable once Write is done. False means the
// engine is stopping.
func (e *engine) handleReady(rd etcdraft.Ready) bool {
	c := e.ready
	e.driver.inlineOK = len(rd.Entries) == 0 && etcdraft.IsEmptySnap(rd.Snapshot)
	if !c.Begin(rd) {
		return false
	}
	for {
		err := c.Write()
		if err == nil {
			err = c.Synced()
		}
		if err == nil {
			break
		}
		if IsStopping(err) {
			return false
		}
		if errors.Is(err, ErrLogDamaged) {
			e.fail(err) // for a start's repair: no retry can mend it
			return false
		}
		c.Failed(err)
		select {
		case <-time.After(RetryWrite):
		case <-e.stop:
			return false
		}
	}
	return c.Advance()
}

// readyDriver is the engine's side of its ReadyCore: apply is a
// goroutine of its own (apply.go), reached through applyCh, and the rest
// is published through atomics for the other goroutines. It is used on
// the Ready loop's goroutine only.
type readyDriver struct {
	e *engine
	// The hand-over of the Ready in progress: closed once its write is
	// durable, and the answers to this node's configuration changes
	// among its entries, which raft must not advance before.
	persisted   chan struct{}
	confApplied chan []resolved
	// inlineOK: the Ready in progress writes no entries, so its
	// committed entries may be applied on this goroutine (applyInline);
	// appliedInline: they were, and apply checks for a due snapshot once
	// the Ready is durable.
	inlineOK, appliedInline bool
}

// closed is the persisted channel of a batch handed over after its
// Ready's write: durable already.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Apply queues a batch for apply.
func (d *readyDriver) Apply(b ApplyBatch) bool {
	task := applyTask{snap: b.Snapshot, ents: b.Entries, term: b.Term, stepDown: b.StepDown, persisted: closed}
	if !b.Durable {
		d.persisted = make(chan struct{})
		task.persisted = d.persisted
	}
	if slices.ContainsFunc(b.Entries, isConfChange) {
		d.confApplied = make(chan []resolved, 1)
		task.confApplied = d.confApplied
	}
	if d.inlineOK && d.e.applyInline(task) {
		d.appliedInline = true
		return true
	}
	d.e.applyPending.Add(1)
	if !d.e.handOver(task) {
		d.e.applyPending.Add(-1)
		return false
	}
	return true
}

func (d *readyDriver) Persisted() {
	if d.persisted != nil {
		close(d.persisted)
		d.persisted = nil
	}
	if d.appliedInline {
		d.appliedInline = false
		if !d.e.snapshotDue() {
			return
		}
		select {
		case d.e.snapshotCheck <- struct{}{}:
		default:
		}
	}
}

// advance tells raft the Ready is done, once apply has applied the
// configuration changes it holds: raft must not count votes or take the
// next change under a configuration the state has not caught up with,
// and it refuses a change proposed before it has been told the last one
// is applied. This node's changes are answered after, as etcd's server
// does.
func (d *readyDriver) advance(rd etcdraft.Ready) bool {
	var answers []resolved
	if d.confApplied != nil {
		select {
		case answers = <-d.confApplied:
		case <-d.e.stop:
			return false
		}
		d.confApplied = nil
	}
	d.e.raft().Advance(rd)
	for _, a := range answers {
		d.e.proposals.answer(a.req, proposalResult{res: a.res})
	}
	return true
}

func (d *readyDriver) SetRole(role etcdraft.StateType, lead uint64) bool {
	return d.e.setRole(role, lead)
}

func (d *readyDriver) HardState(hs raftpb.HardState) {
	d.e.term.Store(hs.Term)
	d.e.commit.Store(hs.Commit)
}

func (d *readyDriver) ReadIndex(req, index uint64) {
	d.e.lease.Confirmed(req, d.e.leaderTerm())
	d.e.reads.done(req, readResult{index: index})
}

func (d *readyDriver) FailReads() { d.e.reads.failAll(d.e.n.notLeader) }

func (d *readyDriver) FailProposals() { d.e.proposals.failBefore(0) }

func (d *readyDriver) WriteFailed(err error, attempt int) {
	if attempt%60 == 0 {
		d.e.n.log.Error("raft: cannot write the log; retrying, and not acknowledging anything meanwhile", "error", err)
	}
}

// Resumed publishes raft's own view of the role again once the log can
// be written after a failure.
func (d *readyDriver) Resumed() {
	st := d.e.raft().Status()
	d.e.setRole(st.RaftState, st.Lead)
	d.e.n.log.Info("raft: the log can be written again", "role", roleName(st.RaftState))
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
		if !isLeader {
			e.lease.End()
		}
		e.n.metrics.isLeader.Set(map[bool]float64{true: 1}[isLeader])
		e.n.publishLeader(isLeader)
		e.renewLease()
	}
	return wasLeader && !isLeader
}

// renewLease begins a read round when the leader's lease wants renewing
// (lease.go); nobody waits for its answer but the lease. The one voter of
// its configuration needs none, but keeps it warm for when a second
// joins: a round costs it no message.
func (e *engine) renewLease() {
	if e.isLeader() && e.lease.Due(time.Now()) {
		e.reads.join()
	}
}

// leaderTerm is the term this node leads in, 0 when it does not.
func (e *engine) leaderTerm() uint64 {
	if !e.isLeader() {
		return 0
	}
	return e.term.Load()
}

// walLog is the engine's LogWriter: the WAL, its meta store and the
// snapshot files, each write synced before it returns.
type walLog struct{ d *diskStorage }

func (w walLog) SaveSnapshot(snap raftpb.Snapshot) error { return w.d.saveSnapshot(snap) }
func (w walLog) SaveHardState(hs raftpb.HardState) error { return w.d.saveHardState(hs) }
func (w walLog) Append(ents []raftpb.Entry) error        { return w.d.append(ents) }

// memLog is the engine's RaftLog: its MemoryStorage, with the last index
// published for the other goroutines.
type memLog struct{ e *engine }

func (m memLog) ApplySnapshot(snap raftpb.Snapshot) error {
	err := m.e.ms.ApplySnapshot(snap)
	if err == nil || errors.Is(err, etcdraft.ErrSnapOutOfDate) {
		m.e.lastIndex.Store(snap.Metadata.Index)
	}
	return err
}

func (m memLog) Append(ents []raftpb.Entry) error {
	if err := m.e.ms.Append(ents); err != nil {
		return err
	}
	if n := len(ents); n > 0 {
		m.e.lastIndex.Store(ents[n-1].Index)
	}
	return nil
}

func (m memLog) SetHardState(hs raftpb.HardState) error { return m.e.ms.SetHardState(hs) }

// bootstrap forms a cluster on a node that has no state, replacing the
// raft node that was waiting to be added.
func (e *engine) bootstrap(node *rawRaft, peers []etcdraft.Peer) error {
	if last, _ := e.ms.LastIndex(); last > 0 || e.term.Load() > 0 {
		return ErrAlreadyFormed
	}
	c := e.cfg
	fresh, err := newRawRaft(&c, peers)
	if err != nil {
		return fmt.Errorf("raftnode: bootstrap: %w", err)
	}
	node.Stop()
	e.node.Store(fresh)
	fresh.poke()
	return nil
}
