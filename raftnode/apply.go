package raftnode

// Apply: the goroutine that takes committed entries from the Ready loop
// in order and applies them through the applier (applier.go), which owns
// the state and its lock. It is the only writer of the state, so it is
// also where snapshots are copied and restored: between batches, where
// the state, its applied index and the configuration agree.

import (
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// applyTask is one Ready's worth of work for apply, in this order: a
// snapshot to restore, entries to apply, then proposals to fail because
// the term moved on (term) or this node stepped down.
type applyTask struct {
	snap     *raftpb.Snapshot
	ents     []raftpb.Entry
	term     uint64
	stepDown bool
	// confApplied, set when ents hold a configuration change, receives
	// the answers to this node's changes once the batch is applied: run
	// waits for it before Advance, and answers after, as etcd's server
	// does. Raft must not count votes or take the next change under a
	// configuration the state has not caught up with, and it refuses a
	// change proposed before it has been told the last one is applied.
	confApplied chan []resolved
	// persisted is closed once the Ready's own writes are durable, and so
	// in raft's storage: a snapshot may only be taken at an index there.
	persisted chan struct{}
}

type resolved struct {
	req uint64
	res statemachine.Result
}

// applyLoop applies what run hands over, in order.
func (e *engine) applyLoop() {
	defer e.wg.Done()
	defer e.snapshots.writing.Wait()
	for {
		var task applyTask
		select {
		case t, ok := <-e.applyCh:
			if !ok {
				return
			}
			task = t
		case <-e.snapshots.wanted:
			e.applyMu.Lock()
			e.snapshotInBackground("raft: snapshot for a peer", slog.LevelDebug)
			e.applyMu.Unlock()
			continue
		case done := <-e.snapshots.now:
			// Between batches, so the state, its index and the membership
			// agree.
			e.applyMu.Lock()
			e.snapshots.writing.Wait()
			write, err := e.copyState()
			if err == nil {
				err = write()
			}
			e.applyMu.Unlock()
			done <- err
			continue
		case <-e.snapshotCheck:
			e.applyMu.Lock()
			e.maybeSnapshot()
			e.applyMu.Unlock()
			continue
		}
		e.applyMu.Lock()
		if !e.applyTask(task, true) {
			e.snapshotWhenPersisted(task)
		}
		e.applyMu.Unlock()
		e.applyPending.Add(-1)
	}
}

// applyTask applies task's snapshot and entries and answers and fails
// its proposals. A batch that leaves the log in memory at its bound in
// bytes is acknowledged only once the log is compacted, so that a
// proposer that waits for its answer before proposing again never finds
// more than the bound and its own entry held: with mayWait, applyTask
// then waits for the batch's Ready to be durable and snapshots before
// answering, and reports that it did (compactFirst). Any other batch is
// answered at once.
func (e *engine) applyTask(task applyTask, mayWait bool) (compactFirst bool) {
	if task.snap != nil {
		e.restoreSnapshot(*task.snap)
	}
	answers, confAnswers := e.applyEntries(task.ents)
	if task.confApplied != nil {
		task.confApplied <- confAnswers
	}
	compactFirst = mayWait && e.ms.Bytes() >= e.snapshots.maxLogBytes
	if compactFirst {
		e.snapshotWhenPersisted(task)
	}
	// Answers before failures: an entry applied here is answered with its
	// result even when the term has moved on since.
	for _, a := range answers {
		e.proposals.answer(a.req, proposalResult{res: a.res})
	}
	if task.stepDown {
		e.proposals.failBefore(0)
	} else if task.term > 0 {
		e.proposals.failBefore(task.term)
	}
	return compactFirst
}

// applyInline applies task on the Ready loop's own goroutine, when that
// is safe and saves the hand-over to apply and back: the task holds only
// entries (no snapshot, no configuration change), nothing is queued for
// apply or being applied (the order holds), and the log in memory is
// below its bound. The Ready loop calls it only for a Ready that writes
// no entries, such as the one that carries a sole voter's commit, so
// that applying never delays a write; the snapshot that may then be due
// is left to apply once the Ready is durable (Persisted). It reports
// whether it applied task.
func (e *engine) applyInline(task applyTask) bool {
	if task.snap != nil || task.confApplied != nil || e.applyPending.Load() != 0 ||
		e.ms.Bytes() >= e.snapshots.maxLogBytes || !e.applyMu.TryLock() {
		return false
	}
	defer e.applyMu.Unlock()
	if e.applyPending.Load() != 0 {
		return false // handed over between the check and the lock
	}
	e.applyTask(task, false)
	e.inlineApplies.Add(1)
	return true
}

// snapshotWhenPersisted waits until task's Ready is durable, which puts
// its entries in raft's storage, and then snapshots if one is due.
func (e *engine) snapshotWhenPersisted(task applyTask) {
	select {
	case <-task.persisted:
		e.maybeSnapshot()
	case <-e.stop:
		// run stops at once; the next start snapshots instead.
	}
}

func (e *engine) restoreSnapshot(snap raftpb.Snapshot) {
	members, state, err := decodeSnapshotData(snap.Data)
	if err == nil {
		err = e.n.applier.restoreBytes(state)
	}
	if err != nil {
		// The snapshot was checked when it was written; failing to read it
		// back means the state cannot be trusted at all.
		panic(fmt.Sprintf("raftnode: restore snapshot %d: %v", snap.Metadata.Index, err))
	}
	e.setMembership(snap.Metadata.ConfState, members)
	e.snapshots.index.Store(snap.Metadata.Index)
}

// applyEntries applies a batch under one write lock, as the hashicorp
// engine's ApplyBatch did, and returns the answers to this node's
// proposals and configuration changes, to be given once the applied
// index has moved, so that their callers' next reads see them.
func (e *engine) applyEntries(ents []raftpb.Entry) (answers, confAnswers []resolved) {
	start := time.Now()
	a := &e.batch
	applied := e.n.applier.applyBatch(ents, func(applied uint64) {
		ApplyEntries(ents, applied, e.rid, a)
	})
	answers, confAnswers = a.answers, a.confAnswers
	a.answers, a.confAnswers = nil, nil
	if !applied {
		return nil, nil
	}
	var size uint64
	for i := range ents {
		size += uint64(len(ents[i].Data))
	}
	e.snapshots.appliedBytes.Add(size)
	e.n.metrics.applyBatch.Observe(time.Since(start).Seconds())
	e.n.metrics.batchSize.Observe(float64(len(ents)))
	return answers, confAnswers
}

// EntryApplier is what ApplyEntries does each entry's work with.
type EntryApplier interface {
	// Command applies the command an entry carries and returns its
	// result.
	Command(ent raftpb.Entry, cmd []byte) statemachine.Result
	// Answer answers this node's proposal req, applied in ent with res
	// (the zero Result for a barrier).
	Answer(req uint64, ent raftpb.Entry, res statemachine.Result)
	// ConfChange applies a configuration change, and answers it if it
	// is this node's.
	ConfChange(ent raftpb.Entry)
	// Applied follows every entry applied, whatever it held, with its
	// result (the zero Result but for a command).
	Applied(ent raftpb.Entry, res statemachine.Result)
}

// ApplyEntries is apply's rule for a batch of committed entries, at the
// node with raft ID self whose state reflects the log up to applied:
// entries at or below applied, which a restored snapshot covers, are
// skipped; raft's own empty entry changes nothing; a barrier, a
// proposal without a command, is answered like any other; only this
// node's proposals are answered here, each proposer by its own node; and
// configuration changes are applied in their place in the log. The
// engine runs it under the state's lock on its apply goroutine, and
// internal/sim runs it on its scheduler's.
func ApplyEntries(ents []raftpb.Entry, applied, self uint64, a EntryApplier) {
	for _, ent := range ents {
		if ent.Index <= applied {
			continue
		}
		var res statemachine.Result
		switch ent.Type {
		case raftpb.EntryNormal:
			if from, req, cmd, ok := ParseProposal(ent.Data); ok {
				if len(cmd) > 0 {
					res = a.Command(ent, cmd)
				}
				if from == self {
					a.Answer(req, ent, res)
				}
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			a.ConfChange(ent)
		}
		a.Applied(ent, res)
	}
}

// batchApplier is the engine's EntryApplier: the applier's state, and
// the answers of one batch, given once the applied index has moved. It
// lives on the engine, used by the apply goroutine alone, so that a batch
// costs no allocation of its own.
type batchApplier struct {
	e                    *engine
	answers, confAnswers []resolved
}

func (a *batchApplier) Command(ent raftpb.Entry, cmd []byte) statemachine.Result {
	return a.e.n.applier.applyData(ent.Index, ent.Term, cmd)
}

func (a *batchApplier) Answer(req uint64, _ raftpb.Entry, res statemachine.Result) {
	a.answers = append(a.answers, resolved{req: req, res: res})
}

func (a *batchApplier) ConfChange(ent raftpb.Entry) {
	if req, mine := a.e.applyConfChange(ent); mine {
		a.confAnswers = append(a.confAnswers, resolved{req: req})
	}
}

func (a *batchApplier) Applied(raftpb.Entry, statemachine.Result) {}

func isConfChange(e raftpb.Entry) bool {
	return e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2
}
