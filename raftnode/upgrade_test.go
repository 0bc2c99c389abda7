package raftnode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenurehq/tenure/statemachine"
)

// hashicorpFSM lets hashicorp/raft, the engine before issue 24, drive
// the test's state, so that the upgrade tests start from a data dir that
// engine really wrote.
type hashicorpFSM struct{ f *applier }

func (h hashicorpFSM) Apply(l *raft.Log) any {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	res := h.f.applyData(l.Index, l.Term, l.Data)
	h.f.advance(l.Index)
	return res
}

func (h hashicorpFSM) Snapshot() (raft.FSMSnapshot, error) {
	b, err := h.f.snapshotBytes()
	return hashicorpSnapshot(b), err
}

func (h hashicorpFSM) Restore(rc io.ReadCloser) error { return h.f.Restore(rc) }

type hashicorpSnapshot []byte

func (s hashicorpSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (hashicorpSnapshot) Release() {}

// writeHashicorpDataDir runs hashicorp/raft on cfg's data dir, in the
// stores the old engine opened (raft-wal or boltdb, and the file snapshot
// store), bootstrapped with voters (this node alone when empty), and
// proposes puts: those before snapshotAt go into a snapshot, the rest
// stay in the log after it. With more than one voter nothing commits, so
// it proposes nothing.
func writeHashicorpDataDir(t *testing.T, cfg Config, voters []raft.Server, puts []statemachine.Put, snapshotAt int) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStores(cfg, m, cfg.Logger)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	addr, trans := raft.NewInmemTransport(raft.ServerAddress(cfg.NodeID))
	defer trans.Close()
	if len(voters) == 0 {
		voters = []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: addr}}
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = newHCLogger(cfg.Logger, "raft")
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	if err := raft.BootstrapCluster(rc, st.wal, st.meta, st.snapshots, trans, raft.Configuration{Servers: voters}); err != nil {
		t.Fatal(err)
	}
	fake := newFake(nil)
	f := &applier{st: fake(), newState: fake, log: cfg.Logger, metrics: m}
	r, err := raft.NewRaft(rc, hashicorpFSM{f}, st.wal, st.meta, st.snapshots, trans)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Shutdown().Error(); err != nil {
			t.Error(err)
		}
	}()
	if len(voters) > 1 {
		return
	}
	waitFor(t, "hashicorp/raft to lead", func() bool { return r.State() == raft.Leader })
	for i, p := range puts {
		if i == snapshotAt {
			if err := r.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
		// The engine before wrote the JSON form.
		data, err := statemachine.EncodeJSON(time.Now().UnixNano(), p)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Apply(data, 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestASingleNodesHashicorpDataDirConvertsItselfOnce is issue 24's
// upgrade path: a data dir hashicorp/raft wrote, with a snapshot and a
// log tail after it, opens with every write in it, says so once in the
// log, and is the raft engine's from then on.
func TestASingleNodesHashicorpDataDirConvertsItselfOnce(t *testing.T) {
	t.Parallel()
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			cfg := testConfig(t.TempDir(), store)
			var puts []statemachine.Put
			for i := range 5 {
				puts = append(puts, statemachine.Put{Key: fmt.Sprintf("k%d", i), Value: "snapshotted"})
			}
			puts = append(puts, statemachine.Put{Key: "k0", Value: "tail"}, statemachine.Put{Key: "k9", Value: "tail"})
			writeHashicorpDataDir(t, cfg, nil, puts, 5)
			want := map[string]string{"k0": "tail", "k1": "snapshotted", "k2": "snapshotted", "k3": "snapshotted", "k4": "snapshotted", "k9": "tail"}
			const wantRev = 7

			logs := &recordHandler{}
			cfg.Logger = slog.New(logs)
			n := openFake(t, cfg, nil)
			waitLeader(t, n)
			got, rev := readKV(t, n)
			if rev != wantRev || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after the conversion: kv = %v at revision %d, expected: %v at %d", got, rev, want, wantRev)
			}
			if r := put(t, n, "after", "v"); r.Revision != wantRev+1 {
				t.Errorf("first write after the conversion: revision %d, expected: %d", r.Revision, wantRev+1)
			}
			if c := logs.count("converted the data dir"); c != 1 {
				t.Errorf("conversion log lines = %d, expected: 1", c)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}

			// Once only: the next start finds the raft engine's dir.
			logs = &recordHandler{}
			cfg.Logger = slog.New(logs)
			n = openFake(t, cfg, nil)
			waitLeader(t, n)
			if got, rev := readKV(t, n); rev != wantRev+1 || got["after"] != "v" || got["k0"] != "tail" {
				t.Errorf("reopened: kv = %v at revision %d, expected the converted state and the later write at %d", got, rev, wantRev+1)
			}
			if c := logs.count("converted the data dir"); c != 0 {
				t.Errorf("conversion log lines on the second start = %d, expected: 0", c)
			}
		})
	}
}

