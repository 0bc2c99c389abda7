package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A segment's file header is what raft-wal checks before it reads a
// segment at all: a header that does not match the segment's record
// made raft-wal's own open fail with a bare "WAL is corrupt", which is
// no *CorruptLogError, so a member refused to start where it should
// have cut the damage off and caught up from its peers, and a single
// node refused without naming the entries at stake (internal/sim seeds
// 37, 51, 180, 187 and 196, 18 and 40 with five voters). Damage to the
// header is damage to the whole segment from its first entry: a member
// cuts it off and owes every entry up to the last one synced; a single
// node refuses, naming the file, the offset and the entries, until
// --repair-log accepts the loss.
func TestADamagedSegmentHeaderIsCutOffWithTheWholeSegment(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		damage func(t *testing.T, seg string, data []byte, vals []int)
	}{
		// A misdirected write: a later batch's bytes landed at the
		// segment's start, over its header and first batch (seeds 37,
		// 196; 40 with five voters).
		{"a later batch written over the header and the first batch", func(t *testing.T, seg string, data []byte, vals []int) {
			s, e := batchSpan(t, data, vals[2])
			overwrite(t, seg, 0, data[s:e])
		}},
		// The first batch, which carries the header, read back as zeros
		// with whole batches after it: lost, or written elsewhere (seeds
		// 51, 180; 18 with five voters).
		{"the first batch and the header lost", func(t *testing.T, seg string, data []byte, vals []int) {
			_, e := batchSpan(t, data, vals[0])
			overwrite(t, seg, 0, make([]byte, e))
		}},
		// One bit of the header's reserved bytes (seed 187): raft-wal
		// reads the magic number as a 64-bit word with them.
		{"a bit flipped in the header", func(t *testing.T, seg string, data []byte, vals []int) {
			overwrite(t, seg, 4, []byte{data[4] ^ 0x10})
		}},
	} {
		for _, where := range []string{"sealed", "tail"} {
			t.Run(where+"/"+tt.name, func(t *testing.T) {
				dir := t.TempDir()
				const n = 40
				last := fillWAL(t, dir, n)
				segs := segments(t, dir)
				if len(segs) < 3 {
					t.Fatalf("got = %d segments, expected: at least 3 (two sealed)", len(segs))
				}
				seg := segs[1] // not the first: a lone node keeps its configuration
				if where == "tail" {
					seg = segs[len(segs)-1]
				}
				data, vals := valuesIn(t, seg, n)
				if len(vals) < 3 {
					t.Fatalf("%s holds values %v, expected: at least three", seg, vals)
				}
				tt.damage(t, seg, data, vals)

				// Alone, the node refuses, naming the file, the offset
				// and the entries, and changes nothing.
				_, err := open(walTestConfig(t, dir), newFake(nil))
				var ce *CorruptLogError
				if !errors.As(err, &ce) || ce.File != seg || ce.FirstIndex == 0 || !strings.Contains(err.Error(), "entries") {
					t.Fatalf("got = %v, expected: a *CorruptLogError naming %s, an offset and the entries", err, seg)
				}
				if _, err2 := open(walTestConfig(t, dir), newFake(nil)); err2 == nil || err2.Error() != err.Error() {
					t.Fatalf("second open: got = %v, expected: %v", err2, err)
				}

				// With the damage cut off, the node starts, every entry of
				// the segment and after it is owed, and nothing it serves
				// is another key's value.
				node, logs := openRepairing(t, dir)
				requireOwes(t, logs, last)
				waitLeader(t, node)
				got, _ := readKV(t, node)
				requireOwnValues(t, got)
				if _, ok := got[fmt.Sprintf("k%03d", vals[1])]; ok {
					t.Fatalf("after the repair got = k%03d, expected: cut off with its damaged segment", vals[1])
				}
				if first := vals[0] - 1; got[fmt.Sprintf("k%03d", first)] != bigValue(first) {
					t.Fatalf("after the repair got = k%03d missing, expected: kept (in a segment before the damage)", first)
				}
				requireRepairedLogVerifies(t, node, dir)
			})
		}
	}
}

// repairOwed is the highest index the repair's log lines say was lost
// or is owed (0: none).
// requireOwes fails the test unless the repair's log says it lost or
// owes every entry up to last, the last one synced.
func requireOwes(t *testing.T, logs *syncBuffer, last uint64) {
	t.Helper()
	if owed := repairOwed(logs.String()); owed < last {
		t.Fatalf("got = a repair owing up to %d (log %q), expected: at least %d, the last entry synced", owed, logs.String(), last)
	}
}

