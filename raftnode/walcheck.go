package raftnode

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// raft-wal checksums every batch it appends (a commit frame carries the
// CRC-32C of all bytes since the previous commit frame) but, on open,
// checks only the last batch of the tail segment, to find a torn write:
// it assumes the file system never corrupts data once written. A flipped
// byte in an older batch would be replayed as real data. verifyingFiler
// checks every batch of every segment as raft-wal opens it, so such a log
// is refused before anything is applied from it.
//
// The layout read here is raft-wal v0.4's segment format (segment/
// format.go): a 32-byte file header, then 8-byte-aligned frames of a
// type byte, three reserved bytes and a 32-bit length (the CRC, for a
// commit frame), the payload and zero padding.
const (
	walFileHeaderLen  = 32
	walFrameHeaderLen = 8
	walMagic          = 0x58eb6b0d
	walVersion        = 0

	walFrameEntry  = 1
	walFrameIndex  = 2
	walFrameCommit = 3
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CorruptLogError is returned by Open when a log segment fails its
// checksums: the log cannot be trusted and nothing was applied from it.
// Entries FirstIndex..LastIndex are in the damaged batch (LastIndex is 0
// when the damage hides where the batch ends).
type CorruptLogError struct {
	File       string // the segment file
	Offset     int64  // where the damaged batch or frame starts
	FirstIndex uint64
	LastIndex  uint64
	Reason     string

	// cutAt, for damage in the newest segment, is where the last intact
	// batch before the damage ends: a repair can cut the file back to it
	// (-1 elsewhere). seen is the index of the last entry whose frame
	// starts between cutAt and the damage, FirstIndex-1 when none does.
	cutAt int64
	seen  uint64
}

func (e *CorruptLogError) Error() string {
	entries := fmt.Sprintf("entries from %d", e.FirstIndex)
	if e.LastIndex >= e.FirstIndex && e.LastIndex != 0 {
		entries = fmt.Sprintf("entries %d..%d", e.FirstIndex, e.LastIndex)
	}
	return fmt.Sprintf("raft log is corrupt: %s at offset %d (%s): %s", e.File, e.Offset, entries, e.Reason)
}

// Is makes errors.Is(err, ErrCorruptLog) match.
func (e *CorruptLogError) Is(target error) bool { return target == ErrCorruptLog }

// verifyingFiler is raft-wal's segment filer with every segment's
// checksums verified when the WAL opens it. With repair set it does not
// refuse a damaged segment but records the earliest damage in found, for
// open to cut the log there.
//
// It also measures free space around every segment it creates: before,
// to refuse one that would not fit, and after, so that the reserve
// counts the new segment's preallocation from the moment it is taken.
type verifyingFiler struct {
	*segment.Filer
	dir    string
	repair bool
	space  *spaceCheck  // nil: not measured (set once the WAL is open)
	log    *slog.Logger // nil: torn writes are cleared without a word
	tail   *walTail     // nil: not recorded
	found  *CorruptLogError
}

func newVerifyingFiler(dir string, f *segment.Filer, repair bool) *verifyingFiler {
	return &verifyingFiler{Filer: f, dir: dir, repair: repair}
}

// Create is called when raft-wal rotates to a new segment, after the
// append that sealed the old one. A refusal wedges the WAL as a failed
// preallocation would, and walStore reopens it once space is back.
func (f *verifyingFiler) Create(info types.SegmentInfo) (types.SegmentWriter, error) {
	if f.space == nil {
		w, err := f.Filer.Create(info)
		return f.track(info, w, err)
	}
	if err := f.space.room(uint64(info.SizeLimit)); err != nil {
		f.space.rotationFailed(err)
		return nil, err
	}
	w, err := f.Filer.Create(info)
	if err != nil && isNoSpace(err) {
		f.space.rotationFailed(err)
	}
	f.space.measure()
	return f.track(info, w, err)
}

// track records w, created or recovered for info, as the tail segment
// (unless err), and hands both back.
func (f *verifyingFiler) track(info types.SegmentInfo, w types.SegmentWriter, err error) (types.SegmentWriter, error) {
	if err == nil {
		f.tail.set(w, f.dir, info)
	}
	return w, err
}

func (f *verifyingFiler) Open(info types.SegmentInfo) (types.SegmentReader, error) {
	if err := f.check(info, true); err != nil {
		return nil, err
	}
	return f.Filer.Open(info)
}

func (f *verifyingFiler) RecoverTail(info types.SegmentInfo) (types.SegmentWriter, error) {
	if err := f.check(info, false); err != nil {
		return nil, err
	}
	w, err := f.Filer.RecoverTail(info)
	return f.track(info, w, err)
}

func (f *verifyingFiler) check(info types.SegmentInfo, sealed bool) error {
	path := filepath.Join(f.dir, segment.FileName(info))
	torn, err := verifySegment(path, info, sealed)
	if err == nil && torn >= 0 {
		err = clearTornWrite(path, torn, f.log)
	}
	var ce *CorruptLogError
	if !f.repair || !errors.As(err, &ce) {
		return err
	}
	if f.found == nil || ce.FirstIndex < f.found.FirstIndex {
		f.found = ce
	}
	return nil
}

// clearTornWrite zeros the torn batch at offset in the tail segment at
// path, as if it had never been written, and syncs it. raft-wal would
// drop the batch anyway and write the next one over it; but a crash
// during that write could leave part of the torn batch's frames beyond
// the new batch's end, which would then look like damage.
func clearTornWrite(path string, offset int64, log *slog.Logger) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("raftnode: clear torn write: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("raftnode: clear torn write: %w", err)
	}
	if err := f.Truncate(offset); err != nil {
		return fmt.Errorf("raftnode: clear torn write in %s at offset %d: %w", path, offset, err)
	}
	if err := f.Truncate(st.Size()); err != nil {
		return fmt.Errorf("raftnode: clear torn write in %s at offset %d: %w", path, offset, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("raftnode: clear torn write: sync %s: %w", path, err)
	}
	if log != nil {
		log.Warn("raft log: dropped a torn last write, a batch whose sync never finished, so that nothing in it was acknowledged", "file", path, "offset", offset)
	}
	return nil
}

// A torn write is what a crash leaves of the last batch when its fsync
// never returned, so that no entry in it was acknowledged: the node may
// drop it on its own. Anything else that fails its checks is damage to
// bytes that were synced, and so perhaps acknowledged: the node refuses
// to start on it and names it (--repair-log accepts the loss). The two
// are told apart by shape. The segment was preallocated as zeros, and
// the disk writes a sector (512 bytes) whole or not at all, in no
// particular order within the batch, so a torn batch is the last in the
// file, with nothing but zeros after it, and either
//
//   - stops where writing stopped: a frame header of zeros, or
//   - ends in its commit frame, but with a whole sector of zeros inside
//     it, which the checksum then fails: a page that never reached the
//     disk while a later one did.
//
// A frame header that is neither valid nor zero is never torn (headers
// are 8-byte aligned, so inside one sector), nor is a complete batch with
// a bad checksum and no sector of zeros (a bit flip, an overwrite), nor a
// zeroed header with data after it. A batch that holds a whole sector of
// zeros of its own (a value of zeros) and is then damaged would pass for
// torn: the one case told wrong, and it needs both at once.
//
// verifySegment reads a segment file from start to end and checks the
// CRC of every committed batch. A sealed segment must end in its index
// frame and a good commit. The tail may end in a torn batch, whose
// offset it returns as torn (else -1) for the caller to clear; raft-wal
// drops that batch itself. Any other damage is a
// *CorruptLogError. Damage only to entries outside the segment's live
// range (dropped by an earlier truncation) is ignored. A missing tail
// file is left for raft-wal to handle.
//
// One case looks like a torn write and passes: a damaged length in the
// tail's last batch that jumps the scan into the zeros past the end.
func verifySegment(path string, info types.SegmentInfo, sealed bool) (torn int64, err error) {
	file, err := os.Open(path)
	if err != nil {
		if !sealed && errors.Is(err, os.ErrNotExist) {
			return -1, nil
		}
		return -1, fmt.Errorf("raftnode: open log segment: %w", err)
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return -1, fmt.Errorf("raftnode: stat log segment: %w", err)
	}
	s := &segmentScan{r: bufio.NewReaderSize(file, 256<<10), size: st.Size(), zeroSector: -1}
	crc := crc32.New(castagnoli)
	corrupt := func(offset int64, first, last uint64, reason string, args ...any) *CorruptLogError {
		return &CorruptLogError{File: path, Offset: offset, FirstIndex: first, LastIndex: last, Reason: fmt.Sprintf(reason, args...), cutAt: -1}
	}
	// tailDamage is damage in the newest segment at or after batchStart,
	// the end of its last intact batch.
	tailDamage := func(ce *CorruptLogError, batchStart int64, seen uint64) error {
		if !sealed {
			ce.cutAt, ce.seen = batchStart, seen
		}
		return ce
	}
	// live reports whether any entry from first to last (0: unknown) is
	// still part of the log.
	live := func(first, last uint64) bool {
		if last != 0 && last < first {
			return false // an index frame alone
		}
		if last != 0 && info.MinIndex > 0 && last < info.MinIndex {
			return false
		}
		return info.MaxIndex == 0 || first <= info.MaxIndex
	}

	var hdr [walFileHeaderLen]byte
	if err := s.read(hdr[:]); err != nil {
		if !sealed && errors.Is(err, errShort) {
			return -1, nil // created but never committed to
		}
		if errors.Is(err, errShort) {
			return -1, corrupt(0, info.BaseIndex, 0, "the file is shorter than its header")
		}
		return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
	}
	crc.Write(hdr[:])
	headerOK := binary.LittleEndian.Uint32(hdr[0:4]) == walMagic && allZero(hdr[4:7]) && hdr[7] == walVersion &&
		binary.LittleEndian.Uint64(hdr[8:16]) == info.BaseIndex &&
		binary.LittleEndian.Uint64(hdr[16:24]) == info.ID &&
		binary.LittleEndian.Uint64(hdr[24:32]) == info.Codec

	var (
		batchStart int64 // the first batch includes the file header
		batchFirst = info.BaseIndex
		next       = info.BaseIndex // index of the next entry frame
		sawIndex   bool
		commits    int
	)
	var fh [walFrameHeaderLen]byte
	for {
		offset := s.offset
		err := s.read(fh[:])
		if err != nil && !errors.Is(err, errShort) {
			return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
		}
		if err != nil || allZero(fh[:]) {
			// The end of what was written. A sealed segment returns at its
			// final commit, so it cannot get here; in the tail, frames
			// after the last commit are a torn write if nothing follows.
			if sealed {
				return -1, corrupt(offset, batchFirst, 0, "the sealed segment ends before its index and commit frames")
			}
			if commits > 0 && !headerOK {
				return -1, corrupt(0, info.BaseIndex, 0, "the file header does not match the segment (base index %d, id %d)", info.BaseIndex, info.ID)
			}
			if err != nil || offset == batchStart {
				return -1, nil // the end of the file, or of the last batch
			}
			rest, err := s.restIsZero()
			switch {
			case err != nil:
				return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
			case rest:
				return batchStart, nil // the last batch stops where writing stopped
			case !live(batchFirst, 0):
				return -1, nil
			}
			return -1, tailDamage(corrupt(offset, batchFirst, 0, "a zeroed frame header inside the last batch, with data after it"), batchStart, next-1)
		}
		typ, length := fh[0], binary.LittleEndian.Uint32(fh[4:8])
		known := typ == walFrameEntry || typ == walFrameIndex || typ == walFrameCommit
		tooLong := typ != walFrameCommit && (int64(length) > segment.MaxEntrySize || offset+walFrameHeaderLen+int64(length) > s.size)
		if !known || !allZero(fh[1:4]) || tooLong || (sawIndex && typ != walFrameCommit) {
			// Never a torn write: a frame header is 8 bytes, aligned, so
			// inside one sector, which reaches the disk whole or reads as
			// zeros. These bytes were written, and then changed.
			if !live(batchFirst, 0) {
				return -1, nil
			}
			seen := next - 1
			if typ == walFrameEntry && allZero(fh[1:4]) {
				seen = next // an entry frame cut short or running past the end
			}
			return -1, tailDamage(corrupt(offset, batchFirst, 0, "damaged frame header % x", fh), batchStart, seen)
		}
		if typ == walFrameCommit {
			if got := crc.Sum32(); got != length {
				if !sealed && s.zeroSectorSince(batchStart) {
					rest, err := s.restIsZero()
					if err != nil {
						return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
					}
					if rest {
						return batchStart, nil // a page of the last batch never reached the disk
					}
				}
				if live(batchFirst, next-1) {
					return -1, tailDamage(corrupt(batchStart, batchFirst, next-1, "checksum mismatch: the batch's CRC-32C is %08x, its commit frame says %08x", got, length), batchStart, next-1)
				}
			}
			commits++
			if sawIndex {
				if !headerOK {
					return -1, corrupt(0, info.BaseIndex, 0, "the file header does not match the segment (base index %d, id %d)", info.BaseIndex, info.ID)
				}
				return -1, nil // sealed: the index and its commit end the segment
			}
			crc.Reset()
			batchStart, batchFirst = s.offset, next
			continue
		}
		crc.Write(fh[:])
		if err := s.copy(crc, int64(length)+int64(padding(int(length)))); err != nil {
			if !sealed && errors.Is(err, errShort) {
				return -1, nil
			}
			return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
		}
		switch typ {
		case walFrameEntry:
			next++
		case walFrameIndex:
			sawIndex = true
		}
	}
}

// errShort is a read that reached the end of the file.
var errShort = errors.New("end of file")

// segmentScan reads a segment file front to back, noting the sectors
// that were all zeros.
type segmentScan struct {
	r      *bufio.Reader
	size   int64
	offset int64

	sectorWritten bool  // the sector being read has a byte that is not zero
	zeroSector    int64 // where the last whole sector of zeros read starts; -1: none
}

// sectorSize is the unit a disk writes whole or not at all.
const sectorSize = 512

// note records b, read at s.offset, in the sectors' tally.
func (s *segmentScan) note(b []byte) {
	off := s.offset
	for len(b) > 0 {
		n := min(len(b), sectorSize-int(off%sectorSize))
		if !allZero(b[:n]) {
			s.sectorWritten = true
		}
		off += int64(n)
		b = b[n:]
		if off%sectorSize == 0 {
			if !s.sectorWritten {
				s.zeroSector = off - sectorSize
			}
			s.sectorWritten = false
		}
	}
}

// zeroSectorSince reports whether a whole sector read at or after offset
// was all zeros.
func (s *segmentScan) zeroSectorSince(offset int64) bool {
	return s.zeroSector >= offset
}

// Write lets the scan sit beside a checksum in io.CopyN.
func (s *segmentScan) Write(b []byte) (int, error) {
	s.note(b)
	s.offset += int64(len(b))
	return len(b), nil
}

func (s *segmentScan) read(b []byte) error {
	n, err := io.ReadFull(s.r, b)
	s.note(b[:n])
	s.offset += int64(n)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errShort
	}
	return err
}

