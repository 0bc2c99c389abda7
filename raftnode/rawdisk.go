package raftnode

import (
	"errors"
	"fmt"
	"log/slog"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/raft/v3/raftpb"
)

// Disk is a node's disk storage over given files (DiskFiles), for a
// harness that drives etcd raft's RawNode itself rather than through
// Open: internal/sim, which runs the log store, its verifying reader and
// repair, and the meta store's rules this way over a simulated disk. It
// opens as Open opens raft-wal's files (openDiskWAL: a damaged log cut
// off on a member and the entries owed recorded, refused on a node
// alone) and writes as the engine does.
type Disk struct {
	d     *diskStorage
	close func() error
}

// DiskBoot is what a node restarts from.
type DiskBoot struct {
	Snap      raftpb.Snapshot // Data: the state the snapshot was written with
	HardState raftpb.HardState
	Entries   []raftpb.Entry
}

// OpenDisk opens the disk storage over files, raft-wal's segments
// being segmentSize bytes (0: raft-wal's default), and reads what the
// node restarts from. A damaged log that the node may not cut is a
// *CorruptLogError.
func OpenDisk(files DiskFiles, segmentSize int, log *slog.Logger) (*Disk, DiskBoot, error) {
	if files.WAL == nil || files.Meta == nil || files.Snapshots == nil {
		return nil, DiskBoot{}, errors.New("raftnode: OpenDisk needs all of WAL, Meta and Snapshots")
	}
	m, err := newMetrics(nil)
	if err != nil {
		return nil, DiskBoot{}, err
	}
	cfg := Config{LogStore: "wal", WALSegmentSize: segmentSize}
	// The directory only names the files: the given ones are elsewhere.
	wal, meta, closeWAL, err := openDiskWAL("raft", cfg, files, files.Snapshots, unmeasuredSpace(m, log), nil, log)
	if err != nil {
		return nil, DiskBoot{}, err
	}
	d := &diskStorage{wal: wal, meta: meta, snapshots: files.Snapshots, log: log}
	b, err := d.load()
	if err != nil {
		return nil, DiskBoot{}, errors.Join(err, closeWAL())
	}
	b.snap.Data = b.state
	return &Disk{d: d, close: closeWAL}, DiskBoot{Snap: b.snap, HardState: b.hs, Entries: b.ents}, nil
}

// SaveHardState writes hs as the Ready loop does: when term or vote
// changed.
func (k *Disk) SaveHardState(hs raftpb.HardState) error { return k.d.saveHardState(hs) }

// Append writes a Ready's entries, cutting any they replace. raft-wal
// creates the segment after one an append sealed in a goroutine of its
// own; Append waits for it (a delete of nothing takes raft-wal's write
// lock only once the rotation is done), so that a harness that steps
// the node deterministically sees every file change inside its call.
func (k *Disk) Append(ents []raftpb.Entry) error {
	if err := k.d.append(ents); err != nil || len(ents) == 0 {
		return err
	}
	after := ents[len(ents)-1].Index + 1
	return k.d.wal.DeleteRange(after, after)
}

// SaveSnapshot writes a snapshot the node was sent, whose Data is the
// state, and drops the whole log, as the Ready loop does.
func (k *Disk) SaveSnapshot(snap raftpb.Snapshot) error {
	return k.d.replaceLog(snap.Metadata, nil, snap.Data)
}

// Snapshot writes the node's own snapshot of state and drops the log up
// to compactTo (0: none), as the apply loop does.
func (k *Disk) Snapshot(meta raftpb.SnapshotMetadata, state []byte, compactTo uint64) error {
	if err := k.d.writeSnapshot(meta, nil, state); err != nil {
		return err
	}
	if compactTo == 0 {
		return nil
	}
	return k.d.compact(compactTo)
}

// CatchUp is the catch-up point the meta store holds.
func (k *Disk) CatchUp() (CatchUp, error) {
	var p CatchUp
	var err error
	if p.Index, err = k.d.meta.GetUint64(catchUpKey); err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return p, fmt.Errorf("raftnode: read the catch-up index: %w", err)
	}
	if p.Term, err = k.d.meta.GetUint64(catchUpTermKey); err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return p, fmt.Errorf("raftnode: read the catch-up term: %w", err)
	}
	return p, nil
}

// SetCatchUp records the catch-up point, as the engine does.
func (k *Disk) SetCatchUp(p CatchUp) error { return recordCatchUp(k.d.meta, p) }

// SetMembers records the member count a start that finds damage decides
// by, as the engine does at every configuration.
func (k *Disk) SetMembers(n uint64) error {
	if err := k.d.meta.SetUint64(membersKey, n); err != nil {
		return fmt.Errorf("raftnode: record the number of members: %w", err)
	}
	return nil
}

// Close closes the WAL.
func (k *Disk) Close() error { return k.close() }
