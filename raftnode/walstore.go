package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/types"
)

// walStore is the WAL and its meta store on hashicorp/raft-wal, made to
// survive a full disk.
//
// raft-wal wedges when the disk fills: a segment is sealed, creating the
// next one fails, and every later append gets "segment is sealed" until
// the process restarts — opening the WAL again completes the rotation.
// The node's space check refuses client writes before the disk is that
// full, so this is the second line: after an append fails for lack of
// space, the next append (raft retries once it leads again) first checks
// that space is back and reopens the WAL in place. Reads wait while it
// reopens; nothing acknowledged is touched, since a failed append was
// never acknowledged.
type walStore struct {
	dir   string
	open  func() (*raftwal.WAL, error)
	space *spaceCheck
	log   *slog.Logger
	// segmentSize is what a new segment preallocates: reopening waits
	// until that much is free.
	segmentSize uint64

	mu     sync.RWMutex // guards w and broken; held for writing to reopen
	w      *raftwal.WAL
	broken error // the failed append that left w unusable
}

var (
	_ raft.LogStore          = (*walStore)(nil)
	_ raft.StableStore       = (*walStore)(nil)
	_ raft.MonotonicLogStore = (*walStore)(nil)
)

// walOptions are what openWAL passes to raft-wal.
type walOptions struct {
	segmentSize int
	repair      bool
	logger      *slog.Logger
	space       *spaceCheck // measured around every new segment
	tail        *walTail    // told of every tail segment the filer hands out
	files       DiskFiles   // the segments' file system and the meta store
}

// openWAL opens raft-wal in dir with every segment's checksums verified.
// With repair, damaged segments are opened anyway and the damage is
// returned, for the caller to cut off; without it a damaged log is a
// *CorruptLogError.
func openWAL(dir string, o walOptions) (*raftwal.WAL, *CorruptLogError, error) {
	filer := newVerifyingFiler(dir, o.files.wal(), o.repair)
	filer.tail, filer.log = o.tail, o.logger
	// raft-wal leaves its meta store open when Open fails, and its file
	// lock would block the next open in this process forever.
	meta := o.files.meta()
	w, err := raftwal.Open(dir,
		raftwal.WithLogger(newHCLogger(o.logger, "wal")),
		raftwal.WithSegmentFiler(filer),
		raftwal.WithMetaStore(meta),
		raftwal.WithSegmentSize(o.segmentSize), // 0: raft-wal's 64 MiB
	)
	if err != nil {
		meta.Close()
		return nil, nil, err
	}
	// Only rotations are measured. A segment created by the open itself
	// is as raft-wal recorded it before, at the size it had then (the
	// file may be missing after a crash or a full disk): refusing it for
	// that size would keep the node from ever starting with smaller
	// segments. Raft appends, and so rotates, only after Open returns.
	filer.space = o.space
	return w, filer.found, nil
}

func (s *walStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *walStore) StoreLogs(logs []*raft.Log) error {
	// Writes are refused from the append that finds the reserve gone,
	// not up to a second later.
	s.space.measure()
	s.mu.RLock()
	w, broken := s.w, s.broken
	var err error
	if broken == nil {
		err = w.StoreLogs(logs)
	}
	s.mu.RUnlock()
	if broken == nil {
		afterLogSync()
		if err != nil && isSpaceError(err) {
			s.mu.Lock()
			s.broken = err
			s.mu.Unlock()
			s.space.failed(err)
			s.log.Error("log append failed for lack of space; the log is reopened once space is freed", "err", err)
			return s.space.err()
		}
		return err
	}
	if err := s.reopen(); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.StoreLogs(logs)
}

// reopen opens the WAL again if space is back. Called only by the one
// goroutine raft appends from.
func (s *walStore) reopen() error {
	if !s.space.hasRoom(s.segmentSize) {
		return s.space.err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.w.Close(); err != nil {
		s.log.Warn("close log for reopening", "err", err)
	}
	w, err := s.open()
	if err != nil {
		// Without a WAL raft can neither read nor write: keep trying for a
		// while (space was just seen free), then stop the node: what the
		// open found is for the repair a start makes.
		for range 10 {
			if w, err = s.open(); err == nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("raftnode: reopen the log in %s after a failed write: %w: %w", s.dir, ErrLogDamaged, err)
		}
	}
	s.w, s.broken = w, nil
	s.space.recovered()
	s.log.Info("log reopened after a full disk; writes resume")
	return nil
}

// isSpaceError reports whether a failed append left raft-wal needing a
// reopen: out of space, or the wedge that follows a failed rotation.
func isSpaceError(err error) bool {
	return isNoSpace(err) || errors.Is(err, types.ErrSealed)
}

func (s *walStore) read(fn func(w *raftwal.WAL) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return fn(s.w)
}

func (s *walStore) FirstIndex() (i uint64, err error) {
	err = s.read(func(w *raftwal.WAL) error { i, err = w.FirstIndex(); return err })
	return i, err
}

func (s *walStore) LastIndex() (i uint64, err error) {
	err = s.read(func(w *raftwal.WAL) error { i, err = w.LastIndex(); return err })
	return i, err
}

func (s *walStore) GetLog(index uint64, l *raft.Log) error {
	return s.read(func(w *raftwal.WAL) error { return w.GetLog(index, l) })
}

func (s *walStore) DeleteRange(lo, hi uint64) error {
	return s.read(func(w *raftwal.WAL) error { return w.DeleteRange(lo, hi) })
}

func (s *walStore) Set(k, v []byte) error {
	defer afterLogSync()
	return s.read(func(w *raftwal.WAL) error { return w.Set(k, v) })
}

func (s *walStore) Get(k []byte) (v []byte, err error) {
	err = s.read(func(w *raftwal.WAL) error { v, err = w.Get(k); return err })
	return v, err
}

func (s *walStore) SetUint64(k []byte, v uint64) error {
	defer afterLogSync()
	return s.read(func(w *raftwal.WAL) error { return w.SetUint64(k, v) })
}

func (s *walStore) GetUint64(k []byte) (v uint64, err error) {
	err = s.read(func(w *raftwal.WAL) error { v, err = w.GetUint64(k); return err })
	return v, err
}

// IsMonotonic: raft-wal cannot take a gap in indexes, so raft must clear
// the log after a snapshot restore instead of leaving one.
func (s *walStore) IsMonotonic() bool { return true }

func (s *walStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Close()
}
