package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// ErrHasState is returned by Seed when the data dir already holds raft
// state: seeding would replace a cluster's history.
var ErrHasState = errors.New("data dir already holds raft state")

// seedIndex and seedTerm place a seeded snapshot at the start of a new
// log. Tokens and revisions live in the state, not in raft indexes, so
// the new log starting over does not make them go back.
const seedIndex, seedTerm = 1, 1

// Seed writes a state snapshot (what statemachine.Machine.Snapshot
// writes, e.g. a file from `tenure snapshot save`) into cfg.DataDir,
// which must hold no raft state, as the start of a new cluster whose
// only voter is cfg.NodeID at its peer address. Open on the same Config
// then starts from that state: every lease, holder, waiter and key in it,
// with revisions, and so fencing tokens, carrying on from where the
// snapshot stopped. Grow the cluster from there with joins. It returns
// the snapshot's revision.
func Seed(cfg Config, state io.Reader) (revision int64, err error) {
	if cfg.Network != nil || cfg.Stores.given() > 0 {
		return 0, errors.New("raftnode: Seed opens the stores under DataDir itself: leave Network and Stores unset")
	}
	if cfg, err = cfg.withDefaults(); err != nil {
		return 0, err
	}
	// Check the snapshot in full before touching the data dir, and write
	// what a machine writes back, so that the seed is canonical.
	m := statemachine.New()
	if err := m.Restore(state); err != nil {
		return 0, fmt.Errorf("raftnode: seed: %w", err)
	}
	var body bytes.Buffer
	var hdr [snapshotHeaderLen]byte
	hdr[0] = snapshotVersion
	binary.BigEndian.PutUint64(hdr[1:], seedIndex)
	body.Write(hdr[:])
	if err := m.Snapshot(&body); err != nil {
		return 0, err
	}

	// A running node's stores would block the open forever.
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return 0, fmt.Errorf("raftnode: seed: %w", err)
	}
	lock, err := LockDataDir(cfg.DataDir)
	if err != nil {
		return 0, err
	}
	defer lock.Unlock()
	if converting, err := claimDir(filepath.Join(cfg.DataDir, "raft")); err != nil {
		return 0, err
	} else if converting {
		return 0, fmt.Errorf("raftnode: seed %s: %w", cfg.DataDir, ErrHasState)
	}
	met, err := newMetrics(nil)
	if err != nil {
		return 0, err
	}
	st, err := openStores(cfg, met, cfg.Logger)
	if err != nil {
		return 0, err
	}
	defer st.close()
	d := &diskStorage{wal: st.wal, meta: st.meta, snapshots: st.snapshots}
	boot, err := d.load()
	if err != nil {
		return 0, err
	}
	if !etcdraft.IsEmptySnap(boot.snap) || len(boot.ents) > 0 || !etcdraft.IsEmptyHardState(boot.hs) {
		return 0, fmt.Errorf("raftnode: seed %s: %w", cfg.DataDir, ErrHasState)
	}
	addr := cfg.Advertise
	if addr == "" {
		addr = cfg.PeerAddr
	}
	self := memberInfo{ID: cfg.NodeID, Addr: addr}
	meta := raftpb.SnapshotMetadata{Index: seedIndex, Term: seedTerm, ConfState: raftpb.ConfState{Voters: []uint64{raftID(cfg.NodeID)}}}
	if err := d.writeSnapshot(meta, map[uint64]memberInfo{raftID(cfg.NodeID): self}, body.Bytes()); err != nil {
		return 0, fmt.Errorf("raftnode: seed: %w", err)
	}
	// Raft must not start a term below the snapshot's, nor apply again
	// what the snapshot holds.
	hs, err := (&raftpb.HardState{Term: seedTerm, Commit: seedIndex}).Marshal()
	if err == nil {
		err = st.meta.Set(hardStateKey, hs)
	}
	if err != nil {
		return 0, fmt.Errorf("raftnode: seed: %w", err)
	}
	return m.Revision(), nil
}
