package raftnode

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
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

// splitFake is fakeState with a snapshot in two steps, as the state
// machine's (statemachine.Machine.SnapshotSplit): the state is taken at
// the split, and rest, which writes it, waits for gate.
type splitFake struct {
	*fakeState
	gate   chan struct{}
	splits *atomic.Int32
}

func (s *splitFake) SnapshotSplit(w io.Writer) (func() error, error) {
	s.splits.Add(1)
	data, err := json.Marshal(s.fakeState)
	if err != nil {
		return nil, err
	}
	return func() error {
		<-s.gate
		_, err := w.Write(append(data, '\n'))
		return err
	}, nil
}

// TestApplyGoesOnWhileASnapshotIsEncoded: the part of a snapshot a state
// leaves for after the lock (its keys and their history) is encoded
// beside apply, not on its goroutine: with that part held up, a hundred
// writes more are applied and answered, and the snapshot is written once
// it is let go. Encoding it between batches stopped every write for as
// long as the encoding took, which grew with the state.
func TestApplyGoesOnWhileASnapshotIsEncoded(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	cfg.SnapshotThreshold, cfg.CatchUpEntries = 8, 2
	gate := make(chan struct{})
	var splits atomic.Int32
	n, err := open(cfg, func() state {
		return &splitFake{fakeState: newFake(nil)().(*fakeState), gate: gate, splits: &splits}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before Close, which waits for the write
	waitLeader(t, n)
	for i := 0; splits.Load() == 0; i++ {
		if i == 100 {
			t.Fatal("got = no snapshot after 100 writes, expected: one after 8")
		}
		put(t, n, fmt.Sprintf("before%d", i), "v")
	}
	taken := n.engine.snapshots.index.Load()
	for i := range 100 {
		put(t, n, fmt.Sprintf("during%d", i), "v")
	}
	if !n.engine.snapshots.inFlight.Load() {
		t.Fatal("got = no snapshot being written, expected: the first, held up")
	}
	release()
	waitFor(t, "the held-up snapshot to be written", func() bool { return !n.engine.snapshots.inFlight.Load() })
	snap, err := n.engine.ms.Snapshot()
	if err != nil || snap.Metadata.Index < taken {
		t.Fatalf("got = snapshot at %d (%v), expected: one at %d or later", snap.Metadata.Index, err, taken)
	}
}
