package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// maybeSnapshot snapshots the state once enough entries have been
// applied since the last one: the state is copied here, between batches,
// and written by a goroutine of its own while applies go on.
func (e *engine) maybeSnapshot() {
	if e.n.applier.applied.Load()-e.snapshotIdx.Load() >= e.snapshot.threshold {
		e.snapshotInBackground("raft: snapshot", slog.LevelError)
	}
}

// snapshotInBackground copies the state now and writes it on a goroutine
// of its own, one snapshot at a time. A copy that fails is logged at
// copyFailed: Debug for a peer's snapshot, since raft asks again with its
// next attempt to send.
func (e *engine) snapshotInBackground(what string, copyFailed slog.Level) {
	e.snapping.Wait()
	write, err := e.copyState()
	if err != nil {
		e.n.log.Log(context.Background(), copyFailed, what, "error", err)
		return
	}
	e.snapping.Add(1)
	go func() {
		defer e.snapping.Done()
		if err := write(); err != nil {
			e.n.log.Error(what, "error", err)
		}
	}()
}

// raftStorage is what raft reads its log and snapshot from: the
// MemoryStorage, except that a snapshot it is to send a peer must name
// the configuration as it is now. Raft takes the newest stored snapshot,
// and a node added since it was taken (a learner joining a cluster whose
// log was compacted, or a converted node's first peer) refuses one whose
// configuration lacks it. So such a snapshot is withheld, raft is told to
// try again, and apply takes a fresh one, as etcd's server sends its
// current state instead of the stored snapshot.
type raftStorage struct {
	*etcdraft.MemoryStorage
	e *engine
}

func (s raftStorage) Snapshot() (raftpb.Snapshot, error) {
	snap, err := s.MemoryStorage.Snapshot()
	if err != nil || s.e.namesEveryMember(snap.Metadata.ConfState) {
		return snap, err
	}
	select {
	case s.e.snapWanted <- struct{}{}:
	default:
	}
	return raftpb.Snapshot{}, etcdraft.ErrSnapshotTemporarilyUnavailable
}

// snapshotNow takes a snapshot of the state as it is and waits until it
// is written and the log behind it compacted.
func (e *engine) snapshotNow() error {
	done := make(chan error, 1)
	select {
	case e.snapNow <- done:
		return <-done
	case <-e.stop:
		return ErrClosed
	}
}

// copyState copies the state, its index and membership, and returns
// what writes them out. It runs on the apply goroutine, between batches.
func (e *engine) copyState() (write func() error, err error) {
	f := e.n.applier
	f.mu.RLock()
	applied := f.applied.Load()
	e.memMu.RLock()
	cs := e.conf
	members := make(map[uint64]memberInfo, len(e.members))
	for id, m := range e.members {
		members[id] = m
	}
	e.memMu.RUnlock()
	state, err := f.snapshotLocked()
	f.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	term, err := e.ms.Term(applied)
	if err != nil {
		return nil, fmt.Errorf("raftnode: snapshot at %d: %w", applied, err)
	}
	e.snapshotIdx.Store(applied)
	return func() error { return e.takeSnapshot(applied, term, cs, members, state) }, nil
}

func (e *engine) takeSnapshot(index, term uint64, cs raftpb.ConfState, members map[uint64]memberInfo, state []byte) error {
	meta := raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: cs}
	if err := e.disk.writeSnapshot(meta, members, state); err != nil {
		return err
	}
	if _, err := e.ms.CreateSnapshot(index, &cs, encodeSnapshotData(members, state)); err != nil {
		if errors.Is(err, etcdraft.ErrSnapOutOfDate) {
			return nil // a newer snapshot arrived from the leader meanwhile
		}
		return err
	}
	if index <= e.snapshot.catchUp {
		return nil
	}
	upTo := index - e.snapshot.catchUp
	if err := e.ms.Compact(upTo); err != nil && !errors.Is(err, etcdraft.ErrCompacted) {
		return err
	}
	return e.disk.compact(upTo)
}

func (e *engine) snapshotIndex() uint64 {
	s, err := e.ms.Snapshot()
	if err != nil {
		return 0
	}
	return s.Metadata.Index
}