// copy feeds the next n bytes to w.
func (s *segmentScan) copy(w io.Writer, n int64) error {
	_, err := io.CopyN(io.MultiWriter(w, s), s.r, n)
	if errors.Is(err, io.EOF) {
		return errShort
	}
	return err
}

// restIsZero reports whether every byte from here to the end is zero:
// what a torn last write leaves behind in a preallocated segment. It
// consumes the rest, so the scan ends after it.
func (s *segmentScan) restIsZero() (bool, error) {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.r.Read(buf)
		s.offset += int64(n)
		if !allZero(buf[:n]) {
			return false, nil
		}
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// padding is how many zero bytes align an n-byte payload to 8 bytes.
func padding(n int) int { return (walFrameHeaderLen - n%walFrameHeaderLen) & (walFrameHeaderLen - 1) }

// repairWAL cuts damage out of a WAL opened with repair. When a snapshot
// covers every damaged entry, only the log's head up to the damage goes
// and nothing is lost; otherwise the damaged entries and everything after
// them go, and the node has lost them unless another member still has
// them (a follower then gets them again from the leader).
//
// Damage past the last entry raft-wal reads (bytes after the newest
// segment's last intact batch, or that segment cut off inside a frame)
// is in no entry raft-wal holds, so deleting entries cannot remove it:
// repairWAL then returns cut, which the caller runs once w is closed, to
// cut the file back to its last intact batch.
//
// lostTo is the last index of the entries lost (0: none), which the
// node then owes its cluster (catchup.go).
func repairWAL(w *raftwal.WAL, damage *CorruptLogError, snaps raft.SnapshotStore, log *slog.Logger) (cut func() (lostTo uint64, err error), lostTo uint64, err error) {
	first, err := w.FirstIndex()
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	last, err := w.LastIndex()
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	var snapshot uint64
	metas, err := snaps.List()
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: repair log: list snapshots: %w", err)
	}
	if len(metas) > 0 {
		snapshot = metas[0].Index // newest first
	}
	if damage.cutAt >= 0 && damage.FirstIndex > last {
		return func() (uint64, error) { return cutSegment(damage, snapshot, log) }, 0, nil
	}
	end := damage.LastIndex
	if end == 0 || end > last {
		end = last // where the damage ends is unknown: assume the end
	}
	var lo, hi, lostFrom uint64
	switch {
	case end <= snapshot:
		lo, hi = first, end
	case damage.FirstIndex <= snapshot+1:
		lo, hi, lostFrom = first, last, snapshot+1
	default:
		lo, hi, lostFrom = damage.FirstIndex, last, damage.FirstIndex
	}
	if lo <= hi {
		if err := w.DeleteRange(lo, hi); err != nil {
			return nil, 0, fmt.Errorf("raftnode: repair log: delete entries %d..%d: %w", lo, hi, err)
		}
	}
	if lostFrom == 0 || lostFrom > last {
		log.Warn("repaired the raft log: removed damaged entries a snapshot covers; nothing was lost",
			"damage", damage.Error(), "removed_from", lo, "removed_to", hi, "snapshot_index", snapshot)
		return nil, 0, nil
	}
	log.Error("repaired the raft log: removed damaged entries and all after them; acknowledged writes in that range are lost on this node unless another member has them",
		"damage", damage.Error(), "lost_from", lostFrom, "lost_to", last, "snapshot_index", snapshot)
	return nil, last, nil
}