// requireOwedTo fails the test unless the repair's log names what it
// owes (owed_to), up to last at least.
func requireOwedTo(t *testing.T, logs *syncBuffer, last uint64) {
	t.Helper()
	m := regexp.MustCompile(`owed_to=(\d+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("got = log %q, expected: the repair to say what it owes", logs.String())
	}
	if owed, _ := strconv.ParseUint(m[1], 10, 64); owed < last {
		t.Fatalf("got = owed_to=%d, expected: at least %d, the last entry synced", owed, last)
	}
}

// requireOwnValues fails the test if a repaired log serves a key kNNN
// with anything but its own value: what is cut is gone, never replaced
// by another entry's bytes.
func requireOwnValues(t *testing.T, got map[string]string) {
	t.Helper()
	for k, v := range got {
		var i int
		if _, err := fmt.Sscanf(k, "k%03d", &i); err == nil && v != bigValue(i) {
			t.Fatalf("after the repair got = %s holding %.12q, expected: its own value or nothing", k, v)
		}
	}
}

func repairOwed(logs string) uint64 {
	var owed uint64
	for _, m := range regexp.MustCompile(`(?:lost_to|owed_to)=(\d+)`).FindAllStringSubmatch(logs, -1) {
		v, _ := strconv.ParseUint(m[1], 10, 64)
		owed = max(owed, v)
	}
	return owed
}

// A sealed segment is read only through its index frame, which raft-wal
// finds at the offset its record gives. Once a repair has cut a sealed
// segment's later entries off, the verifying reader skips their bytes to
// the index; a batch that then landed over the index was taken for
// frames after the cut, and passed, and raft-wal served entry offsets
// read from the batch's bytes: the member refused to start with "log
// entry 1: EOF" (internal/sim seed 104). A damaged index is damage to
// every entry the segment still holds.
func TestABatchOverASealedSegmentsIndexIsDamageToTheSegment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const n = 40
	fillWAL(t, dir, n)
	segs := segments(t, dir)
	if len(segs) < 3 {
		t.Fatalf("got = %d segments, expected: at least 3 (two sealed)", len(segs))
	}
	seg := segs[1] // not the first: a lone node keeps its configuration
	data, vals := valuesIn(t, seg, n)
	if len(vals) < 5 {
		t.Fatalf("%s holds values %v, expected: at least five", seg, vals)
	}
	// A batch lost in the middle: the repair cuts it and all after it,
	// and leaves its bytes and the index in place.
	s, e := batchSpan(t, data, vals[3])
	overwrite(t, seg, s, make([]byte, e-s))
	node, _ := openRepairing(t, dir)
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
	// Then a batch lands over the index frame, which lies after the
	// cut: over the dead entries before it and the index's own header.
	index := int64(-1)
	for _, f := range frames(data) {
		if f.typ == walFrameIndex {
			index = f.offset
		}
	}
	if index < 0 {
		t.Fatalf("%s has no index frame", seg)
	}
	bs, be := batchSpan(t, data, vals[1])
	overwrite(t, seg, index+64-(be-bs), data[bs:be])

	_, err := open(walTestConfig(t, dir), newFake(nil))
	var ce *CorruptLogError
	if !errors.As(err, &ce) || ce.File != seg || !strings.Contains(err.Error(), "index") {
		t.Fatalf("got = %v, expected: a *CorruptLogError naming %s and its index", err, seg)
	}
	node, _ = openRepairing(t, dir)
	waitLeader(t, node)
	got, _ := readKV(t, node)
	if first := vals[0] - 1; got[fmt.Sprintf("k%03d", first)] != bigValue(first) {
		t.Fatalf("after the repair got = k%03d missing, expected: kept (in a segment before the damage)", first)
	}
	requireOwnValues(t, got)
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
}

// walFrame is one frame of a segment.
type walFrame struct {
	offset int64
	typ    byte
}

// frames lists the frames of an undamaged segment's bytes, from its
// header to its first zeroed frame header.
func frames(data []byte) []walFrame {
	var fs []walFrame
	for off := int64(walFileHeaderLen); off+walFrameHeaderLen <= int64(len(data)); {
		h := data[off : off+walFrameHeaderLen]
		if allZero(h) {
			break
		}
		typ, length := h[0], int64(binary.LittleEndian.Uint32(h[4:8]))
		fs = append(fs, walFrame{off, typ})
		off += walFrameHeaderLen
		if typ != walFrameCommit {
			off += length + int64(padding(int(length)))
		}
	}
	return fs
}
