package raftnode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/hashicorp/raft-wal/segment"
)

// What lies after damage, or after a segment's last batch: the whole
// batches that show how far a newest segment reached, which a repair
// must owe (walcheck.go's verifySegment and walrepair.go use them).

// misplacedEntry is the first entry frame of a batch whose own index is
// not the one its place in the segment gives it.
type misplacedEntry struct {
	offset    int64
	got, want uint64
}

// afterLastBatch decides what a zeroed frame header at offset, where the
// batch starting at batchStart (entries from first) would begin, means
// in the tail segment. Nothing but zeros after it: the end of the log.
// Whole batches after it, each passing its checksum: the batch at offset
// was synced (raft-wal writes a batch only once the one before it is
// synced), and then read back as zeros: a lost write, damage to be
// refused, with everything from there at stake. Anything else after it
// is a torn last batch whose first sector never reached the disk, which
// the caller clears.
//
// What this cannot see is the loss of the newest synced batch with
// nothing written after it: the log then reads as whole, and shorter.
// A single node may lose the writes it acknowledged last that way;
// a member would be caught out by the leader's next heartbeat (loglost.go).
func afterLastBatch(path string, s *segmentScan, offset int64, first uint64, live func(first, last uint64) bool,
	corrupt func(offset int64, first, last uint64, reason string, args ...any) *CorruptLogError,
	tailDamage func(ce *CorruptLogError, batchStart int64, seen uint64) error) (torn int64, err error) {
	at, rest, err := s.restAfterZeros()
	if err != nil {
		return -1, fmt.Errorf("raftnode: read log segment %s: %w", path, err)
	}
	if rest == nil {
		return -1, nil // the end of the log
	}
	from, last := wholeBatches(rest)
	if last == 0 {
		// The run from the first bytes after the zeros may be broken
		// where a whole batch still lies further on: a copy of the
		// lost batch landed on the next one's place, and the batches
		// written after it then landed over parts of the copy. A torn
		// batch leaves no whole batch behind it (what reached the disk
		// of it fails its checksum from any frame on); taken for one,
		// the lost batch and those after it were dropped, and the
		// member owed none of them and helped elect a leader without a
		// committed entry (internal/sim seed 2401594).
		for _, w := range wholeBatchesIn(rest) {
			if !w.headerCopy && w.first >= first && w.last > last {
				if from == 0 {
					from = w.first
				}
				last = w.last
			}
		}
	}
	if last == 0 {
		return offset, nil // a torn last batch, its first sector never written
	}
	if !live(first, last) {
		return -1, nil
	}
	return -1, tailDamage(corrupt(offset, first, last, "a batch read back as zeros with whole batches after it, from offset %d (entries %d..%d): a synced write was lost", at, from, last), offset, last)
}

// wholeBatches reads b as batches of frames, as raft-wal writes them,
// for as long as each ends in a commit frame whose CRC-32C matches and
// begins with the entry after the last one's, and
// returns the index of the first entry and of the last entry in them (0,
// 0: not one whole batch).
func wholeBatches(b []byte) (first, last uint64) {
	first, last, _ = wholeBatchesEnd(b, 0)
	return first, last
}

// wholeBatchesEnd is wholeBatches that also says where the last whole
// batch ends in b (0: none). The first skip bytes are not frames but
// count toward the first batch's checksum: a segment's file header,
// which its first batch's CRC covers.
func wholeBatchesEnd(b []byte, skip int) (first, last uint64, end int) {
	crc := crc32.New(castagnoli)
	crc.Write(b[:skip])
	var batchFirst, batchLast uint64
	for off := skip; off+walFrameHeaderLen <= len(b); {
		fh := b[off : off+walFrameHeaderLen]
		typ, length := fh[0], int(binary.LittleEndian.Uint32(fh[4:8]))
		if !allZero(fh[1:4]) {
			return first, last, end
		}
		switch typ {
		case walFrameCommit:
			if crc.Sum32() != uint32(length) || batchLast == 0 {
				return first, last, end
			}
			if last != 0 && batchFirst != last+1 {
				// Whole, but not the next batch: a run is in sequence, and
				// this one (a copy landed here?) starts a run of its own.
				return first, last, end
			}
			if first == 0 {
				first = batchFirst
			}
			last, batchFirst, batchLast = batchLast, 0, 0
			crc.Reset()
			off += walFrameHeaderLen
			end = off
		case walFrameEntry, walFrameIndex:
			next := off + walFrameHeaderLen + length + padding(length)
			if length > segment.MaxEntrySize || next > len(b) {
				return first, last, end
			}
			if typ == walFrameEntry {
				idx, n := binary.Uvarint(b[off+walFrameHeaderLen : off+walFrameHeaderLen+length])
				if n <= 0 {
					return first, last, end
				}
				if batchFirst == 0 {
					batchFirst = idx
				}
				batchLast = idx
			}
			crc.Write(b[off:next])
			off = next
		default:
			return first, last, end
		}
	}
	return first, last, end
}

// wholeBatch is a whole batch found in bytes after damage: where it
// starts and ends in them, its first and last entries, and whether it
// came with a segment's file header, which only a segment's first 32
// bytes hold: a copy landed in the wrong place.
type wholeBatch struct {
	start, end  int
	first, last uint64
	headerCopy  bool
}

