package raftnode

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"

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
	// starts between cutAt and the damage, or in a whole batch after the
	// damage, FirstIndex-1 when none does. owe is no lower than seen and
	// bounds every entry whose frame may have started after cutAt, read
	// or not: one for each walFrameMin bytes written after cutAt.
	cutAt int64
	seen  uint64
	owe   uint64

	// header: the segment's file header is damaged too, which raft-wal
	// checks before it reads the segment at all (walheader.go).
	header bool
}

// walFrameMin is the fewest bytes an entry takes in a segment: an 8-byte
// frame header and a payload padded to 8 (raft-wal's encoding of a log
// entry is never under 8 bytes).
const walFrameMin = 16

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
	fs     WALFS
	repair bool
	space  *spaceCheck  // nil: not measured (set once the WAL is open)
	log    *slog.Logger // nil: torn writes are cleared without a word
	tail   *walTail     // nil: not recorded
	found  *CorruptLogError
}

func newVerifyingFiler(dir string, fsys WALFS, repair bool) *verifyingFiler {
	return &verifyingFiler{Filer: segment.NewFiler(dir, fsys), dir: dir, fs: fsys, repair: repair}
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
		f.tail.set(w, f.fs, f.dir, info)
	}
	return w, err
}

func (f *verifyingFiler) Open(info types.SegmentInfo) (types.SegmentReader, error) {
	header, err := f.check(info, true)
	if err != nil {
		return nil, err
	}
	if header {
		return f.damagedHeaderFiler(info, true).Open(info)
	}
	return f.Filer.Open(info)
}

func (f *verifyingFiler) RecoverTail(info types.SegmentInfo) (types.SegmentWriter, error) {
	header, err := f.check(info, false)
	if err != nil {
		return nil, err
	}
	if header {
		w, err := f.damagedHeaderFiler(info, false).RecoverTail(info)
		return f.track(info, w, err)
	}
	w, err := f.Filer.RecoverTail(info)
	return f.track(info, w, err)
}

// check verifies info's segment; with repair it records damage rather
// than refuse it, and reports whether the damage includes the segment's
// file header, which raft-wal would refuse.
func (f *verifyingFiler) check(info types.SegmentInfo, sealed bool) (header bool, err error) {
	name := segment.FileName(info)
	torn, err := verifySegment(f.fs, f.dir, name, info, sealed)
	if err == nil && torn >= 0 {
		err = clearTornWrite(f.fs, f.dir, name, torn, f.log)
	}
	var ce *CorruptLogError
	if !f.repair || !errors.As(err, &ce) {
		return false, err
	}
	// The repair cuts at the earliest damage, and everything after it
	// goes: what later damage shows was synced is owed too, though
	// raft-wal may not read that far (a damaged tail is read as empty).
	debt := func(ce *CorruptLogError) uint64 { return max(ce.seen, ce.owe, ce.LastIndex) }
	switch {
	case f.found == nil:
		f.found = ce
	case ce.FirstIndex < f.found.FirstIndex:
		ce.owe = max(ce.owe, debt(f.found))
		f.found = ce
	default:
		f.found.owe = max(f.found.owe, debt(ce))
	}
	return ce.header, nil
}

