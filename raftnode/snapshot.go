package raftnode

// Snapshots and compaction: when to snapshot the state (every
// Config.SnapshotThreshold entries, or once the log in memory weighs
// Config.MaxLogMemoryBytes), compacting the MemoryStorage at once and
// the WAL behind the snapshot file once it is written, one at a time
// beside apply, and keeping a catch-up tail for followers that trail a
// little. It also decides what raft may send a follower that needs a
// snapshot (raftStorage). It is apart from apply because a snapshot's
// write runs on a goroutine of its own while applies go on.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// snapshotter decides when apply snapshots the state and compacts the
// log behind it, and writes one snapshot at a time. Its state is its
// own because three goroutines reach it: apply takes snapshots, raft's
// storage asks for one (wanted), and a snapshot's write runs beside
// apply.
type snapshotter struct {
	threshold uint64 // entries applied between snapshots (Config.SnapshotThreshold)
	catchUp   uint64 // entries a compaction leaves behind the snapshot (Config.CatchUpEntries)
	// maxLogBytes is Config.MaxLogMemoryBytes: once the log held in
	// memory weighs that much, apply snapshots and compacts it, keeping
	// a catch-up tail of at most catchUpBytes, half of it.
	maxLogBytes, catchUpBytes int64

	index atomic.Uint64 // the index of the last snapshot taken or restored
	// appliedBytes counts the bytes of the entries applied; atSnapshot is
	// its value, and stateBytes the state's size, at the last snapshot
	// taken (snapshotDue).
	appliedBytes, atSnapshot, stateBytes atomic.Uint64
	writing                              sync.WaitGroup  // the snapshot being written, one at a time
	inFlight                             atomic.Bool     // a snapshot is being written
	now                                  chan chan error // snapshotNow's requests to apply
	wanted                               chan struct{}   // raftStorage's: a snapshot to send names a configuration that is out of date

	// toSend is the newest snapshot's data, read back from its file for
	// a follower that needs it: raft's MemoryStorage holds a snapshot's
	// metadata only (memoryLog.ApplySnapshot), as a copy of the whole
	// state kept there for the rare follower that falls behind the log
	// would double what the node holds. It is dropped once sent.
	toSend struct {
		sync.Mutex
		index   uint64
		data    []byte
		loading bool
		// reads is the read under way, which close waits for once raft,
		// whose goroutine starts it, has stopped.
		reads sync.WaitGroup
	}
}

// newSnapshotter takes cfg after withDefaults.
func newSnapshotter(cfg Config) *snapshotter {
	return &snapshotter{
		threshold:    cmp.Or(cfg.SnapshotThreshold, defaultSnapshotThreshold),
		catchUp:      cmp.Or(cfg.CatchUpEntries, defaultCatchUpEntries),
		maxLogBytes:  cmp.Or(cfg.MaxLogMemoryBytes, defaultMaxLogMemoryBytes),
		catchUpBytes: cmp.Or(cfg.MaxLogMemoryBytes, defaultMaxLogMemoryBytes) / 2,
		now:          make(chan chan error),
		wanted:       make(chan struct{}, 1),
	}
}

// maybeSnapshot snapshots the state once enough entries have been
// applied since the last one, or the log held in memory has reached its
// bound in bytes while some applied entry is not yet in a snapshot
// (compaction can only drop those). The state is copied here, between
// batches, and written by a goroutine of its own while applies go on.
//
// With entries appended one batch at a time, as a leader's proposals
// waiting on each other are, the log in memory never holds more than
// the bound plus the batch appended after the check: the check runs
// after every applied batch and brings it back to at most catchUpBytes
// plus what is not applied yet.
func (e *engine) maybeSnapshot() {
	if e.snapshotDue() {
		e.snapshotInBackground("raft: snapshot", slog.LevelError)
	}
}

// snapshotDue reports whether enough was applied since the last
// snapshot to take one: the threshold's count of entries, and entries
// weighing at least a quarter of the state the last snapshot wrote; or,
// whatever the count, the log in memory at its bound in bytes.
//
// The weight keeps a snapshot's cost, which grows with the state (its
// sessions and leases are encoded between batches, pausing apply; its
// keys and history beside apply, in CPU and garbage), a constant share
// of the writes': with a count alone, a state of 6×10^5 keys was copied every
// 8,192 puts, writes stalled a growing part of the time, and 256 puts in
// flight all passed their 5 s timeout (docs/benchmarks.md, workload 13).
// etcd, whose snapshot is its database file, takes one every 100,000
// entries. The log's bound in bytes still caps what is held meanwhile.
func (e *engine) snapshotDue() bool {
	since := e.n.applier.applied.Load() - e.snapshots.index.Load()
	if since == 0 {
		return false
	}
	if e.ms.Bytes() >= e.snapshots.maxLogBytes {
		return true
	}
	weight := e.snapshots.appliedBytes.Load() - e.snapshots.atSnapshot.Load()
	return since >= e.snapshots.threshold && weight >= e.snapshots.stateBytes.Load()/4
}

