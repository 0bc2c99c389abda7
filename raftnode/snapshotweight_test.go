package raftnode

import (
	"fmt"
	"testing"
)

// A snapshot copies the whole state, so one is taken only once the
// entries since the last weigh a quarter of the state it wrote, however
// many entries the threshold counts: small writes over a large state no
// longer pay a copy of it every threshold entries. Big writes still
// snapshot as the count says.
func TestSnapshotsWaitForWritesWeighingAQuarterOfTheState(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	cfg.SnapshotThreshold, cfg.CatchUpEntries = 8, 2
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	// 40 values of 60 KB: the state grows to 2.4 MB, and each batch of 8
	// weighs more than a quarter of the state before it, at first.
	for i := range 40 {
		put(t, n, fmt.Sprintf("big%d", i), bigValue(i))
	}
	// A snapshot of all of it now, so that what the small writes below
	// weigh is all that counts (the big writes after the last automatic
	// snapshot may weigh a quarter of the state already).
	if err := n.engine.snapshotNow(); err != nil {
		t.Fatal(err)
	}
	taken := n.engine.snapshots.index.Load()
	state := n.engine.snapshots.stateBytes.Load()
	if state < 1<<20 {
		t.Fatalf("got = a %d-byte state, expected: over 1 MiB after 40 values of 60 KB", state)
	}
	// 200 small writes: 25 times the threshold's count, a few KB in all,
	// far below a quarter of the state.
	for i := range 200 {
		put(t, n, fmt.Sprintf("small%d", i), "v")
	}
	if got := n.engine.snapshots.index.Load(); got != taken {
		t.Fatalf("got = a snapshot at %d after 200 small writes over a %d-byte state (the last at %d), expected: none until the writes weigh %d bytes", got, state, taken, state/4)
	}
	// Writes weighing a quarter of the state: a snapshot follows.
	for i := 0; n.engine.snapshots.index.Load() == taken; i++ {
		if uint64(i*len(bigValue(0))) > state {
			t.Fatalf("got = no snapshot after writes weighing the whole %d-byte state, expected: one after a quarter of it", state)
		}
		put(t, n, fmt.Sprintf("again%d", i), bigValue(i))
	}
}
