package raftnode

import (
	"fmt"
	"testing"
)

// The bytes in use are what the log holds, not the segment raft-wal
// preallocated: a new node's directory has a whole empty segment, and its
// use grows by about what is written, across a restart that recovers the
// tail and across segments.
func TestDiskBytesInUseCountsWhatTheLogHolds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	cfg.WALSegmentSize = 8 << 20
	cfg.MinFreeBytes = -1
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	empty := n.DiskBytesInUse()
	if empty <= 0 || empty >= 1<<20 {
		t.Fatalf("got = %d bytes in use on a new node with an 8 MiB segment, expected: under 1 MiB", empty)
	}
	const values = 40 // 60 KB each: 2.4 MB, in one segment
	for i := range values {
		put(t, n, fmt.Sprintf("k%03d", i), bigValue(i))
	}
	written := int64(values * len(bigValue(0)))
	grown := n.DiskBytesInUse() - empty
	if grown < written || grown > written+written/10 {
		t.Fatalf("got = %d more bytes in use after writing %d, expected: the written bytes and framing", grown, written)
	}
	before := n.DiskBytesInUse()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openFake(t, cfg, nil)
	waitLeader(t, n)
	// The restart appends a few entries of its own (an election's).
	if after := n.DiskBytesInUse(); after < before || after > before+64<<10 {
		t.Fatalf("got = %d bytes in use after a restart, expected: the %d before, give or take an election's entries", after, before)
	}

	// Past the first segment, sealed segments count whole.
	for i := range 3 * values {
		put(t, n, fmt.Sprintf("more%03d", i), bigValue(i))
	}
	if got, want := n.DiskBytesInUse(), before+int64(3*values*len(bigValue(0))); got < want || got > want+8<<20 {
		t.Fatalf("got = %d bytes in use across segments, expected: at least %d and less than a segment more", got, want)
	}
}
