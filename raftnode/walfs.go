package raftnode

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
)

// DiskFiles are what the disk storage keeps its state in: raft-wal's
// segments, raft-wal's meta store and the snapshots. The zero value is
// the real files under DataDir/raft. They are a seam so that
// internal/sim can run this package's own log store, verifying reader
// and repair over a disk in its memory whose faults it decides, rather
// than a model of them that may be kinder than the product.
type DiskFiles struct {
	// WAL holds raft-wal's segment files; nil: the real file system.
	WAL WALFS
	// Meta returns raft-wal's meta store (the segment list, the hard
	// state and this package's meta keys: catch-up point, member count),
	// once for every open of the WAL, which closes it; nil: raft-wal's
	// BoltDB file in the WAL's directory.
	Meta func() types.MetaStore
	// Snapshots; nil: hashicorp/raft's snapshot files beside the WAL.
	Snapshots raft.SnapshotStore
}

// injected reports whether any of the files are not the real ones.
func (f DiskFiles) injected() bool { return f.WAL != nil || f.Meta != nil || f.Snapshots != nil }

// wal is the segments' file system.
func (f DiskFiles) wal() WALFS {
	if f.WAL == nil {
		return osWALFS{fs.New()}
	}
	return f.WAL
}

// meta opens the meta store for one open of the WAL.
func (f DiskFiles) meta() types.MetaStore {
	if f.Meta == nil {
		return &metadb.BoltMetaDB{}
	}
	return f.Meta()
}

// WALFS is the file system raft-wal's segments live on: raft-wal's own
// VFS, and what the verifying reader and the repair (walcheck.go) need
// beyond it, which raft-wal's interface lacks.
type WALFS interface {
	types.VFS
	// Size returns the size in bytes of the file name in dir.
	Size(dir, name string) (int64, error)
	// ZeroFrom makes the file read as zeros from offset on, to its end
	// or to offset if that is beyond it, and syncs it: a preallocated
	// segment never written past offset.
	ZeroFrom(dir, name string, offset int64) error
}

// osWALFS is the real file system, raft-wal's own VFS on it, with its
// segments synced by fdatasync (datasync.go).
type osWALFS struct{ *fs.FS }

func (o osWALFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	return withDataSync(o.FS.Create(dir, name, size))
}

func (o osWALFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	return withDataSync(o.FS.OpenWriter(dir, name))
}

func (osWALFS) Size(dir, name string) (int64, error) {
	st, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// ZeroFrom truncates and extends the file again, rather than writing
// zeros: the file system hands back a hole, and 64 MiB of zeros is not
// written to cut a few bytes.
func (osWALFS) ZeroFrom(dir, name string, offset int64) error {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := f.Truncate(offset); err != nil {
		return fmt.Errorf("cut %s at offset %d: %w", path, offset, err)
	}
	if err := f.Truncate(max(st.Size(), offset)); err != nil {
		return fmt.Errorf("zero %s after offset %d: %w", path, offset, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
