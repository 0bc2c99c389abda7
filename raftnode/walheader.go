package raftnode

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// raft-wal checks a segment's file header against the segment's record
// before it reads the segment (a sealed one on Open, the tail once it
// finds a commit in it), and fails the whole open with a bare
// types.ErrCorrupt when they differ. The verifying reader reports such a
// header as damage to the whole segment (walcheck.go), but a repair
// needs the WAL open to cut it off: without that a member whose header
// was hit refused to start instead of catching up from its peers
// (internal/sim seeds 37, 51, 180, 187, 196). So an open with repair
// that found a segment's header damaged hands raft-wal a view of it in
// which nothing damaged is read:
//
//   - a sealed segment with the header its record gives. raft-wal reads
//     a sealed segment's entries only through its index, and the
//     repair cuts every entry of it off before anything is read.
//   - a tail read as empty, all zeros, which is what the repair makes
//     of it (it cuts the file back to its start): raft-wal would
//     otherwise read frames from bytes that are not this segment's.
//
// The view is never written: the repair cuts a damaged tail after the
// WAL is closed, and deletes a damaged sealed segment whole.

// walHeader is the file header raft-wal writes for a segment
// (segment/format.go writeFileHeader).
func walHeader(info types.SegmentInfo) []byte {
	h := make([]byte, walFileHeaderLen)
	binary.LittleEndian.PutUint32(h[0:4], walMagic)
	h[7] = walVersion
	binary.LittleEndian.PutUint64(h[8:16], info.BaseIndex)
	binary.LittleEndian.PutUint64(h[16:24], info.ID)
	binary.LittleEndian.PutUint64(h[24:32], info.Codec)
	return h
}

// headerView is a segment file system in which one segment, name, reads
// with header over its first bytes, or as zeros throughout when empty.
type headerView struct {
	WALFS
	name   string
	header []byte
	empty  bool
}

// damagedHeaderFiler is a raft-wal filer over the view of info's
// segment that open with repair hands raft-wal: empty for the tail
// (sealed false), with the header its record gives for a sealed one.
func (f *verifyingFiler) damagedHeaderFiler(info types.SegmentInfo, sealed bool) *segment.Filer {
	return segment.NewFiler(f.dir, headerView{WALFS: f.fs, name: segment.FileName(info), header: walHeader(info), empty: !sealed})
}

func (v headerView) OpenReader(dir, name string) (types.ReadableFile, error) {
	r, err := v.WALFS.OpenReader(dir, name)
	if err != nil || name != v.name {
		return r, err
	}
	return &headerViewFile{ReadableFile: r, v: v}, nil
}

func (v headerView) OpenWriter(dir, name string) (types.WritableFile, error) {
	w, err := v.WALFS.OpenWriter(dir, name)
	if err != nil || name != v.name {
		return w, err
	}
	return &headerViewWriter{headerViewFile{ReadableFile: w, v: v}, w}, nil
}

type headerViewFile struct {
	types.ReadableFile
	v headerView
}

func (f *headerViewFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.ReadableFile.ReadAt(p, off)
	if f.v.empty {
		clear(p[:n])
	} else if off < int64(len(f.v.header)) {
		copy(p[:n], f.v.header[off:])
	}
	return n, err
}

type headerViewWriter struct {
	headerViewFile
	w types.WritableFile
}

func (w *headerViewWriter) WriteAt(p []byte, off int64) (int, error) {
	return 0, fmt.Errorf("raftnode: log segment %s is damaged at its file header, and is read as the repair will leave it until the repair has cut it: not written", w.v.name)
}

func (w *headerViewWriter) Sync() error { return w.w.Sync() }
