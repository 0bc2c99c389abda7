package raftnode

// The in-memory log: raft's MemoryStorage, which holds every entry since
// the last compaction, with the bytes of those entries counted as they
// come and go. The count is what bounds the log in bytes
// (Config.MaxLogMemoryBytes) and what the server charges to the storage
// quota (Node.LogMemoryBytes). It lives beside the MemoryStorage rather
// than being summed from it because a sum would copy every entry under
// raft's lock; kept here, it is exact and costs an atomic load to read.

import (
	"sync"
	"sync/atomic"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// memoryLog is raft's MemoryStorage with the size of each entry it holds.
// Every change to the storage's entries goes through Append,
// ApplySnapshot and Compact here, so the sizes follow them; raft itself
// only reads the storage. The Ready loop appends and applies snapshots,
// apply compacts, and anyone reads Bytes.
type memoryLog struct {
	*etcdraft.MemoryStorage

	mu    sync.Mutex // serialises changes, so that sizes follows the storage's entries
	first uint64     // the index sizes[0] is for: the storage's FirstIndex
	sizes []int64    // the marshalled size of each entry held, from first on
	bytes atomic.Int64
}

func newMemoryLog() *memoryLog {
	return &memoryLog{MemoryStorage: etcdraft.NewMemoryStorage(), first: 1}
}

// Bytes is the marshalled size of the entries held now.
func (m *memoryLog) Bytes() int64 { return m.bytes.Load() }

// Append appends ents as MemoryStorage does: entries already compacted
// are skipped, and an entry that conflicts with one held replaces it and
// everything after it.
func (m *memoryLog) Append(ents []raftpb.Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.MemoryStorage.Append(ents); err != nil {
		return err
	}
	for i := range ents {
		if ents[i].Index < m.first {
			continue
		}
		if at := ents[i].Index - m.first; at < uint64(len(m.sizes)) {
			m.dropFrom(int(at))
		}
		size := int64(ents[i].Size())
		m.sizes = append(m.sizes, size)
		m.bytes.Add(size)
	}
	return nil
}

// ApplySnapshot replaces the whole log with snap, as MemoryStorage does,
// keeping its metadata only: the data is in the snapshot file, which
// snapshotToSend reads when a follower needs it.
func (m *memoryLog) ApplySnapshot(snap raftpb.Snapshot) error {
	snap.Data = nil
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.MemoryStorage.ApplySnapshot(snap); err != nil {
		return err
	}
	m.first = snap.Metadata.Index + 1
	m.sizes = nil
	m.bytes.Store(0)
	return nil
}

// Compact drops the entries up to and including index, as MemoryStorage
// does.
func (m *memoryLog) Compact(index uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.MemoryStorage.Compact(index); err != nil {
		return err
	}
	if drop := index + 1 - m.first; drop > 0 {
		var freed int64
		for _, s := range m.sizes[:drop] {
			freed += s
		}
		// A fresh slice, so that the dropped sizes' array is let go.
		m.sizes = append([]int64(nil), m.sizes[drop:]...)
		m.bytes.Add(-freed)
	}
	m.first = index + 1
	return nil
}

// dropFrom forgets the sizes from position at on; the caller holds mu.
func (m *memoryLog) dropFrom(at int) {
	var freed int64
	for _, s := range m.sizes[at:] {
		freed += s
	}
	m.sizes = m.sizes[:at]
	m.bytes.Add(-freed)
}

// compactionIndex is where a compaction behind a snapshot at index
// should cut: the entries it keeps at or below index (the catch-up tail)
// number at most keepEntries and weigh at most keepBytes. Past what
// memory holds it falls back on the count alone, which is what the WAL
// on disk is cut by too; 0 means nothing to cut.
func (m *memoryLog) compactionIndex(index, keepEntries uint64, keepBytes int64) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if index >= m.first && index-m.first < uint64(len(m.sizes)) {
		var kept int64
		at := index
		for n := uint64(0); at >= m.first && n < keepEntries; n++ {
			size := m.sizes[at-m.first]
			if kept+size > keepBytes {
				return at // the bytes bind: cut here, keeping what is above
			}
			kept += size
			at--
		}
		if at >= m.first {
			return at // the count binds inside memory
		}
	}
	if index <= keepEntries {
		return 0
	}
	return index - keepEntries
}
