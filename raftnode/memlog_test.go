package raftnode

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// heldBytes sums the entries m's MemoryStorage holds, the slow way.
func heldBytes(t testing.TB, m *memoryLog) int64 {
	t.Helper()
	first, _ := m.FirstIndex()
	last, _ := m.LastIndex()
	if last < first {
		return 0
	}
	ents, err := m.Entries(first, last+1, math.MaxUint64)
	if err != nil {
		t.Fatalf("entries %d..%d: %v", first, last, err)
	}
	var sum int64
	for _, e := range ents {
		sum += int64(e.Size())
	}
	return sum
}

func entries(term uint64, from, to uint64, size int) []raftpb.Entry {
	var out []raftpb.Entry
	for i := from; i <= to; i++ {
		out = append(out, raftpb.Entry{Index: i, Term: term, Data: make([]byte, size)})
	}
	return out
}

// TestMemoryLogCountsWhatItHolds: after every change the storage's
// entries can go through, the count is their size, exactly.
func TestMemoryLogCountsWhatItHolds(t *testing.T) {
	t.Parallel()
	m := newMemoryLog()
	steps := []struct {
		name string
		do   func() error
	}{
		{"appending entries 1 to 10", func() error { return m.Append(entries(1, 1, 10, 100)) }},
		{"appending 11 to 20", func() error { return m.Append(entries(1, 11, 20, 1000)) }},
		{"replacing a conflicting tail from 15 with larger entries", func() error { return m.Append(entries(2, 15, 18, 5000)) }},
		{"appending what overlaps the held log without conflict", func() error { return m.Append(entries(2, 17, 19, 5000)) }},
		{"compacting up to 12", func() error { return m.Compact(12) }},
		{"appending entries partly below the compaction", func() error { return m.Append(entries(2, 10, 22, 7)) }},
		{"compacting again, up to 20", func() error { return m.Compact(20) }},
		{"applying a snapshot at 40", func() error {
			return m.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 40, Term: 3}})
		}},
		{"appending after the snapshot", func() error { return m.Append(entries(3, 41, 45, 300)) }},
	}
	for _, step := range steps {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got, want := m.Bytes(), heldBytes(t, m); got != want {
			t.Fatalf("after %s: Bytes() = %d, expected: %d, the size of the entries held", step.name, got, want)
		}
	}
	if err := m.Compact(30); !errors.Is(err, etcdraft.ErrCompacted) {
		t.Fatalf("compacting below the snapshot: got = %v, expected: ErrCompacted", err)
	}
	if got, want := m.Bytes(), heldBytes(t, m); got != want {
		t.Fatalf("after a refused compaction: Bytes() = %d, expected: %d", got, want)
	}
}

// TestCompactionIndexKeepsATailBoundedByCountAndBytes: the catch-up tail
// a compaction leaves is bounded by whichever of its two limits binds
// first; past what memory holds, the count decides, as it did before
// the bytes.
func TestCompactionIndexKeepsATailBoundedByCountAndBytes(t *testing.T) {
	t.Parallel()
	m := newMemoryLog()
	if err := m.Append(entries(1, 1, 100, 1000)); err != nil {
		t.Fatal(err)
	}
	size := int64(m.Bytes() / 100)
	cases := []struct {
		name               string
		index, keepEntries uint64
		keepBytes          int64
		want               uint64
	}{
		{"the count binds", 100, 10, 1 << 30, 90},
		{"the bytes bind", 100, 50, 5 * size, 95},
		{"not even one entry fits the bytes: cut at the snapshot", 100, 50, size - 1, 100},
		{"everything fits, and the index is below the count: nothing to cut", 30, 50, 1 << 30, 0},
		{"everything in memory fits: the count decides", 60, 50, 1 << 30, 10},
	}
	for _, c := range cases {
		if got := m.compactionIndex(c.index, c.keepEntries, c.keepBytes); got != c.want {
			t.Errorf("%s: got = %d, expected: %d", c.name, got, c.want)
		}
	}
}

// TestMaxLogMemoryBytesBelowAnAppendMessageIsRefused: a bound raft's own
// message size makes meaningless is refused before anything is written.
func TestMaxLogMemoryBytesBelowAnAppendMessageIsRefused(t *testing.T) {
	t.Parallel()
	for _, bound := range []int64{-1, 1000, maxSizePerMsg - 1} {
		dir := t.TempDir()
		cfg := testConfig(dir, "wal")
		cfg.MaxLogMemoryBytes = bound
		n, err := open(cfg, newFake(nil))
		if err == nil {
			n.Close()
			t.Fatalf("MaxLogMemoryBytes %d: got = a node, expected: an error", bound)
		}
		if !strings.Contains(err.Error(), "MaxLogMemoryBytes") {
			t.Errorf("MaxLogMemoryBytes %d: got = %q, expected: an error naming MaxLogMemoryBytes", bound, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "raft")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("MaxLogMemoryBytes %d: the data dir has a raft directory (%v), expected: nothing written", bound, err)
		}
	}
}

// mebibyteValue is a value of 1 MiB, its letter telling one write from
// another.
func mebibyteValue(i int) string { return strings.Repeat(string(rune('a'+i%26)), 1<<20) }

