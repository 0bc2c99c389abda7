package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
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
	if cfg.Transport != nil || cfg.Stores.given() > 0 {
		return 0, errors.New("raftnode: Seed opens the stores under DataDir itself: leave Transport and Stores unset")
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
	if cfg.Engine == EngineEtcd {
		if converting, err := claimDir(filepath.Join(cfg.DataDir, "raft")); err != nil {
			return 0, err
		} else if converting {
			return 0, fmt.Errorf("raftnode: seed %s: %w", cfg.DataDir, ErrHasState)
		}
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
	exists, err := raft.HasExistingState(st.logs, st.stable, st.snaps)
	if err != nil {
		return 0, fmt.Errorf("raftnode: inspect state: %w", err)
	}
	if exists {
		return 0, fmt.Errorf("raftnode: seed %s: %w", cfg.DataDir, ErrHasState)
	}
	addr := cfg.Advertise
	if addr == "" {
		addr = cfg.PeerAddr
	}
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: raft.ServerAddress(addr)}}}
	// The file store encodes peers through a transport for old snapshot
	// versions only; an in-memory one stands in, since nothing is dialled.
	_, trans := raft.NewInmemTransport(raft.ServerAddress(addr))
	defer trans.Close()
	sink, err := st.snaps.Create(raft.SnapshotVersionMax, seedIndex, seedTerm, conf, seedIndex, trans)
	if err != nil {
		return 0, fmt.Errorf("raftnode: seed: create snapshot: %w", err)
	}
	if _, err := sink.Write(body.Bytes()); err != nil {
		sink.Cancel()
		return 0, fmt.Errorf("raftnode: seed: write snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return 0, fmt.Errorf("raftnode: seed: write snapshot: %w", err)
	}
	// Raft must not start a term below the snapshot's.
	if cfg.Engine == EngineEtcd {
		hs, _ := (&raftpb.HardState{Term: seedTerm, Commit: seedIndex}).Marshal()
		if err := st.stable.Set(hardStateKey, hs); err != nil {
			return 0, fmt.Errorf("raftnode: seed: %w", err)
		}
	} else if err := st.stable.SetUint64([]byte("CurrentTerm"), seedTerm); err != nil {
		return 0, fmt.Errorf("raftnode: seed: %w", err)
	}
	return m.Revision(), nil
}
