package raftnode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// spaceConfig is a wal node with 1 MiB segments, a 2 MiB reserve and a
// free-space reading the test sets, measured by the ticker only once an
// hour: whatever the node notices, it notices on its own write path.
func spaceConfig(t *testing.T, free *atomic.Uint64) Config {
	cfg := walTestConfig(t, t.TempDir())
	cfg.MinFreeBytes = 2 << 20
	cfg.DiskCheckInterval = time.Hour
	cfg.FreeSpace = func(string) (uint64, error) { return free.Load(), nil }
	return cfg
}

// A burst of writes fills segments far faster than a periodic check: the
// reserve must be found gone on the append that uses it.
func TestTheReserveIsMeasuredOnEveryAppend(t *testing.T) {
	t.Parallel()
	var free atomic.Uint64
	free.Store(1 << 30)
	n := openFake(t, spaceConfig(t, &free), nil)
	waitLeader(t, n)
	put(t, n, "k0", "v")
	if err := n.DiskFull(); err != nil {
		t.Fatalf("got = %v with room, expected: nil", err)
	}
	free.Store(1 << 20)
	put(t, n, "k1", "v")
	var full *DiskFullError
	if err := n.DiskFull(); !errors.As(err, &full) || full.Reserve != 2<<20 || full.Free != 1<<20 {
		t.Fatalf("got = %v right after an append with 1 MiB free, expected: the reserve reported gone", err)
	}
	// Nothing is wrong with the log: it still leads and reads.
	if got, _ := readKV(t, n); got["k1"] != "v" {
		t.Fatalf("got = k1 %q, expected: v", got["k1"])
	}
	if err := n.LogFull(); err != nil {
		t.Fatalf("got = LogFull %v, expected: nil while the log takes appends", err)
	}
}

// When a new segment would not fit, the rotation is refused; the log
// cannot be appended to, and every call that needs a leader says the disk
// is full rather than that no leader is known. Once space is back the
// node reopens its log and takes writes again, without a restart.
func TestANewSegmentThatWouldNotFitIsRefusedAndNamed(t *testing.T) {
	t.Parallel()
	var free atomic.Uint64
	free.Store(1 << 30)
	cfg := spaceConfig(t, &free)
	cfg.MinFreeBytes = -1 // no reserve: the log itself runs out
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	free.Store(512 << 10) // less than a 1 MiB segment

	var err error
	for i := 0; i < 100 && err == nil; i++ { // 100 × 60 KB fill a segment
		_, err = n.Propose(ctxT(t), statemachine.Put{Key: fmt.Sprintf("k%03d", i), Value: bigValue(i)})
	}
	if err == nil {
		t.Fatalf("got = 100 big puts taken with 512 KiB free and 1 MiB segments, expected: the rotation refused")
	}
	// Raft steps down when its log fails; from then on every call that
	// needs the leader names the disk.
	waitFor(t, "calls to name the full disk", func() bool {
		_, err := n.Propose(ctxT(t), statemachine.Put{Key: "x", Value: "v"})
		return errors.Is(err, ErrDiskFull)
	})
	err = n.Read(ctxT(t), func(*statemachine.Machine) error { return nil })
	var full *DiskFullError
	if !errors.As(err, &full) || !errors.Is(err, ErrDiskFull) {
		t.Fatalf("got = read %v while the log cannot be written, expected: a *DiskFullError", err)
	}
	if want := "the log preallocates segments of 1.0 MiB (WALSegmentSize) and 512.0 KiB is free"; !strings.Contains(err.Error(), want) {
		t.Fatalf("got = %q, expected: the cause named, %q", err, want)
	}

	free.Store(1 << 30)
	waitFor(t, "writes to resume without a restart", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := n.Propose(ctx, statemachine.Put{Key: "after", Value: "v"})
		return err == nil
	})
	if err := n.LogFull(); err != nil {
		t.Fatalf("got = LogFull %v after the log was reopened, expected: nil", err)
	}
}

// A log found damaged when it is opened again after a full disk (a
// synced batch the disk then put at another batch's place) stops the
// node with ErrLogDamaged, for a start to repair; it does not panic the
// process, as it did when internal/sim's seed 100148 misdirected a write
// while a node waited for space.
func TestALogFoundDamagedWhenReopenedStopsTheNode(t *testing.T) {
	t.Parallel()
	var free atomic.Uint64
	free.Store(1 << 30)
	dir := t.TempDir()
	cfg := spaceConfig(t, &free)
	cfg.DataDir = dir
	cfg.MinFreeBytes = -1
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	free.Store(512 << 10)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = n.Propose(ctxT(t), statemachine.Put{Key: fmt.Sprintf("k%03d", i), Value: bigValue(i)})
	}
	if err == nil {
		t.Fatalf("got = 100 big puts taken with 512 KiB free, expected: the rotation refused")
	}
	segs := segments(t, dir)
	data, vals := valuesIn(t, segs[0], 100)
	if len(vals) < 5 {
		t.Fatalf("the first segment holds values %v, expected: at least five", vals)
	}
	misdirect(false)(t, segs[0], data, vals)

	free.Store(1 << 30)
	select {
	case <-n.Failed():
	case <-time.After(30 * time.Second):
		t.Fatal("got = the node still running 30s after space came back to a damaged log, expected: stopped")
	}
	if err := n.Err(); !errors.Is(err, ErrLogDamaged) || !strings.Contains(err.Error(), "a batch written at another's place") {
		t.Fatalf("got = Err %v, expected: ErrLogDamaged naming the misplaced batch", err)
	}
	if _, err := n.Propose(ctxT(t), statemachine.Put{Key: "after", Value: "v"}); err == nil {
		t.Fatal("got = a put taken by a node stopped for its damaged log, expected: refused")
	}
	if err := n.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	// A start finds the same damage, and refuses until the loss is
	// accepted, as after any damage found at a start.
	if _, err := open(walTestConfig(t, dir), newFake(nil)); !errors.As(err, new(*CorruptLogError)) {
		t.Fatalf("got = start %v, expected: a *CorruptLogError", err)
	}
	r, _ := openRepairing(t, dir)
	defer r.Close()
	waitLeader(t, r)
	if got, _ := readKV(t, r); got[fmt.Sprintf("k%03d", vals[0])] != bigValue(vals[0]) {
		t.Fatalf("after the repair got = k%03d missing, expected: kept (before the damage)", vals[0])
	}
}
