package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// Damage after the last entry of the newest raft-wal segment — non-zero
// bytes after its last frame, or the file cut off inside its last frame —
// makes the node refuse to start; --repair-log must then cut the segment
// back to its last intact batch, say which entries, if any, it lost, and
// start with every acknowledged write before the damage.
func TestRepairLogCutsDamageAfterTheLastEntry(t *testing.T) {
	t.Parallel() // its own processes, mostly waiting: it runs beside the package's other slow tests
	for _, tt := range []struct {
		name   string
		damage func(t *testing.T, segment string)
		lossy  bool // the damage takes the last batch with it
	}{
		{
			name: "non-zero bytes after the last frame",
			damage: func(t *testing.T, segment string) {
				end, _, _ := walTail(t, segment)
				writeAt(t, segment, end, []byte(strings.Repeat("garbage!", 16)))
			},
		},
		{
			// What an outside check did: its node restarted without a
			// word, the newest acknowledged puts gone.
			name: "the last 16 bytes of the last batch overwritten",
			damage: func(t *testing.T, segment string) {
				end, _, _ := walTail(t, segment)
				writeAt(t, segment, end-16, []byte{0x5b, 0x13, 0xe2, 0x7f, 0x01, 0x99, 0xc4, 0x3a, 0xd0, 0x6e, 0x28, 0xf1, 0x47, 0x0c, 0xb5, 0x8d})
			},
			lossy: true,
		},
		{
			name: "the file cut off inside its last frame",
			damage: func(t *testing.T, segment string) {
				_, last, n := walTail(t, segment)
				if err := os.Truncate(segment, last+8+int64(n/2)); err != nil {
					t.Fatal(err)
				}
			},
			lossy: true,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bin := tenureBinary(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p := newServerProc(t, bin)
			const n = 20
			value := strings.Repeat("v", 4<<10)
			tail := putThenKill(t, ctx, p, n, value)
			tt.damage(t, tail)

			// Without the flag the node refuses the log.
			run, stop := context.WithTimeout(ctx, 30*time.Second)
			defer stop()
			cmd := exec.CommandContext(run, bin, "serve", "--listen", p.listen, "--peer-listen", p.peer, "--data-dir", p.dataDir)
			setDeathSignal(cmd)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !strings.Contains(string(out), "raft log is corrupt") || !strings.Contains(string(out), "--repair-log") {
				t.Fatalf("got = %v: %s\nexpected: serve refuses the damaged log and names --repair-log", err, out)
			}
			if !strings.Contains(string(out), filepath.Base(tail)) || !regexp.MustCompile(`at offset \d+ \(entr`).Match(out) {
				t.Fatalf("got = %s\nexpected: the refusal names the file, the offset and the entries", out)
			}

			p.args = append(p.args, "--repair-log")
			p.start(ctx)
			log := proccluster.Tail(p.logPath, 200)
			repaired := regexp.MustCompile(`msg="repaired the raft log[^"]*"[^\n]*`).FindString(log)
			if repaired == "" {
				t.Fatalf("got = no repair in the log:\n%s\nexpected: what was cut reported", log)
			}
			t.Logf("%s", repaired)
			lostFrom, lostTo := logInt(repaired, "lost_from"), logInt(repaired, "lost_to")
			switch {
			case tt.lossy && (lostFrom == 0 || lostTo < lostFrom):
				t.Fatalf("got = %s\nexpected: the lost entries named (lost_from, lost_to)", repaired)
			case !tt.lossy && (!strings.Contains(repaired, "no entry was lost") || lostFrom != 0):
				t.Fatalf("got = %s\nexpected: no entry was lost", repaired)
			}
			// Every put acknowledged before the damage is there: all of
			// them, or all but the last when its batch was cut.
			for i := range n {
				key := "k" + strconv.Itoa(10000 + i)[1:]
				got, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
					return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: key}))
				})
				if tt.lossy && i == n-1 && connect.CodeOf(err) == connect.CodeNotFound {
					continue // the last batch, which the cut took
				}
				if err != nil || got.Msg.GetKv().GetValue() != value {
					t.Fatalf("after the repair, acknowledged %s: got = %v, expected: its value", key, err)
				}
			}
			if err := putKey(ctx, p, n, value); err != nil {
				t.Fatalf("put after the repair: %v", err)
			}

			// What is left verifies: later starts need no flag.
			p.kill()
			p.args = p.args[:len(p.args)-1]
			p.start(ctx)
			if err := putKey(ctx, p, n+1, value); err != nil {
				t.Fatalf("put after a restart without --repair-log: %v", err)
			}
		})
	}
}