// clearTornWrite zeros the torn batch at offset in the tail segment
// name, as if it had never been written, and syncs it. raft-wal would
// drop the batch anyway and write the next one over it; but a crash
// during that write could leave part of the torn batch's frames beyond
// the new batch's end, which would then look like damage.
func clearTornWrite(fsys WALFS, dir, name string, offset int64, log *slog.Logger) error {
	if err := fsys.ZeroFrom(dir, name, offset); err != nil {
		return fmt.Errorf("raftnode: clear torn write in %s at offset %d: %w", name, offset, err)
	}
	if log != nil {
		log.Warn("raft log: dropped a torn last write, a batch whose sync never finished, so that nothing in it was acknowledged", "file", filepath.Join(dir, name), "offset", offset)
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
// A damaged length in the tail's last batch can jump the scan into the
// zeros past the end, where the batch looks torn: overrun (walscan.go)
// then finds the damage by what the scan jumped over, whole batches of
// later entries or the batch's own commit frame with every sector
// before it written.
func verifySegment(fsys WALFS, dir, name string, info types.SegmentInfo, sealed bool) (torn int64, err error) {
	path := filepath.Join(dir, name)
	file, err := fsys.OpenReader(dir, name)
	if err != nil {
		if !sealed && errors.Is(err, fs.ErrNotExist) {
			return -1, nil
		}
		return -1, fmt.Errorf("raftnode: open log segment: %w", err)
	}
	defer file.Close()
	size, err := fsys.Size(dir, name)
	if err != nil {
		return -1, fmt.Errorf("raftnode: stat log segment: %w", err)
	}
	s := &segmentScan{r: bufio.NewReaderSize(io.NewSectionReader(file, 0, size), 256<<10), size: size, zeroSector: -1}
	crc := crc32.New(castagnoli)
	var headerOK bool // the file header is the one the segment's record gives
	corrupt := func(offset int64, first, last uint64, reason string, args ...any) *CorruptLogError {
		return &CorruptLogError{File: path, Offset: offset, FirstIndex: first, LastIndex: last, Reason: fmt.Sprintf(reason, args...), cutAt: -1}
	}
	// tailDamage is damage in the newest segment at or after batchStart,
	// the end of its last intact batch.
	tailDamage := func(ce *CorruptLogError, batchStart int64, seen uint64) error {
		if !sealed {
			// Whole batches after the damage carry their own indexes: a
			// batch further on in the file than the last one counted,
			// with later entries, is one the log went on to (what lay
			// between is lost with it). Past the last such batch, every
			// byte written may be frames the damage made unreadable (a
			// misdirected write covers what it lands on with a copy of
			// older entries, or a segment's header and first batch), and
			// every entry took at least walFrameMin of them: the debt is
			// a bound there, not a count.
			written, forwardEnd := s.offset, batchStart
			if at, rest, err := s.restAfterZeros(); err == nil {
				for _, w := range wholeBatchesIn(rest) {
					if !w.headerCopy && w.first > seen {
						seen, forwardEnd = w.last, at+int64(w.end)
					}
				}
				if trimmed := len(bytes.TrimRight(rest, "\x00")); trimmed > 0 {
					written = at + int64(trimmed)
				}
			}
			ce.LastIndex = max(ce.LastIndex, seen)
			owe := seen
			if written > forwardEnd {
				owe += uint64((written - forwardEnd + walFrameMin - 1) / walFrameMin)
			}
			ce.cutAt, ce.seen, ce.owe = batchStart, seen, owe
			if !headerOK {
				// raft-wal reads no entry of a segment whose header does
				// not match: the damage reaches back to its first entry,
				// and the cut to its start. What was seen is still owed.
				ce.FirstIndex, ce.cutAt, ce.header = info.BaseIndex, 0, true
				if ce.Offset > 0 {
					ce.Reason += "; and the file header does not match the segment"
				}
			}
		}
		return ce
	}
	// segmentFirst is the segment's first entry still in the log.
	segmentFirst := max(info.BaseIndex, info.MinIndex)
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

	var (
		hdr     [walFileHeaderLen]byte
		next    = info.BaseIndex // index of the next entry frame
		commits int
	)
	// headerDamage is the tail's file header not matching the segment
	// once a batch was committed to it: damage to every entry in it, up
	// to the last one read (a header of a segment never committed to is
	// rewritten with its first batch).
	headerDamage := func(batchStart int64) error {
		return tailDamage(corrupt(0, info.BaseIndex, next-1, "the file header does not match the segment (base index %d, id %d): no entry of it can be read", info.BaseIndex, info.ID), batchStart, next-1)
	}
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
	headerOK = bytes.Equal(hdr[:], walHeader(info))
	if sealed && !headerOK {
		// raft-wal refuses to open it, and so to read any entry of it.
		ce := corrupt(0, segmentFirst, info.MaxIndex, "the file header does not match the segment (base index %d, id %d): no entry of it can be read", info.BaseIndex, info.ID)
		ce.header = true
		return -1, ce
	}

	var (
		batchStart int64 // the first batch includes the file header
		batchFirst = info.BaseIndex
		sawIndex   bool
		misplaced  *misplacedEntry // in the batch being read
		unchecked  bool            // the scan skipped to the index: its checksum covers bytes it did not read
		// IndexStart is where a sealed segment's index's data starts,
		// after its frame header.
		indexFrame = int64(info.IndexStart) - walFrameHeaderLen
		// offsets are where the entry frames of a sealed segment start,
		// from its base index, as far as the scan read them before it
		// skipped to the index: what the index must say.
		offsets []uint32
	)
	var fh [walFrameHeaderLen]byte
	for {
		offset := s.offset
		if sealed && offset == batchStart && !unchecked && offset < indexFrame && !live(batchFirst, 0) {
			// The batches from here hold only entries a truncation
			// dropped (a repair's cut leaves what it cut in place, and
			// raft-wal seals the segment with its index after them):
			// what raft-wal still reads of the segment is its index,
			// which must be there, whatever these bytes hold. Damage in
			// them once stopped the scan before the index, which then
			// went unchecked: a bit flip in it later pointed raft-wal at
			// no entry, and the member refused to start with "log entry
			// 3: EOF" (internal/sim seed 100254). The index's checksum
			// cannot be checked: when the seal rode in the last batch's
			// commit, it covers that batch too.
			if err := s.copy(io.Discard, indexFrame-offset); err != nil {
				if !errors.Is(err, errShort) {
					return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
				}
				if live(segmentFirst, 0) {
					return -1, corrupt(offset, segmentFirst, 0, "the sealed segment ends before its index frame at offset %d", indexFrame)
				}
				return -1, nil
			}
			crc.Reset()
			batchStart, unchecked = s.offset, true
			continue
		}
		err := s.read(fh[:])
		if err != nil && !errors.Is(err, errShort) {
			return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
		}
		if err != nil || allZero(fh[:]) {
			// The end of what was written. A sealed segment returns at its
			// final commit, so it gets here only damaged; in the tail,
			// frames after the last commit are a torn write if nothing
			// follows.
			if sealed {
				switch {
				case offset < indexFrame:
					// In a batch with live entries: batches of dropped
					// ones are skipped to the index where they start.
					return -1, corrupt(offset, batchFirst, 0, "the sealed segment ends before its index and commit frames")
				case live(segmentFirst, 0):
					return -1, corrupt(offset, segmentFirst, 0, "the sealed segment's index frame, which every entry in it is read through, is missing")
				}
				return -1, nil // no entry in the log is read through it
			}
			if commits > 0 && !headerOK {
				return -1, headerDamage(batchStart)
			}
			if err != nil {
				return -1, nil // the end of the file
			}
			if offset == batchStart {
				return afterLastBatch(path, s, offset, batchFirst, live, corrupt, tailDamage)
			}
			rest, err := s.restIsZero()
			switch {
			case err != nil:
				return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
			case rest:
				if err := overrun(file, batchStart, offset, batchFirst, tailDamage, corrupt); err != nil {
					return -1, err
				}
				return batchStart, nil // the last batch stops where writing stopped
			case !live(batchFirst, 0):
				return -1, nil
			}
			return -1, tailDamage(corrupt(offset, batchFirst, 0, "a zeroed frame header inside the last batch, with data after it"), batchStart, next-1)
		}
		typ, length := fh[0], binary.LittleEndian.Uint32(fh[4:8])
		if sealed && info.IndexStart > 0 && !sawIndex && offset >= indexFrame && live(segmentFirst, 0) {
			// raft-wal finds every entry of a sealed segment through the
			// index frame at the place its record gives. Damage before
			// it that a cut made dead is skipped to it, and then anything
			// but an index frame there would pass for frames after the
			// cut (internal/sim seed 104: a batch that landed over the
			// index, and raft-wal served entry offsets from its bytes).
			entries := uint64(0)
			if info.MaxIndex >= info.BaseIndex {
				entries = info.MaxIndex - info.BaseIndex + 1
			}
			if offset != indexFrame || typ != walFrameIndex || !allZero(fh[1:4]) || length%4 != 0 || uint64(length) < 4*entries ||
				offset+walFrameHeaderLen+int64(length) > s.size {
				return -1, corrupt(offset, segmentFirst, info.MaxIndex, "the sealed segment's index frame at offset %d, which every entry in it is read through, is damaged: % x at offset %d", indexFrame, fh, offset)
			}
		}
		if sealed && info.IndexStart > 0 && typ == walFrameIndex && offset < indexFrame {
			// raft-wal reads a sealed segment's index only at the place
			// its record gives; an index frame before it is a copy of a
			// seal's batch that landed at another batch's place, over
			// frames whose extent it does not show, and its own place,
			// the real index, may read as zeros, which raft-wal takes as
			// offset 0 for every entry. Taken for the index, it ended the
			// scan before the real one (internal/sim seed 1200777: the
			// repair cut only the one entry the copy counted, a snapshot
			// held it, and raft-wal then read entry 301 at the file's
			// header: "corrupt frame header with unknown type 13").
			return -1, corrupt(batchStart, batchFirst, 0, "an index frame at offset %d, where the segment's index is at offset %d: a seal's batch written at another's place", offset, indexFrame)
		}
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
			if got := crc.Sum32(); got != length && !unchecked {
				if !sealed && s.zeroSectorSince(batchStart) && (commits == 0 || headerOK) {
					rest, err := s.restIsZero()
					if err != nil {
						return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
					}
					if rest {
						if err := overrun(file, batchStart, offset, batchFirst, tailDamage, corrupt); err != nil {
							return -1, err
						}
						return batchStart, nil // a page of the last batch never reached the disk
					}
				}
				if sealed && sawIndex && live(segmentFirst, 0) {
					// The batch holds the segment's index, which raft-wal
					// reads every entry of the segment through: cutting the
					// batch's own entries would leave the index damaged.
					return -1, corrupt(batchStart, segmentFirst, 0, "checksum mismatch in the batch that holds the segment's index: its CRC-32C is %08x, its commit frame says %08x", got, length)
				}
				if live(batchFirst, next-1) {
					return -1, tailDamage(corrupt(batchStart, batchFirst, next-1, "checksum mismatch: the batch's CRC-32C is %08x, its commit frame says %08x", got, length), batchStart, next-1)
				}
			}
			if misplaced != nil && sealed && live(batchFirst, 0) {
				// In a sealed segment the copy hides how many entries
				// lay under it, so the count of the frames after it is
				// not to be trusted, nor whether those it covered were
				// live: the damage reaches to the segment's end. Counted
				// as the copy's own entries, it was cut one batch at a
				// time, each cut showing the next batch off by one, until
				// the repair gave up after ten and the member refused to
				// start (internal/sim seeds 1201564 and 1501818).
				return -1, corrupt(batchStart, batchFirst, info.MaxIndex, "the entry frame at offset %d holds entry %d where entry %d belongs: a batch written at another's place, over entries it hides, up to the segment's last", misplaced.offset, misplaced.got, misplaced.want)
			}
			if misplaced != nil && live(batchFirst, next-1) {
				// A whole batch, checksum and all, but not this place's:
				// a write that landed where another belonged (a torn one
				// fails its checksum instead, and was handled above).
				return -1, tailDamage(corrupt(batchStart, batchFirst, next-1, "the entry frame at offset %d holds entry %d where entry %d belongs: a batch written at another's place", misplaced.offset, misplaced.got, misplaced.want), batchStart, next-1)
			}
			misplaced = nil
			commits++
			if sawIndex {
				if !headerOK {
					return -1, headerDamage(batchStart) // a tail sealed, its record not yet
				}
				return -1, nil // sealed: the index and its commit end the segment
			}
			crc.Reset()
			batchStart, batchFirst = s.offset, next
			continue
		}
		crc.Write(fh[:])
		rest := int64(length) + int64(padding(int(length)))
		if typ == walFrameEntry && sealed && !unchecked {
			offsets = append(offsets, uint32(offset))
		}
		if typ == walFrameIndex && unchecked {
			// The index's checksum covers entries the scan skipped, so
			// it cannot be checked: what it says of the entries still in
			// the log is checked against where the scan found them.
			if err := checkIndex(s, crc, length, info, segmentFirst, offsets); err != nil {
				if !errors.Is(err, errBadIndex) && !errors.Is(err, errShort) {
					return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
				}
				if live(segmentFirst, 0) {
					return -1, corrupt(offset, segmentFirst, info.MaxIndex, "the sealed segment's index frame at offset %d, which every entry in it is read through, is damaged: %v", offset, err)
				}
			}
			sawIndex = true
			continue
		}
		if typ == walFrameEntry {
			// The entry's own index leads its payload (raft-wal's
			// BinaryCodec: a uvarint). raft-wal finds an entry by its
			// place in the file and never reads the index back, so a
			// batch written whole, checksum and all, at another batch's
			// place would be served as the entries that belong there.
			var lead [binary.MaxVarintLen64]byte
			b := lead[:min(int64(len(lead)), int64(length))]
			if err := s.read(b); err != nil {
				if !sealed && errors.Is(err, errShort) {
					return -1, nil
				}
				return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
			}
			crc.Write(b)
			rest -= int64(len(b))
			if got, n := binary.Uvarint(b); n <= 0 || got != next {
				if misplaced == nil {
					misplaced = &misplacedEntry{offset: offset, got: got, want: next}
				}
			}
		}
		if err := s.copy(crc, rest); err != nil {
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
