package raftnode

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/raft-wal/types"
)

// Reading a segment front to back for verifySegment (walcheck.go): the
// scan that notes the sectors of zeros a torn write leaves, and the
// checks of a sealed segment's index.

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

	// What restAfterZeros found, once it has run.
	restDone bool
	restAt   int64
	rest     []byte
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
	_, rest, err := s.restAfterZeros()
	return rest == nil, err
}

// restAfterZeros skips the zeros from here (a preallocated segment is
// mostly zeros past its last batch: they are read, not kept) and returns
// where the first 8-byte word that is not zero starts and every byte
// from it to the end; nil when there is none. It consumes the rest, and
// a second call returns the same.
func (s *segmentScan) restAfterZeros() (at int64, rest []byte, err error) {
	if s.restDone {
		return s.restAt, s.rest, nil
	}
	buf := make([]byte, 64<<10)
	for {
		start := s.offset
		n, rerr := io.ReadFull(s.r, buf)
		s.offset += int64(n)
		if i := firstNonZero(buf[:n]); i >= 0 {
			i -= int((start + int64(i)) % walFrameHeaderLen) // back to its word
			if i < 0 {
				i = 0 // the word began before this read: its zeros are gone
			}
			more, err := io.ReadAll(s.r)
			if err != nil {
				return 0, nil, err
			}
			s.offset += int64(len(more))
			s.restAt, s.rest = start+int64(i), append(buf[i:n:n], more...)
			s.restDone = true
			return s.restAt, s.rest, nil
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			s.restDone = true
			return s.offset, nil, nil
		}
		if rerr != nil {
			return 0, nil, rerr
		}
	}
}

func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
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

// errBadIndex is an index frame that does not say where the entries are.
var errBadIndex = errors.New("bad index")

// checkIndex reads the payload of a sealed segment's index frame, of
// length bytes, and checks that it points every entry from first to the
// segment's last at the frame the scan found it in (offsets, from the
// segment's base index).
func checkIndex(s *segmentScan, crc io.Writer, length uint32, info types.SegmentInfo, first uint64, offsets []uint32) error {
	index := make([]byte, int(length)+padding(int(length)))
	if err := s.read(index); err != nil {
		return err
	}
	crc.Write(index)
	for i := first; i <= info.MaxIndex; i++ {
		slot := i - info.BaseIndex
		if slot >= uint64(len(offsets)) || 4*slot+4 > uint64(length) {
			return fmt.Errorf("%w: entry %d, which the log holds, is not in it", errBadIndex, i)
		}
		if got := binary.LittleEndian.Uint32(index[4*slot:]); got != offsets[slot] {
			return fmt.Errorf("%w: it puts entry %d at offset %d, whose frame is at offset %d", errBadIndex, i, got, offsets[slot])
		}
	}
	return nil
}
