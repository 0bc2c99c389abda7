package raftnode

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A repair that cuts the newest segment's later entries off leaves their
// bytes in place, damage and all, and raft-wal seals the segment with
// its index after them. raft-wal reads nothing of those bytes again but
// the index; the verifying reader stopped at the damage in them, took
// the segment as sound, and never checked the index. A bit flip there
// later pointed raft-wal at no entry, and the member refused to start
// with "log entry 3: EOF" (internal/sim seed 100254: two bit flips in
// one segment, a repair between them). A damaged index behind dead
// damage is damage to every entry the segment still holds, as anywhere
// else: a member cuts it off and owes it.
func TestASecondDamageBehindAnEarlierCutIsFound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const n = 25
	tail, data, vals, _ := tailWithValues(t, dir, n)
	if segs := segments(t, dir); len(segs) < 2 {
		t.Fatalf("got = %d segments, expected: at least 2 (a lone node keeps its configuration in the first)", len(segs))
	}

	// First damage: a bit in the reserved bytes of a later batch's first
	// frame header, which raft-wal reads past and the repair cuts.
	s, _ := batchSpan(t, data, vals[3])
	overwrite(t, tail, s+3, []byte{data[s+3] ^ 0x40})
	node, _ := openRepairing(t, dir)
	waitLeader(t, node)
	last := node.AppliedIndex()
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ = valuesIn(t, tail, n)
	index := int64(-1)
	for _, f := range frames(data) {
		if f.typ == walFrameIndex {
			index = f.offset
		}
	}
	if index < 0 || index < s {
		t.Fatalf("got = an index frame at %d in %s, expected: the cut segment sealed with its index after the damage at %d", index, tail, s)
	}

	// Second damage: the index's offset of the segment's second entry,
	// which the log still holds, flipped far past the file's end.
	at := index + walFrameHeaderLen + 4 + 3
	overwrite(t, tail, at, []byte{data[at] ^ 0x10})

	// Alone, the node refuses, naming the segment and its index.
	_, err := open(walTestConfig(t, dir), newFake(nil))
	var ce *CorruptLogError
	if !errors.As(err, &ce) || ce.File != tail || !strings.Contains(err.Error(), "index") {
		t.Fatalf("got = %v, expected: a *CorruptLogError naming %s and its index", err, tail)
	}

	// With the damage cut off, the node starts, owes every entry it had,
	// keeps what lies in the segment before, and serves nothing from
	// the damaged index.
	node, logs := openRepairing(t, dir)
	requireOwes(t, logs, last)
	waitLeader(t, node)
	got, _ := readKV(t, node)
	if first := vals[0] - 1; got[fmt.Sprintf("k%03d", first)] != bigValue(first) {
		t.Fatalf("after the repair got = k%03d missing, expected: kept (in a segment before the damage)", first)
	}
	requireOwnValues(t, got)
	requireRepairedLogVerifies(t, node, dir)
}

// requireRepairedLogVerifies writes through node, repaired, closes it,
// and opens dir again without RepairLog: what the repair left verifies,
// and holds the write.
func requireRepairedLogVerifies(t *testing.T, node *Node, dir string) {
	t.Helper()
	put(t, node, "after", "repair")
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
	node = openFake(t, walTestConfig(t, dir), nil)
	waitLeader(t, node)
	if got, _ := readKV(t, node); got["after"] != "repair" {
		t.Fatalf("got = after=%q after a reopen, expected: repair", got["after"])
	}
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
}
