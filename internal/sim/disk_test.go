package sim

import (
	"errors"
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/raftnode"
)

// openDisk opens raftnode's disk storage over d, as a node's boot does.
func openDisk(t *testing.T, d *disk) (*raftnode.Disk, raftnode.DiskBoot, error) {
	t.Helper()
	return raftnode.OpenDisk(d.files(), segmentSize, discard)
}

// appendSynced writes entries from..to, one batch each, each synced at
// once.
func appendSynced(t *testing.T, k *raftnode.Disk, from, to uint64) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := k.Append([]raftpb.Entry{{Index: i, Term: 1, Data: []byte{byte(i), 1, 2, 3}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// A misdirected write is damage wherever it lands, as raftnode's reader
// now sees (raftnode/walmisplaced_test.go): a member cuts the log at the
// first of the two places and owes entries from there, in the newest
// segment up to the last synced entry after the damage, past where
// raft-wal's own scan stopped (docs/testing.md, findings).
func TestMisdirectedWriteIsDamage(t *testing.T) {
	for _, tc := range []struct{ from, to int }{{3, 1}, {1, 3}, {2, 3}} {
		d := newDisk()
		k, _, err := openDisk(t, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.SetMembers(3); err != nil {
			t.Fatal(err)
		}
		appendSynced(t, k, 1, 4)
		var w []written
		for _, s := range d.synced() {
			if _, e := d.extent(s); e.hi-e.lo > 0 {
				w = append(w, s)
			}
		}
		d.misdirect(w[tc.from], w[tc.to])
		d.crash(rand.New(rand.NewPCG(1, 2)), false)
		k.Close()
		k, b, err := openDisk(t, d)
		if err != nil {
			t.Fatalf("write %d over %d: %v; want the damage cut", tc.from, tc.to, err)
		}
		p, err := k.CatchUp()
		if err != nil {
			t.Fatal(err)
		}
		if kept := uint64(len(b.Entries)); kept >= 4 || p.Index <= kept {
			t.Errorf("write %d over %d: %d entries kept, catch-up index %d; want the damage cut and the entries after it owed", tc.from, tc.to, kept, p.Index)
		}
		k.Close()
	}
}

// A node alone refuses to start on damage to synced data, but drops a
// torn write in flight when it crashed: nothing in it was acknowledged.
func TestCrashTearsOnlyWhatWasInFlight(t *testing.T) {
	for seed := range uint64(20) {
		d := newDisk()
		k, _, err := openDisk(t, d)
		if err != nil {
			t.Fatal(err)
		}
		appendSynced(t, k, 1, 3)
		d.inReady = true
		appendSynced(t, k, 4, 6)
		d.inReady = false
		d.crash(rand.New(rand.NewPCG(seed, 7)), true)
		k.Close()
		k, b, err := openDisk(t, d)
		if err != nil {
			t.Fatalf("seed %d: %v; want a torn write dropped", seed, err)
		}
		if n := len(b.Entries); n < 3 || n > 6 {
			t.Fatalf("seed %d: %d entries; want the 3 synced and a prefix of the rest", seed, n)
		}
		k.Close()

		all := d.synced()
		d.lose(all[1])
		if _, _, err := openDisk(t, d); !errors.Is(err, raftnode.ErrCorruptLog) {
			t.Fatalf("seed %d: a lost synced write: got %v, want ErrCorruptLog", seed, err)
		}
	}
}

// A failed fsync drops what it was to write, and raft-wal rolls back:
// the write made again lands whole.
func TestFailedFsyncIsWrittenAgain(t *testing.T) {
	d := newDisk()
	k, _, err := openDisk(t, d)
	if err != nil {
		t.Fatal(err)
	}
	appendSynced(t, k, 1, 2)
	d.inReady, d.failSync = true, true
	if err := k.Append([]raftpb.Entry{{Index: 3, Term: 1, Data: []byte("x")}}); !errors.Is(err, errSyncFailed) {
		t.Fatalf("got %v, want the fsync's error", err)
	}
	appendSynced(t, k, 3, 3)
	d.inReady = false
	d.sync()
	k.Close()
	d.crash(rand.New(rand.NewPCG(1, 2)), true)
	k, b, err := openDisk(t, d)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if len(b.Entries) != 3 || string(b.Entries[2].Data) != string([]byte{3, 1, 2, 3}) {
		t.Fatalf("got %d entries; want 3, the last as written again", len(b.Entries))
	}
}