// cutSegment cuts the newest segment back to the end of its last intact
// batch, keeping the file's size: what follows reads as zeros, as in a
// preallocated segment never written that far. Entries whose frames
// started in the cut-off bytes are lost, unless the snapshot holds them.
// A torn batch never gets here (clearTornWrite drops it), so the cut
// batch was synced, and may have been acknowledged.
func cutSegment(damage *CorruptLogError, snapshot uint64, log *slog.Logger) (lostTo uint64, err error) {
	f, err := os.OpenFile(damage.File, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	if err := f.Truncate(damage.cutAt); err != nil {
		return 0, fmt.Errorf("raftnode: repair log: cut %s at offset %d: %w", damage.File, damage.cutAt, err)
	}
	if err := f.Truncate(max(st.Size(), damage.cutAt)); err != nil {
		return 0, fmt.Errorf("raftnode: repair log: zero %s after offset %d: %w", damage.File, damage.cutAt, err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("raftnode: repair log: sync %s: %w", damage.File, err)
	}
	lostFrom, lostTo := max(damage.FirstIndex, snapshot+1), damage.seen
	if lostFrom > lostTo {
		log.Warn("repaired the raft log: cut the damage after the newest segment's last intact batch off; no entry was lost",
			"damage", damage.Error(), "file", damage.File, "cut_at", damage.cutAt, "last_index", damage.FirstIndex-1, "snapshot_index", snapshot)
		return 0, nil
	}
	log.Error("repaired the raft log: cut the newest segment back to its last intact batch; the entries of the damaged batch, which were synced and may have been acknowledged, are lost on this node unless another member has them",
		"damage", damage.Error(), "file", damage.File, "cut_at", damage.cutAt, "lost_from", lostFrom, "lost_to", lostTo, "last_index", damage.FirstIndex-1, "snapshot_index", snapshot)
	return lostTo, nil
}