// wholeBatchesIn looks through b, the bytes of the newest segment after
// damage, for whole batches wherever they start (a damaged frame header
// hides where the next frame begins), each checked against its CRC, in
// the order they lie. raft-wal writes a batch only once the one before
// it is synced, so the entries up to a whole batch found further on were
// synced, and may have been acknowledged: a repair owes them all, not
// just those before the damage (internal/sim, on the real log store: a
// member whose damaged header stopped the scan owed nothing, voted, and
// helped elect a leader without a committed entry). Frames are 8-byte
// aligned from the file's start; b starts at such a word
// (restAfterZeros).
func wholeBatchesIn(b []byte) (found []wholeBatch) {
	for p := 0; p+walFrameHeaderLen <= len(b); p += walFrameHeaderLen {
		skip := 0
		switch {
		case p+walFileHeaderLen <= len(b) && binary.LittleEndian.Uint32(b[p:]) == walMagic:
			skip = walFileHeaderLen // a segment's first batch, header and all
		case b[p] != walFrameEntry || !allZero(b[p+1:p+4]):
			continue
		}
		if f, l, e := wholeBatchesEnd(b[p:], skip); l > 0 {
			found = append(found, wholeBatch{start: p, end: p + e, first: f, last: l, headerCopy: skip > 0})
			p += e - walFrameHeaderLen
		}
	}
	return found
}

// overrun checks that what looks like a torn last batch, the bytes of
// the tail from batchStart to end with only zeros after them, holds no
// whole batch of later entries (from first on). A torn batch is the
// last one written; a whole batch inside it means a frame's length was
// damaged and the scan read it as one frame over batches the log went
// on to, synced, and perhaps acknowledged (internal/sim seed 300312: a
// bit flip in an entry's length jumped the scan over 22 entries into
// the zeros past the end, and the member dropped them as torn, owed
// nothing, and helped elect a leader without a committed entry). That
// is damage from batchStart, owing every entry up to the last whole
// batch and a bound for the bytes written after it.
//
// Nor may the batch itself end in its commit frame with every sector
// before it written (committedTail): then it was written whole, and a
// damaged length jumped the scan over its own commit (internal/sim seed
// 200706: a bit flip in the length of entry 5's frame, the batch of 5
// and 6, committed with one follower, dropped as torn; the member owed
// nothing and was elected with a log that ended at 4). That is damage
// to the batch's entries, owing a bound for its bytes. nil: none.
func overrun(file io.ReaderAt, batchStart, end int64, first uint64,
	tailDamage func(ce *CorruptLogError, batchStart int64, seen uint64) error,
	corrupt func(offset int64, first, last uint64, reason string, args ...any) *CorruptLogError) error {
	b := make([]byte, end-batchStart)
	if _, err := file.ReadAt(b, batchStart); err != nil && err != io.EOF {
		return fmt.Errorf("raftnode: read log segment: %w", err)
	}
	var last uint64
	var lastEnd int
	for _, w := range wholeBatchesIn(b) {
		if !w.headerCopy && w.first >= first && w.last > last {
			last, lastEnd = w.last, w.end
		}
	}
	if last == 0 {
		at := committedTail(b, batchStart)
		if at < 0 {
			return nil
		}
		ce := corrupt(batchStart, first, first, "the last batch reads as torn, but it ends in a commit frame at offset %d with every sector before it written: a damaged frame length, not a torn write", batchStart+int64(at))
		err := tailDamage(ce, batchStart, first)
		ce.owe = first - 1 + uint64((at+walFrameMin-1)/walFrameMin)
		return err
	}
	ce := corrupt(batchStart, first, last, "the last batch reads as torn, but whole batches of later entries lie inside it, up to entry %d at offset %d: a damaged frame length, not a torn write", last, batchStart+int64(lastEnd))
	err := tailDamage(ce, batchStart, last)
	// tailDamage bounds what may follow the last whole batch from the
	// end of the scan, which has read the zeros after it: from the end
	// of what was written instead.
	written := int64(len(bytes.TrimRight(b[lastEnd:], "\x00")))
	ce.owe = last + uint64((written+walFrameMin-1)/walFrameMin)
	return err
}

// committedTail is where the commit frame that ends b lies, b being the
// bytes of a last batch from batchStart (a file offset, 8-aligned) to
// the zeros after it, when every sector before that frame holds
// something: the whole batch reached the disk, commit and all. -1 when
// b does not end in a commit frame, or a whole sector of zeros lies
// before it, as in a torn write, whose sectors reach the disk in no
// order and not all of them. (A torn batch that stops where writing
// stopped ends in an entry's bytes; one whose commit frame's sector was
// written but another's was not has a sector of zeros.)
func committedTail(b []byte, batchStart int64) int {
	n := len(bytes.TrimRight(b, "\x00"))
	end := (n + walFrameHeaderLen - 1) / walFrameHeaderLen * walFrameHeaderLen
	if end < walFrameHeaderLen || end > len(b) {
		return -1
	}
	at := end - walFrameHeaderLen
	if w := b[at:end]; w[0] != walFrameCommit || !allZero(w[1:4]) {
		return -1
	}
	for sector := (batchStart + sectorSize - 1) / sectorSize * sectorSize; sector+sectorSize <= batchStart+int64(at); sector += sectorSize {
		if allZero(b[sector-batchStart : sector-batchStart+sectorSize]) {
			return -1
		}
	}
	return at
}