// TestAClusterMembersHashicorpDataDirIsNotConverted: a member of a
// larger cluster cannot change engines alone; Open refuses, naming the
// way across, and leaves the data dir as it was.
func TestAClusterMembersHashicorpDataDirIsNotConverted(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	cfg.NodeID = "n1"
	voters := []raft.Server{
		{Suffrage: raft.Voter, ID: "n1", Address: "n1"},
		{Suffrage: raft.Voter, ID: "n2", Address: "n2"},
		{Suffrage: raft.Voter, ID: "n3", Address: "n3"},
	}
	writeHashicorpDataDir(t, cfg, voters, nil, 0)
	for range 2 {
		_, err := open(cfg, newFake(nil))
		if !errors.Is(err, ErrOtherEngine) || !strings.Contains(err.Error(), "tenure snapshot save") || !strings.Contains(err.Error(), "tenure snapshot restore") {
			t.Fatalf("got = %v, expected: ErrOtherEngine naming snapshot save and restore, on every try", err)
		}
	}
	if engine, err := readEngine(filepath.Join(cfg.DataDir, "raft")); err != nil || engine != engineHashicorpRaft {
		t.Errorf("the data dir after the refusal: engine %q (%v), expected: still the hashicorp engine's", engine, err)
	}
}

func (h *recordHandler) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := 0
	for _, r := range h.records {
		if strings.Contains(r.Message, substr) {
			c++
		}
	}
	return c
}

// TestANodeJoiningACompactedLeaderCatchesUp: the leader has snapshotted
// and dropped the log a newcomer would need, and its newest snapshot
// predates the newcomer; the newcomer still catches up, from a snapshot
// that names it (etcd raft refuses one that does not). A converted
// node's first peer is in the same place: its one snapshot names it alone.
func TestANodeJoiningACompactedLeaderCatchesUp(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	cfg.NodeID = "n1"
	cfg.SnapshotThreshold, cfg.CatchUpEntries = 8, 2
	leader := openFake(t, cfg, nil)
	waitLeader(t, leader)
	for i := range 40 {
		put(t, leader, fmt.Sprintf("k%02d", i), "v")
	}
	snapshotNow(t, leader)

	cfg = testConfig(t.TempDir(), "wal")
	cfg.NodeID, cfg.Bootstrap = "n2", false
	joiner := openFake(t, cfg, nil)
	if err := leader.AddNonvoter(ctxT(t), joiner.ID(), joiner.Addr()); err != nil {
		t.Fatalf("add non-voter: %v", err)
	}
	want := put(t, leader, "last", "v").Revision
	waitFor(t, "the newcomer to catch up", func() bool {
		_, rev := localKV(t, joiner)
		return rev == want
	})
	if got, _ := localKV(t, joiner); got["k00"] != "v" || got["last"] != "v" {
		t.Errorf("newcomer's keys: got = %v, expected k00..k39 and last", got)
	}
}

// flipNewestSnapshot damages one byte of the newest snapshot in dir.
func flipNewestSnapshot(t *testing.T, dir string) {
	t.Helper()
	snaps, err := filepath.Glob(filepath.Join(dir, "raft", "snapshots", "*", "state.bin"))
	if err != nil || len(snaps) == 0 {
		t.Fatalf("snapshots in %s: %v (%v)", dir, snaps, err)
	}
	slices.Sort(snaps) // term-index-time: the last is the newest here
	path := snaps[len(snaps)-1]
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestADamagedSnapshotIsPassedOverForTheOneBefore: the newest snapshot
// fails its CRC; the node starts from the one before and replays the log
// after it, losing nothing, and says which snapshot it passed over.
func TestADamagedSnapshotIsPassedOverForTheOneBefore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	put(t, n, "a", "1")
	snapshotNow(t, n)
	put(t, n, "b", "2")
	snapshotNow(t, n)
	put(t, n, "c", "3")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	flipNewestSnapshot(t, dir)

	logs := &recordHandler{}
	cfg.Logger = slog.New(logs)
	n = openFake(t, cfg, nil)
	waitLeader(t, n)
	if got, rev := readKV(t, n); rev != 3 || got["a"] != "1" || got["b"] != "2" || got["c"] != "3" {
		t.Errorf("after passing over the damaged snapshot: kv = %v at revision %d, expected a, b and c at 3", got, rev)
	}
	if c := logs.count("a snapshot is damaged"); c != 1 {
		t.Errorf("warnings about the damaged snapshot: %d, expected: 1", c)
	}
}

// TestADamagedOnlySnapshotIsRefusedNamingIt: with no snapshot before it
// to fall back on, Open refuses, naming the snapshot and the damage.
func TestADamagedOnlySnapshotIsRefusedNamingIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	put(t, n, "a", "1")
	snapshotNow(t, n)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	flipNewestSnapshot(t, dir)
	_, err := open(cfg, newFake(nil))
	if err == nil || !strings.Contains(err.Error(), "snapshot") || !strings.Contains(err.Error(), "CRC") {
		t.Fatalf("got = %v, expected: an error naming the snapshot and its CRC", err)
	}
}
