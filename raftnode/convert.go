package raftnode

// The old engine: a data dir that hashicorp/raft wrote, and its one-time
// conversion to the raft engine's format. This is the only file that
// reads hashicorp/raft's log and configuration as such (LogStore,
// configuration entries, CurrentTerm in the StableStore); the ENGINE file
// that tells the two formats apart is kept here too, so that everything
// the conversion depends on can be deleted together once no hashicorp
// data dir is left to convert.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"
)

// convertFromHashicorp turns a single node's data dir of the hashicorp
// engine into the raft engine's, once: the state after every entry of
// its log becomes one snapshot, with nothing lost, since a lone voter's
// log holds only entries it committed or would commit on its next
// election. A member of a larger cluster cannot convert alone, since the
// others would still speak the old engine's protocol.
func convertFromHashicorp(cfg Config, st stores, self memberInfo, newState func() state, m *metrics, log *slog.Logger) error {
	conf, err := storedConfiguration(st.wal, st.snapshots)
	if err != nil {
		return err
	}
	if len(conf.Servers) > 1 {
		return fmt.Errorf("%w: data dir %s belongs to a cluster of %d nodes %s on the hashicorp engine, and only a single node converts itself; "+
			"to move the cluster to this build: tenure snapshot save from the old cluster, then tenure snapshot restore into a new one (docs/operations.md, \"Moving to another consensus engine\")",
			ErrOtherEngine, cfg.DataDir, len(conf.Servers), formatServers(members(conf)))
	}
	if len(conf.Servers) == 1 && string(conf.Servers[0].ID) != self.ID {
		return &MembershipError{DataDir: cfg.DataDir, NodeID: self.ID, Addr: self.Addr, Servers: members(conf)}
	}
	scratch := &applier{st: newState(), newState: newState, log: log, metrics: m}
	var last logPosition
	metas, err := st.snapshots.List()
	if err != nil {
		return fmt.Errorf("raftnode: list snapshots: %w", err)
	}
	if len(metas) > 0 {
		meta, rc, err := st.snapshots.Open(metas[0].ID)
		if err != nil {
			return fmt.Errorf("raftnode: open snapshot %s: %w", metas[0].ID, err)
		}
		if err := scratch.Restore(rc); err != nil {
			return err
		}
		last = logPosition{index: meta.Index, term: meta.Term}
	}
	first, err := st.wal.FirstIndex()
	if err != nil {
		return err
	}
	lastIdx, err := st.wal.LastIndex()
	if err != nil {
		return err
	}
	applied := 0
	for i := max(first, last.index+1); first > 0 && i <= lastIdx; i++ {
		var l raft.Log
		if err := st.wal.GetLog(i, &l); err != nil {
			return fmt.Errorf("raftnode: convert: log entry %d: %w", i, err)
		}
		if l.Type == raft.LogCommand {
			scratch.applyData(l.Index, l.Term, l.Data)
			applied++
		}
		last = logPosition{index: l.Index, term: l.Term}
	}
	term := last.term
	if v, err := st.meta.GetUint64([]byte("CurrentTerm")); err == nil {
		term = max(term, v)
	}
	d := &diskStorage{wal: st.wal, meta: st.meta, snapshots: st.snapshots, log: log}
	if last.index > 0 {
		if err := fold(d, scratch, last, term, self); err != nil {
			return fmt.Errorf("raftnode: convert: %w", err)
		}
	}
	if st.dir != "" {
		if err := writeEngine(st.dir, engineEtcdRaft); err != nil {
			return err
		}
	}
	log.Warn("converted the data dir from the hashicorp/raft engine to the etcd raft engine: its log is now one snapshot, with nothing lost; this happens once",
		"dir", cfg.DataDir, "index", last.index, "term", term, "entries_replayed", applied, "revision", scratch.st.Revision())
	return nil
}

// ErrOtherEngine is returned when a data dir or a cluster runs the other
// consensus engine and cannot be taken over in place.
var ErrOtherEngine = errors.New("raftnode: another consensus engine")

// storedConfiguration returns the latest configuration in a hashicorp
// engine's stores, as hashicorp/raft found it: the last configuration
// entry in the log after the newest snapshot, else that snapshot's.
func storedConfiguration(logs raft.LogStore, snaps raft.SnapshotStore) (raft.Configuration, error) {
	var conf raft.Configuration
	var after uint64
	metas, err := snaps.List()
	if err != nil {
		return conf, fmt.Errorf("raftnode: list snapshots: %w", err)
	}
	if len(metas) > 0 { // newest first
		conf, after = metas[0].Configuration, metas[0].Index
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return conf, fmt.Errorf("raftnode: first log index: %w", err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return conf, fmt.Errorf("raftnode: last log index: %w", err)
	}
	if last == 0 {
		return conf, nil
	}
	for idx := last; idx >= max(first, after+1) && idx > 0; idx-- {
		var l raft.Log
		if err := logs.GetLog(idx, &l); err != nil {
			return conf, fmt.Errorf("raftnode: read log entry %d: %w", idx, err)
		}
		if l.Type == raft.LogConfiguration {
			return raft.DecodeConfiguration(l.Data), nil
		}
	}
	return conf, nil
}

func members(c raft.Configuration) []Member {
	out := make([]Member, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = Member{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter}
	}
	return out
}

// engineFile names the engine that wrote DataDir/raft. A directory
// without it was written by the hashicorp engine.
const engineFile = "ENGINE"

const (
	engineHashicorpRaft = "hashicorp-raft"
	engineEtcdRaft      = "etcd-raft"
)

// readEngine reports which engine wrote dir (DataDir/raft); "" when dir
// holds no raft state at all.
func readEngine(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, engineFile))
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("raftnode: %w", err)
	}
	for _, old := range []string{"wal", "raft.db", "snapshots"} {
		if _, err := os.Stat(filepath.Join(dir, old)); err == nil {
			return engineHashicorpRaft, nil
		}
	}
	return "", nil
}

// writeEngine records the engine durably: the file is synced and so is
// the directory that names it.
func writeEngine(dir, engine string) error {
	path := filepath.Join(dir, engineFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("raftnode: %w", err)
	}
	_, err = f.WriteString(engine + "\n")
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("raftnode: record engine: %w", err)
	}
	return nil
}

// claimDir makes sure dir holds the raft engine's state, none, or the
// hashicorp engine's (converting: Open converts it), and marks a new one
// as the raft engine's before anything is written in it.
func claimDir(dir string) (converting bool, err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return false, fmt.Errorf("raftnode: %w", err)
	}
	kind, err := readEngine(dir)
	switch {
	case err != nil:
		return false, err
	case kind == "":
		return false, writeEngine(dir, engineEtcdRaft)
	case kind == engineEtcdRaft:
		return false, nil
	case kind == engineHashicorpRaft:
		return true, nil
	default:
		return false, fmt.Errorf("raftnode: %s holds state of an engine this build does not know, %q", dir, kind)
	}
}
