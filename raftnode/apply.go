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
		confAnswers := e.applyEntries(task.ents)
		if task.confApplied != nil {
			task.confApplied <- confAnswers
		}
		if task.stepDown {
			e.proposals.failBefore(0)
		} else if task.term > 0 {
			e.proposals.failBefore(task.term)
		}
		select {
		case <-task.persisted:
			e.maybeSnapshot()
		case <-e.stop:
			// run stops at once; the next start snapshots instead.
		}
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
// engine's ApplyBatch did, and answers the waiting proposals after the
// applied index has moved, so that their callers' next reads see them.
func (e *engine) applyEntries(ents []raftpb.Entry) (confAnswers []resolved) {
	start := time.Now()
	var answers []resolved
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
		return nil
	}
	e.n.metrics.applyBatch.Observe(time.Since(start).Seconds())
	e.n.metrics.batchSize.Observe(float64(len(ents)))
	for _, a := range answers {
		e.proposals.answer(a.req, proposalResult{res: a.res})
	}
	return confAnswers
}

func isConfChange(e raftpb.Entry) bool {
	return e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2
}
