package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// walTestConfig is a wal node with 1 MiB segments, so that a few 60 KB
// values fill several.
func walTestConfig(t testing.TB, dir string) Config {
	cfg := testConfig(dir, "wal")
	cfg.WALSegmentSize = 1 << 20
	cfg.MinFreeBytes = -1
	return cfg
}

// bigValue is a 60 KB value whose bytes say which key it belongs to.
func bigValue(i int) string { return strings.Repeat(fmt.Sprintf("value-%03d|", i), 6000) }

// fillWAL writes n big values into a fresh wal node on dir, closes it,
// and returns the index of the last entry it wrote.
func fillWAL(t *testing.T, dir string, n int) uint64 {
	t.Helper()
	node := openFake(t, walTestConfig(t, dir), nil)
	waitLeader(t, node)
	for i := range n {
		put(t, node, fmt.Sprintf("k%03d", i), bigValue(i))
	}
	last := node.AppliedIndex()
	if err := node.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return last
}

// segments lists the wal's segment files, oldest first.
func segments(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "raft", "wal", "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// flipByteOf changes one byte in the middle of value i where it is stored
// in file, and reports the offset.
func flipByteOf(t *testing.T, file string, i int) int64 {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(data, []byte(bigValue(i)[:100]))
	if at < 0 {
		t.Fatalf("value %d is not in %s", i, file)
	}
	at += 30000
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{data[at] ^ 0x20}, int64(at)); err != nil {
		t.Fatal(err)
	}
	return int64(at)
}

func TestCorruptionInASealedSegmentIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fillWAL(t, dir, 40)
	segs := segments(t, dir)
	if len(segs) < 3 {
		t.Fatalf("got = %d segments, expected: at least 3 (two sealed)", len(segs))
	}
	flipByteOf(t, segs[0], 3)

	_, err := open(walTestConfig(t, dir), newFake(nil))
	if !errors.Is(err, ErrCorruptLog) {
		t.Fatalf("got = %v, expected: ErrCorruptLog", err)
	}
	var ce *CorruptLogError
	if !errors.As(err, &ce) || ce.File != segs[0] {
		t.Fatalf("got = %v, expected: a *CorruptLogError naming %s", err, segs[0])
	}
	if !strings.Contains(err.Error(), segs[0]) || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("got = %q, expected: the file and the checksum mismatch named", err)
	}
	// Refusing changed nothing: it refuses again the same way.
	if _, err2 := open(walTestConfig(t, dir), newFake(nil)); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("second open: got = %v, expected: %v", err2, err)
	}
}

func TestCorruptionInTheTailsOlderBatchIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fillWAL(t, dir, 40)
	segs := segments(t, dir)
	tail := segs[len(segs)-1]
	data, err := os.ReadFile(tail)
	if err != nil {
		t.Fatal(err)
	}
	// The first value in the tail is not in its last batch.
	first := -1
	for i := range 40 {
		if bytes.Contains(data, []byte(bigValue(i)[:100])) {
			first = i
			break
		}
	}
	if first < 0 || first == 39 {
		t.Fatalf("the tail %s holds no older batch (first value %d)", tail, first)
	}
	flipByteOf(t, tail, first)
	_, err = open(walTestConfig(t, dir), newFake(nil))
	var ce *CorruptLogError
	if !errors.As(err, &ce) || ce.File != tail {
		t.Fatalf("got = %v, expected: a *CorruptLogError naming the tail %s", err, tail)
	}
}

// writtenEnd is where the data written to a preallocated segment ends:
// past its last byte that is not zero, rounded up to a frame.
func writtenEnd(t *testing.T, file string) int64 {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	end := len(bytes.TrimRight(data, "\x00"))
	return int64(end + padding(end))
}

// overwrite writes b at offset in file.
func overwrite(t *testing.T, file string, offset int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, offset); err != nil {
		t.Fatal(err)
	}
}

