package raftnode

import (
	"io/fs"
	"path/filepath"
	"sync/atomic"

	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// raft-wal preallocates each log segment whole (64 MiB by default) when
// it creates it, so the size of the files under the data directory says
// how much disk the node has claimed, not how much it has written: an
// empty node's directory is 64 MiB. DiskBytesInUse is the second figure,
// what etcd's endpoint status calls the database size: the files' sizes
// with the tail segment counted up to its last frame. Sealed segments
// are full, and so counted whole.

// walTail is the WAL's tail segment, the one appends go to, as the
// filer last handed it to raft-wal. It outlives a reopen of the WAL
// (walStore.reopen), which hands over a tail of its own.
type walTail struct {
	cur atomic.Pointer[tailSegment]
}

type tailSegment struct {
	w         *segment.Writer
	fs        WALFS
	dir, name string
	info      types.SegmentInfo
}

// set records w, a writer raft-wal will append to, for the segment info.
// A writer that is not raft-wal's own (none today) is not measured.
func (t *walTail) set(w types.SegmentWriter, fsys WALFS, dir string, info types.SegmentInfo) {
	if t == nil {
		return
	}
	sw, ok := w.(*segment.Writer)
	if !ok {
		t.cur.Store(nil)
		return
	}
	t.cur.Store(&tailSegment{w: sw, fs: fsys, dir: dir, name: segment.FileName(info), info: info})
}

// unused is how many bytes of the tail segment's file lie past its last
// frame: preallocated and not yet written. 0 when there is no tail or it
// cannot be read.
func (t *walTail) unused() int64 {
	if t == nil {
		return 0
	}
	tail := t.cur.Load()
	if tail == nil {
		return 0
	}
	size, err := tail.fs.Size(tail.dir, tail.name)
	if err != nil {
		return 0
	}
	used := int64(walFileHeaderLen)
	if last := tail.w.LastIndex(); last > 0 && last >= tail.info.BaseIndex {
		off, err := tail.w.OffsetForFrame(last)
		if err != nil {
			return 0
		}
		buf, err := tail.w.GetLog(last)
		if err != nil {
			return 0
		}
		n := len(buf.Bs)
		buf.Close()
		// The last entry's frame, then the commit frame that ends its
		// batch. (A seal's index frame comes before the commit frame, but
		// a sealed tail is about to be replaced, and full.)
		used = int64(off) + walFrameHeaderLen + int64(n+padding(n)) + walFrameHeaderLen
	}
	return max(size-used, 0)
}

// DiskBytesInUse returns the bytes the node's files under DataDir hold:
// their sizes, less the part of the newest log segment that was
// preallocated and not yet written. 0 for stores the caller passed in.
func (n *Node) DiskBytesInUse() int64 {
	if n.dataDir == "" {
		return 0
	}
	var size int64
	_ = filepath.WalkDir(n.dataDir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	return max(size-n.walTail.unused(), 0)
}
