package raftnode

import (
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/raft-wal/types"
)

// dataSyncFile makes a segment's Sync an fdatasync where the system has
// one, as etcd's WAL does: a segment is preallocated whole, so a commit
// changes its data and never its size, and fsync's extra work is the
// inode's modification time, a journal commit of its own on ext4. The
// file system still writes whatever reading the data back needs (the
// extents the write filled in). The first Sync is the wrapped one, which
// for a new segment also syncs the directory that names it.
type dataSyncFile struct {
	types.WritableFile
	raw       syscall.RawConn
	firstDone atomic.Bool
}

// withDataSync wraps f when it exposes its descriptor and the system
// has fdatasync; otherwise f is returned as it is.
func withDataSync(f types.WritableFile, err error) (types.WritableFile, error) {
	if err != nil || !haveFdatasync {
		return f, err
	}
	sc, ok := f.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return f, nil
	}
	raw, rerr := sc.SyscallConn()
	if rerr != nil {
		return f, nil
	}
	return &dataSyncFile{WritableFile: f, raw: raw}, nil
}

func (f *dataSyncFile) Sync() error {
	if !f.firstDone.Load() {
		if err := f.WritableFile.Sync(); err != nil {
			return err
		}
		f.firstDone.Store(true)
		return nil
	}
	var serr error
	if err := f.raw.Control(func(fd uintptr) { serr = fdatasync(int(fd)) }); err != nil {
		return err
	}
	return serr
}
