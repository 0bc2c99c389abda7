package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
)

// indexFrame is where the index frame of the sealed segment in data
// starts.
func indexFrame(t *testing.T, data []byte) int64 {
	t.Helper()
	for off := int64(walFileHeaderLen); off+walFrameHeaderLen <= int64(len(data)); {
		h := data[off : off+walFrameHeaderLen]
		typ, n := h[0], int64(binary.LittleEndian.Uint32(h[4:8]))
		switch typ {
		case walFrameIndex:
			return off
		case walFrameEntry:
			off += walFrameHeaderLen + n + int64(padding(int(n)))
		case walFrameCommit:
			off += walFrameHeaderLen
		default:
			t.Fatalf("no index frame: a frame of type %d at %d", typ, off)
		}
	}
	t.Fatal("no index frame")
	return 0
}

// raft-wal reads every entry of a sealed segment through its index, so
// damage to the index is damage to every entry in the segment. It was
// taken for damage to the last batch only (the seal rides in that
// batch's commit) or to no live entry at all (a seal of its own): the
// repair cut the wrong entries, the next open let the index pass, and
// raft-wal failed reading an entry through it ("log entry 4: WAL is
// corrupt"), so a member could not start even with RepairLog
// (internal/sim, seeds 35 and 127 on the real log store). A seal that
// never reached the disk (raft-wal records it after a failed fsync,
// docs/testing.md) is the same.
func TestADamagedIndexIsDamageToItsWholeSegment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, seg string, at int64, data []byte)
	}{
		{"a flipped byte in the index", func(t *testing.T, seg string, at int64, data []byte) {
			overwrite(t, seg, at+walFrameHeaderLen+13, []byte{data[at+walFrameHeaderLen+13] ^ 0x10})
		}},
		{"the index and its commit lost", func(t *testing.T, seg string, at int64, data []byte) {
			n := int64(binary.LittleEndian.Uint32(data[at+4 : at+8]))
			overwrite(t, seg, at, make([]byte, 2*walFrameHeaderLen+n+int64(padding(int(n)))))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fillWAL(t, dir, 40)
			segs := segments(t, dir)
			if len(segs) < 3 {
				t.Fatalf("got = %d segments, expected: at least 3 (two sealed)", len(segs))
			}
			// The second segment: the first holds the configuration the
			// node needs to elect itself once the damage is cut off.
			first, err := os.ReadFile(segs[0])
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(segs[1])
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, segs[1], indexFrame(t, data), data)

			_, err = open(walTestConfig(t, dir), newFake(nil))
			var ce *CorruptLogError
			// The segment's first entry frame leads with the entry's index.
			segFirst, _ := binary.Uvarint(data[walFileHeaderLen+walFrameHeaderLen:])
			if !errors.As(err, &ce) || ce.File != segs[1] || ce.FirstIndex != segFirst || ce.LastIndex != 0 {
				t.Fatalf("alone: got = %v, expected: a *CorruptLogError naming %s from its first entry to the end", err, segs[1])
			}
			n, _ := openRepairing(t, dir)
			waitLeader(t, n)
			got, _ := readKV(t, n)
			for i := range 40 {
				if k := fmt.Sprintf("k%03d", i); bytes.Contains(first, []byte(bigValue(i)[:100])) && got[k] != bigValue(i) {
					t.Fatalf("after the repair got = %s missing, expected: kept (in the first segment)", k)
				}
			}
			requireOwnValues(t, got)
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			// What is left verifies without RepairLog.
			n = openFake(t, walTestConfig(t, dir), nil)
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