// A torn last write — the final batch's sync never finished, so nothing
// in it was acknowledged — is dropped, and the node starts on the rest.
// A crash leaves one of two shapes: the batch stops where writing
// stopped, or a sector of it never reached the disk while a later one
// (its commit frame) did. (The batches here were acknowledged, which a
// torn one never is: the damage only takes their shape.)
func TestATornLastWriteIsDropped(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		tear func(t *testing.T, tail string)
	}{
		{"the batch stops mid-entry", func(t *testing.T, tail string) {
			end := writtenEnd(t, tail)
			at := end - 20000 // inside value 9, the last batch's entry
			overwrite(t, tail, at, make([]byte, end-at))
		}},
		{"a sector inside the batch never written", func(t *testing.T, tail string) {
			at := (writtenEnd(t, tail) - 30000) &^ (sectorSize - 1)
			overwrite(t, tail, at, make([]byte, sectorSize))
		}},
		{"the batch's first sectors never written, later ones were", func(t *testing.T, tail string) {
			// Its first frame header and the start of its entry: nothing
			// whole follows, so it was never synced (a zeroed batch with
			// whole batches after it is a lost write: walmisplaced_test.go).
			data, err := os.ReadFile(tail)
			if err != nil {
				t.Fatal(err)
			}
			s, _ := batchSpan(t, data, 9)
			end := (s/sectorSize + 2) * sectorSize
			overwrite(t, tail, s, make([]byte, end-s))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fillWAL(t, dir, 10)
			segs := segments(t, dir)
			tt.tear(t, segs[len(segs)-1])

			n := openFake(t, walTestConfig(t, dir), nil)
			waitLeader(t, n)
			got, _ := readKV(t, n)
			if _, ok := got["k009"]; ok {
				t.Fatalf("got = k009 after its batch was torn, expected: dropped")
			}
			if got["k008"] != bigValue(8) {
				t.Fatalf("got = k008 %.20q, expected: the value written before the torn batch", got["k008"])
			}
			// The node writes on, and what it wrote over the torn batch
			// is there after another restart.
			put(t, n, "after", "v")
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			n = openFake(t, walTestConfig(t, dir), nil)
			waitLeader(t, n)
			if got, _ := readKV(t, n); got["after"] != "v" {
				t.Fatalf("got = after %q after a restart, expected: v", got["after"])
			}
		})
	}
}

// Damage to the last batch that no crash could leave — bytes changed
// after they were written and synced, so perhaps acknowledged — is
// refused, naming the file, the offset and the entries at stake, never
// dropped in silence. The outside check that found this overwrote the
// last 16 bytes of the newest segment's data with random bytes.
func TestDamageToTheLastBatchIsRefused(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		damage func(t *testing.T, tail string)
	}{
		{"a flipped byte", func(t *testing.T, tail string) { flipByteOf(t, tail, 9) }},
		{"its last 16 bytes overwritten", func(t *testing.T, tail string) {
			overwrite(t, tail, writtenEnd(t, tail)-16, []byte{0x5b, 0x13, 0xe2, 0x7f, 0x01, 0x99, 0xc4, 0x3a, 0xd0, 0x6e, 0x28, 0xf1, 0x47, 0x0c, 0xb5, 0x8d})
		}},
		{"a frame header zeroed, data after it", func(t *testing.T, tail string) {
			data, err := os.ReadFile(tail)
			if err != nil {
				t.Fatal(err)
			}
			// The header of value 9's entry frame: 8 bytes before its
			// payload's start, aligned.
			at := int64(bytes.Index(data, []byte(bigValue(9)[:100])))
			overwrite(t, tail, (at-8)&^7, make([]byte, 8))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fillWAL(t, dir, 10)
			segs := segments(t, dir)
			tail := segs[len(segs)-1]
			tt.damage(t, tail)

			_, err := open(walTestConfig(t, dir), newFake(nil))
			var ce *CorruptLogError
			if !errors.As(err, &ce) || ce.File != tail || ce.FirstIndex == 0 || ce.Offset <= 0 {
				t.Fatalf("got = %v, expected: a *CorruptLogError naming the tail %s, an offset and the entries", err, tail)
			}
			if !strings.Contains(err.Error(), "entries") || !strings.Contains(err.Error(), tail) {
				t.Fatalf("got = %q, expected: the file and the entries named", err)
			}
			// Refusing changed nothing.
			if _, err2 := open(walTestConfig(t, dir), newFake(nil)); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("second open: got = %v, expected: %v", err2, err)
			}
		})
	}
}

func TestRepairLogCutsTheDamageOff(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fillWAL(t, dir, 40)
	segs := segments(t, dir)
	flipByteOf(t, segs[1], 20) // value 20 lives in the second segment
	cfg := walTestConfig(t, dir)
	cfg.RepairLog = true
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	got, _ := readKV(t, n)
	for i := range 40 {
		_, ok := got[fmt.Sprintf("k%03d", i)]
		if i < 20 && !ok {
			t.Fatalf("got = k%03d missing, expected: kept (written before the damage)", i)
		}
		if i >= 20 && ok {
			t.Fatalf("got = k%03d present, expected: cut off with the damaged batch and all after it", i)
		}
	}
	put(t, n, "after", "repair")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// What is left verifies without RepairLog.
	n = openFake(t, walTestConfig(t, dir), nil)
	waitLeader(t, n)
	if got, _ := readKV(t, n); got["after"] != "repair" || got["k019"] != bigValue(19) {
		t.Fatalf("got = after=%q k019 ok=%v, expected: both kept across a reopen", got["after"], got["k019"] == bigValue(19))
	}
}