// writeAt writes b into the file at path at offset.
func writeAt(t *testing.T, path string, offset int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, offset); err != nil {
		t.Fatal(err)
	}
}

// putThenKill starts p with no snapshot that could hold what the test
// damages (so the log's own handling is what is seen), puts keys
// k0000..k(n-1), kills it with SIGKILL and returns its newest log
// segment.
func putThenKill(t *testing.T, ctx context.Context, p *serverProc, n int, value string) string {
	t.Helper()
	p.args = []string{"--snapshot-threshold", "100000"}
	p.start(ctx)
	for i := range n {
		if err := putKey(ctx, p, i, value); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	p.kill()
	segs, err := filepath.Glob(filepath.Join(p.dataDir, "raft", "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no wal segments in %s: %v", p.dataDir, err)
	}
	sort.Strings(segs)
	return segs[len(segs)-1]
}

// walTail parses a raft-wal segment (a 32-byte header, then 8-byte
// aligned frames: type, 3 zero bytes, a 32-bit length, the payload) and
// returns where its last commit frame ends, and where its last entry
// frame starts with that entry's length.
func walTail(t *testing.T, segment string) (end, lastEntry int64, length int) {
	t.Helper()
	data, err := os.ReadFile(segment)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(32); off+8 <= int64(len(data)); {
		typ, n := data[off], int(binary.LittleEndian.Uint32(data[off+4:off+8]))
		switch typ {
		case 3: // commit: its length field is a CRC
			off += 8
			end = off
			continue
		case 1: // entry
			lastEntry, length = off, n
		case 2: // index
		default:
			if end == 0 || lastEntry == 0 {
				t.Fatalf("%s: no committed entry found", segment)
			}
			return end, lastEntry, length
		}
		off += 8 + int64((n+7)&^7)
	}
	return end, lastEntry, length
}

// logInt reads key=N from a log line; 0 when absent.
func logInt(line, key string) int {
	m := regexp.MustCompile(`\b` + key + `=(\d+)`).FindStringSubmatch(line)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// A torn last write — a batch cut short by a crash before its sync
// returned, never acknowledged — is dropped without a flag and with a
// warning, and every acknowledged put is there.
func TestATornLastWriteIsDroppedOnItsOwn(t *testing.T) {
	t.Parallel()
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newServerProc(t, bin)
	const n = 20
	value := strings.Repeat("v", 4<<10)
	tail := putThenKill(t, ctx, p, n, value)
	end, _, _ := walTail(t, tail)
	// What a crash mid-append leaves: an entry frame's header and the
	// first 400 of its 1,000 bytes, then the zeros of the preallocated
	// file.
	torn := make([]byte, 8+400)
	torn[0] = 1 // an entry frame
	binary.LittleEndian.PutUint32(torn[4:8], 1000)
	for i := 8; i < len(torn); i++ {
		torn[i] = 'x'
	}
	writeAt(t, tail, end, torn)

	p.start(ctx)
	if log := proccluster.Tail(p.logPath, 200); !strings.Contains(log, "dropped a torn last write") {
		t.Fatalf("got = no warning in the log:\n%s\nexpected: the torn write named", log)
	}
	verifyAcked(t, ctx, p, n, value)
}