// largestEntry is the size of the largest entry n holds in memory.
func largestEntry(t testing.TB, n *Node) int64 {
	t.Helper()
	first, _ := n.engine.ms.FirstIndex()
	last, _ := n.engine.ms.LastIndex()
	ents, err := n.engine.ms.Entries(first, last+1, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	var most int64
	for _, e := range ents {
		most = max(most, int64(e.Size()))
	}
	return most
}

// watchLogBytes samples n's LogMemoryBytes until the returned stop is
// called, which returns the most it saw.
func watchLogBytes(n *Node) (stop func() int64) {
	var most atomic.Int64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			if b := n.LogMemoryBytes(); b > most.Load() {
				most.Store(b)
			}
			select {
			case <-tick.C:
			case <-done:
				return
			}
		}
	}()
	return func() int64 {
		close(done)
		<-finished
		return most.Load()
	}
}

// TestTheLogInMemoryIsBoundedInBytes: with entries of 1 MiB and a bound
// of 4 MiB, far below the counts (8192 entries between snapshots, 10240
// kept), the log raft holds in memory never passes the bound plus one
// entry, and every acknowledged write is there after a restart.
func TestTheLogInMemoryIsBoundedInBytes(t *testing.T) {
	t.Parallel()
	const bound = 4 << 20
	cfg := testConfig(t.TempDir(), "wal")
	cfg.WALSegmentSize = 8 << 20
	cfg.MaxLogMemoryBytes = bound
	n := openFake(t, cfg, nil)
	waitLeader(t, n)

	stop := watchLogBytes(n)
	want := map[string]string{}
	var rev, entry int64
	for i := range 24 {
		key := fmt.Sprintf("k%d", i%4)
		r := put(t, n, key, mebibyteValue(i))
		want[key], rev = mebibyteValue(i), r.Revision
		entry = max(entry, largestEntry(t, n))
		if got := n.LogMemoryBytes(); got > bound+entry {
			t.Fatalf("after write %d the log in memory holds %d bytes, expected: at most %d, the bound plus one entry of %d", i, got, bound+entry, entry)
		}
	}
	if most := stop(); most > bound+entry {
		t.Errorf("the log in memory held up to %d bytes during the writes, expected: at most %d, the bound plus one entry", most, bound+entry)
	}
	if first, _ := n.engine.ms.FirstIndex(); first < 10 {
		t.Errorf("the log in memory starts at index %d after 24 entries of 1 MiB, expected: compacted", first)
	}
	waitFor(t, "LogMemoryBytes to be the size of the entries held", func() bool {
		return n.LogMemoryBytes() == heldBytes(t, n.engine.ms)
	})
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = openFake(t, cfg, nil)
	waitLeader(t, n)
	got, gotRev := readKV(t, n)
	if gotRev != rev {
		t.Errorf("after a restart the revision is %d, expected: %d", gotRev, rev)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("after a restart %s holds %d bytes of %q, expected: the acknowledged %d bytes of %q", k, len(got[k]), got[k][:min(1, len(got[k]))], len(v), v[:1])
		}
	}
	if got := n.LogMemoryBytes(); got > bound+entry {
		t.Errorf("after a restart the log in memory holds %d bytes, expected: at most %d", got, bound+entry)
	}
}

// TestALaggingFollowerCatchesUpPastALogBoundedInBytes: a follower cut
// off while the leader's bounded log moves past it is sent a snapshot
// once it is back, and ends with every acknowledged write.
func TestALaggingFollowerCatchesUpPastALogBoundedInBytes(t *testing.T) {
	t.Parallel()
	const bound = 4 << 20
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.MaxLogMemoryBytes = bound
		cfg.WALSegmentSize = 8 << 20
		// Entries of 1 MiB under the race detector on a loaded machine
		// can hold a follower's answer past the tests' usual 50ms, and
		// check-quorum would depose the leader mid-write.
		cfg.ElectionTimeout = time.Second
	})
	leader := c.leader()
	lagging := c.others(leader)[0]
	put(t, leader, "before", "the cut")
	waitFor(t, "every node to apply the first write", func() bool {
		return lagging.AppliedIndex() >= leader.AppliedIndex()
	})
	c.isolate(lagging)
	stopped := lagging.AppliedIndex()

	want := map[string]string{"before": "the cut"}
	var entry int64
	for i := range 16 {
		key := fmt.Sprintf("k%d", i%4)
		put(t, leader, key, mebibyteValue(i))
		want[key] = mebibyteValue(i)
		entry = max(entry, largestEntry(t, leader))
		if got := leader.LogMemoryBytes(); got > bound+entry {
			t.Fatalf("after write %d the leader's log in memory holds %d bytes, expected: at most %d", i, got, bound+entry)
		}
	}
	if first, _ := leader.engine.ms.FirstIndex(); first <= stopped+1 {
		t.Fatalf("the leader's log in memory starts at %d, expected: compacted past %d, where the follower stopped", first, stopped+1)
	}

	c.heal()
	waitFor(t, "the lagging follower to catch up", func() bool {
		return lagging.AppliedIndex() >= leader.AppliedIndex()
	})
	got, _ := localKV(t, lagging)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("the caught-up follower's %s holds %d bytes, expected: the acknowledged %d", k, len(got[k]), len(v))
		}
	}
	if got := lagging.LogMemoryBytes(); got > bound+entry {
		t.Errorf("the caught-up follower's log in memory holds %d bytes, expected: at most %d", got, bound+entry)
	}
}
