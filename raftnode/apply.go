package raftnode

// Apply: the goroutine that takes committed entries from the Ready loop
// in order and applies them through the applier (applier.go), which owns
// the state and its lock. It is the only writer of the state, so it is
// also where snapshots are copied and restored: between batches, where
// the state, its applied index and the configuration agree.

import (
	"encoding/binary"
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
			e.snapshotInBackground("raft: snapshot for a peer", slog.LevelDebug)
			continue
		case done := <-e.snapshots.now:
			// Between batches, so the state, its index and the membership
			// agree.
			e.snapshots.writing.Wait()
			write, err := e.copyState()
			if err == nil {
				err = write()
			}
			done <- err
			continue
		}
		if task.snap != nil {
			e.restoreSnapshot(*task.snap)
		}
		answers, confAnswers := e.applyEntries(task.ents)
		if task.confApplied != nil {
			task.confApplied <- confAnswers
		}
		// A batch that leaves the log in memory at its bound in bytes is
		// acknowledged only once the log is compacted: a proposer that
		// waits for its answer before proposing again then never finds
		// more than the bound and its own entry held. Any other batch is
		// answered at once, and snapshotted, if due, once persisted.
		compactFirst := e.ms.Bytes() >= e.snapshots.maxLogBytes
		if compactFirst {
			e.snapshotWhenPersisted(task)
		}
		// Answers before failures: an entry applied here is answered
		// with its result even when the term has moved on since.
		for _, a := range answers {
			e.proposals.answer(a.req, proposalResult{res: a.res})
		}
		if task.stepDown {
			e.proposals.failBefore(0)
		} else if task.term > 0 {
			e.proposals.failBefore(task.term)
		}
		if !compactFirst {
			e.snapshotWhenPersisted(task)
		}
	}
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
	f := e.n.applier
	applied := f.applyBatch(ents, func(ent raftpb.Entry) {
		switch ent.Type {
		case raftpb.EntryNormal:
			if len(ent.Data) < proposalHeader {
				return // the empty entry a new leader appends
			}
			from, req := binary.BigEndian.Uint64(ent.Data), binary.BigEndian.Uint64(ent.Data[8:])
			var res statemachine.Result
			if cmd := ent.Data[proposalHeader:]; len(cmd) > 0 {
				res = f.applyData(ent.Index, ent.Term, cmd)
			}
			if from == e.rid {
				answers = append(answers, resolved{req: req, res: res})
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			if req, mine := e.applyConfChange(ent); mine {
				confAnswers = append(confAnswers, resolved{req: req})
			}
		}
	})
	if !applied {
		return nil, nil
	}
	e.n.metrics.applyBatch.Observe(time.Since(start).Seconds())
	e.n.metrics.batchSize.Observe(float64(len(ents)))
	return answers, confAnswers
}

func isConfChange(e raftpb.Entry) bool {
	return e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2
}