// Damage in entries a snapshot already holds loses nothing: the repair
// drops only the head of the log up to the damage.
func TestRepairLogKeepsEverythingWhenASnapshotCoversTheDamage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := openFake(t, walTestConfig(t, dir), nil)
	waitLeader(t, n)
	for i := range 40 {
		put(t, n, fmt.Sprintf("k%03d", i), bigValue(i))
	}
	snapshotNow(t, n)
	put(t, n, "k040", "after the snapshot")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	segs := segments(t, dir)
	flipByteOf(t, segs[0], 2)
	if _, err := open(walTestConfig(t, dir), newFake(nil)); !errors.Is(err, ErrCorruptLog) {
		t.Fatalf("got = %v, expected: ErrCorruptLog without RepairLog", err)
	}

	cfg := walTestConfig(t, dir)
	cfg.RepairLog = true
	n = openFake(t, cfg, nil)
	waitLeader(t, n)
	got, _ := readKV(t, n)
	if len(got) != 41 || got["k002"] != bigValue(2) || got["k040"] != "after the snapshot" {
		t.Fatalf("got = %d keys (k002 ok=%v, k040=%q), expected: all 41 kept", len(got), got["k002"] == bigValue(2), got["k040"])
	}
}

// tailEnd parses the newest segment's frames and returns where its last
// commit frame ends and where its last entry frame starts, with that
// entry's payload length.
func tailEnd(t *testing.T, file string) (end, lastEntry int64, lastLen int) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(walFileHeaderLen); off+walFrameHeaderLen <= int64(len(data)); {
		typ, n := data[off], int(binary.LittleEndian.Uint32(data[off+4:off+8]))
		switch typ {
		case walFrameCommit:
			off += walFrameHeaderLen
			end = off
			continue
		case walFrameEntry:
			lastEntry, lastLen = off, n
		case walFrameIndex:
		default:
			return end, lastEntry, lastLen
		}
		off += walFrameHeaderLen + int64(n+padding(n))
	}
	return end, lastEntry, lastLen
}

// Damage after the newest segment's last entry is in no entry raft-wal
// reads, so deleting entries cannot remove it: the repair must cut the
// file back to its last intact batch, name what it lost, and start.
func TestRepairLogCutsDamageAfterTheLastEntry(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		damage func(t *testing.T, tail string)
		kept   int    // keys k000..k(kept-1) survive
		logged string // what the repair says it lost
	}{
		{
			name: "non-zero bytes after the last frame lose nothing",
			damage: func(t *testing.T, tail string) {
				end, _, _ := tailEnd(t, tail)
				f, err := os.OpenFile(tail, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteAt(bytes.Repeat([]byte{0xab}, 100), end); err != nil {
					t.Fatal(err)
				}
			},
			kept: 10, logged: "no entry was lost",
		},
		{
			name: "a file cut inside its last entry frame loses that entry's batch",
			damage: func(t *testing.T, tail string) {
				_, at, n := tailEnd(t, tail)
				if err := os.Truncate(tail, at+walFrameHeaderLen+int64(n/2)); err != nil {
					t.Fatal(err)
				}
			},
			kept: 9, logged: "lost_from=",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fillWAL(t, dir, 10)
			segs := segments(t, dir)
			tt.damage(t, segs[len(segs)-1])

			if _, err := open(walTestConfig(t, dir), newFake(nil)); !errors.Is(err, ErrCorruptLog) {
				t.Fatalf("got = %v without RepairLog, expected: ErrCorruptLog", err)
			}
			n, logs := openRepairing(t, dir)
			waitLeader(t, n)
			if !strings.Contains(logs.String(), "repaired the raft log") || !strings.Contains(logs.String(), tt.logged) {
				t.Fatalf("got = log %q, expected: the repair reported with %q", logs.String(), tt.logged)
			}
			got, _ := readKV(t, n)
			for i := range 10 {
				if _, ok := got[fmt.Sprintf("k%03d", i)]; ok != (i < tt.kept) {
					t.Fatalf("got = k%03d present=%v, expected: %v", i, ok, i < tt.kept)
				}
			}
			put(t, n, "after", "repair")
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			n = openFake(t, walTestConfig(t, dir), nil)
			waitLeader(t, n)
			if got, _ := readKV(t, n); got["after"] != "repair" || len(got) != tt.kept+1 {
				t.Fatalf("got = %d keys, after=%q, expected: %d and the write after the repair, without RepairLog", len(got), got["after"], tt.kept+1)
			}
		})
	}
}

// openRepairing opens the wal node on dir with RepairLog, which must
// start it, and returns it with what it logged.
func openRepairing(t *testing.T, dir string) (*Node, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	cfg := walTestConfig(t, dir)
	cfg.RepairLog = true
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	n, err := open(cfg, newFake(nil))
	if err != nil {
		t.Fatalf("got = %v with RepairLog, expected: it starts", err)
	}
	return n, logs
}

// syncBuffer is a log destination raft's goroutines may write to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