// snapshotInBackground copies the state now and writes it on a goroutine
// of its own, one snapshot at a time. A copy that fails is logged at
// copyFailed: Debug for a peer's snapshot, since raft asks again with its
// next attempt to send.
//
// While one is still being written (most of its encoding is done there,
// beside apply), a snapshot due only by its count of entries is put off
// to the check after a later batch rather than waited for, which would
// stop apply; one due because the log in memory is at its bound waits,
// as that bound must hold.
func (e *engine) snapshotInBackground(what string, copyFailed slog.Level) {
	if e.snapshots.inFlight.Load() && e.ms.Bytes() < e.snapshots.maxLogBytes {
		return
	}
	e.snapshots.writing.Wait()
	write, err := e.copyState()
	if err != nil {
		e.n.log.Log(context.Background(), copyFailed, what, "error", err)
		return
	}
	e.snapshots.inFlight.Store(true)
	e.snapshots.writing.Add(1)
	go func() {
		defer e.snapshots.writing.Done()
		defer e.snapshots.inFlight.Store(false)
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
	if err != nil || etcdraft.IsEmptySnap(snap) {
		return snap, err
	}
	if !s.e.namesEveryMember(snap.Metadata.ConfState) {
		select {
		case s.e.snapshots.wanted <- struct{}{}:
		default:
		}
		return raftpb.Snapshot{}, etcdraft.ErrSnapshotTemporarilyUnavailable
	}
	data, ok := s.e.snapshotToSend(snap.Metadata.Index)
	if !ok {
		return raftpb.Snapshot{}, etcdraft.ErrSnapshotTemporarilyUnavailable
	}
	snap.Data = data
	return snap, nil
}

// snapshotToSend is the data of the snapshot at index, for raft to send
// a follower: at once when it was read already, else it starts reading
// it from its file, off raft's goroutine, and says it is not there yet
// (raft asks again at the follower's next heartbeat). A snapshot just
// taken may not be written yet; the read fails, and is tried again.
func (e *engine) snapshotToSend(index uint64) ([]byte, bool) {
	ts := &e.snapshots.toSend
	ts.Lock()
	defer ts.Unlock()
	if ts.index == index && ts.data != nil {
		return ts.data, true
	}
	if ts.loading {
		return nil, false
	}
	ts.loading = true
	ts.reads.Add(1)
	go func() {
		defer ts.reads.Done()
		data, err := e.disk.snapshotData(index)
		ts.Lock()
		defer ts.Unlock()
		ts.loading = false
		if err != nil {
			e.n.log.Debug("raft: the snapshot for a follower is not readable yet; raft will ask again", "index", index, "err", err)
			return
		}
		ts.index, ts.data = index, data
	}()
	return nil, false
}

// sentSnapshot lets the data read for a follower go once raft has been
// told how sending it went.
func (e *engine) sentSnapshot() {
	ts := &e.snapshots.toSend
	ts.Lock()
	ts.index, ts.data = 0, nil
	ts.Unlock()
}

// snapshotNow takes a snapshot of the state as it is and waits until it
// is written and the log behind it compacted.
func (e *engine) snapshotNow() error {
	done := make(chan error, 1)
	select {
	case e.snapshots.now <- done:
		return <-done
	case <-e.stop:
		return ErrClosed
	}
}

// copyState takes the state, its index and membership, and returns what
// writes them out. It runs on the apply goroutine, between batches; what
// the state machine changes in place (sessions, leases) is encoded here,
// the rest (keys, their history) by write, beside apply, from what was
// taken here (applier.snapshotWith).
// The MemoryStorage takes the snapshot and is compacted here and now,
// as etcd's server does before it saves the snapshot, so that the log
// held in memory is back under its bound before the next batch is
// applied; the snapshot files and the WAL follow in write, which may run
// beside apply. Until write is done the WAL still holds every entry the
// newest snapshot file does not cover, so a restart loses nothing.
func (e *engine) copyState() (write func() error, err error) {
	var cs raftpb.ConfState
	var members map[uint64]memberInfo
	finish, applied, err := e.n.applier.snapshotWith(func() {
		e.members.mu.RLock()
		cs, members = e.members.copyLocked()
		e.members.mu.RUnlock()
	})
	if err != nil {
		return nil, err
	}
	term, err := e.ms.Term(applied)
	if err != nil {
		return nil, fmt.Errorf("raftnode: snapshot at %d: %w", applied, err)
	}
	e.snapshots.index.Store(applied)
	// Until write measures it, the state is taken to weigh what it did
	// plus everything applied since: no less than it does, so that
	// snapshotDue never hurries the next snapshot.
	weighed := e.snapshots.appliedBytes.Load()
	e.snapshots.stateBytes.Add(weighed - e.snapshots.atSnapshot.Swap(weighed))
	// The metadata only: the data is the file write writes
	// (snapshotToSend reads it back for a follower that needs it).
	if _, err := e.ms.CreateSnapshot(applied, &cs, nil); err != nil {
		if errors.Is(err, etcdraft.ErrSnapOutOfDate) {
			// A newer snapshot arrived from the leader meanwhile: it
			// is already written, and the log behind it dropped.
			return func() error { return nil }, nil
		}
		return nil, fmt.Errorf("raftnode: snapshot at %d: %w", applied, err)
	}
	upTo := e.ms.compactionIndex(applied, e.snapshots.catchUp, e.snapshots.catchUpBytes)
	if upTo > 0 {
		if err := e.ms.Compact(upTo); err != nil && !errors.Is(err, etcdraft.ErrCompacted) {
			return nil, fmt.Errorf("raftnode: compact the log to %d: %w", upTo, err)
		}
	}
	meta := raftpb.SnapshotMetadata{Index: applied, Term: term, ConfState: cs}
	return func() error {
		// Most of the state is encoded here, beside apply
		// (statemachine.Machine.SnapshotSplit).
		state, err := finish()
		if err != nil {
			return err
		}
		var size uint64
		for _, piece := range state {
			size += uint64(len(piece))
		}
		e.snapshots.stateBytes.Store(size)
		if err := e.disk.writeSnapshot(meta, members, state...); err != nil {
			return err
		}
		if upTo == 0 {
			return nil
		}
		return e.disk.compact(upTo)
	}, nil
}

func (e *engine) snapshotIndex() uint64 {
	s, err := e.ms.Snapshot()
	if err != nil {
		return 0
	}
	return s.Metadata.Index
}
