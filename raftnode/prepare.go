package raftnode

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// prepareStart runs the checks and rewrites on st. converting is true when
// st holds the hashicorp engine's state.
func prepareStart(cfg Config, st stores, self memberInfo, newState func() state, converting bool, m *metrics, log *slog.Logger) error {
	if converting {
		return convertFromHashicorp(cfg, st, self, newState, m, log)
	}
	if !cfg.Bootstrap && !cfg.ForceNewCluster {
		return nil
	}
	// No logger: the engine loads the same state again right after, and
	// says what it finds.
	d := &diskStorage{wal: st.wal, meta: st.meta, snapshots: st.snapshots}
	boot, err := d.load()
	if err != nil {
		return err
	}
	exists := !etcdraft.IsEmptySnap(boot.snap) || len(boot.ents) > 0 || !etcdraft.IsEmptyHardState(boot.hs)
	if !exists {
		if cfg.ForceNewCluster {
			return fmt.Errorf("raftnode: force new cluster: data dir %s holds no raft state, so there is nothing to restore (is it the copied backup?)", cfg.DataDir)
		}
		return nil
	}
	stored := storedMembers(boot)
	selfID := raftID(self.ID)
	if cfg.ForceNewCluster {
		if len(stored) == 1 && stored[0].ID == self.ID && stored[0].Address == self.Addr && stored[0].Voter {
			log.Info("force new cluster: the configuration already is this node alone at this address; nothing to rewrite", "addr", self.Addr)
			return nil
		}
		log.Warn("FORCE NEW CLUSTER: rewriting the stored raft configuration to this node alone; every other member is forgotten. "+
			"This is a restore tool: on a member of a live cluster it makes a second cluster that diverges from the first",
			"dir", cfg.DataDir, "old_configuration", formatServers(stored), "new_configuration", formatServers([]Member{{ID: self.ID, Address: self.Addr, Voter: true}}))
		scratch := &applier{st: newState(), newState: newState, log: log, metrics: m}
		if !etcdraft.IsEmptySnap(boot.snap) {
			if err := scratch.restoreBytes(boot.state); err != nil {
				return err
			}
		}
		last := logPosition{index: boot.snap.Metadata.Index, term: boot.snap.Metadata.Term}
		for _, e := range boot.ents {
			if _, _, cmd, ok := ParseProposal(e.Data); e.Type == raftpb.EntryNormal && ok && len(cmd) > 0 {
				scratch.applyData(e.Index, e.Term, cmd)
			}
			last = logPosition{index: e.Index, term: e.Term}
		}
		if err := fold(d, scratch, last, max(boot.hs.Term, last.term), self); err != nil {
			return fmt.Errorf("raftnode: force new cluster: %w", err)
		}
		log.Warn("force new cluster: configuration rewritten; remove the flag from later starts", "addr", self.Addr)
		return nil
	}
	if len(stored) == 0 {
		return nil
	}
	for _, m := range stored {
		if raftID(m.ID) != selfID {
			continue
		}
		if m.Address != self.Addr {
			log.Warn("the stored configuration records this node at another address; it can still be elected, but members and other nodes see the old one",
				"stored_addr", m.Address, "addr", self.Addr)
		}
		return nil
	}
	return &MembershipError{DataDir: cfg.DataDir, NodeID: self.ID, Addr: self.Addr, Servers: stored}
}

// storedMembers is the configuration a restart finds: the snapshot's,
// changed by the configuration entries in the log after it.
func storedMembers(b bootState) []Member {
	voters := map[uint64]bool{}
	for _, id := range b.snap.Metadata.ConfState.Voters {
		voters[id] = true
	}
	for _, id := range b.snap.Metadata.ConfState.Learners {
		voters[id] = false
	}
	info := map[uint64]memberInfo{}
	for id, m := range b.members {
		info[id] = m
	}
	for _, e := range b.ents {
		var cc raftpb.ConfChangeV2
		switch e.Type {
		case raftpb.EntryConfChange:
			var v1 raftpb.ConfChange
			if v1.Unmarshal(e.Data) != nil {
				continue
			}
			cc = v1.AsV2()
		case raftpb.EntryConfChangeV2:
			if cc.Unmarshal(e.Data) != nil {
				continue
			}
		default:
			continue
		}
		var ctx confContext
		_ = json.Unmarshal(cc.Context, &ctx)
		for _, ch := range cc.Changes {
			switch ch.Type {
			case raftpb.ConfChangeAddNode:
				voters[ch.NodeID] = true
			case raftpb.ConfChangeAddLearnerNode:
				voters[ch.NodeID] = false
			case raftpb.ConfChangeRemoveNode:
				delete(voters, ch.NodeID)
			}
			if ctx.ID != "" && ch.Type != raftpb.ConfChangeRemoveNode {
				info[ch.NodeID] = ctx.memberInfo
			}
		}
	}
	var out []Member
	for id, voter := range voters {
		m := info[id]
		out = append(out, Member{ID: m.ID, Address: m.Addr, Voter: voter})
	}
	slices.SortFunc(out, func(a, b Member) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}

type logPosition struct{ index, term uint64 }

// fold writes the state in f as a snapshot at last, this node alone in
// its configuration, drops the whole log and records the term, so that
// raft restarts on that snapshot and nothing else. Each step leaves a
// state a restart reads correctly: the snapshot is renamed into place
// whole and covers every entry the log still holds.
func fold(d *diskStorage, f *applier, last logPosition, term uint64, self memberInfo) error {
	f.advance(last.index)
	state, err := f.snapshotBytes()
	if err != nil {
		return err
	}
	members := map[uint64]memberInfo{raftID(self.ID): self}
	meta := raftpb.SnapshotMetadata{Index: last.index, Term: last.term, ConfState: raftpb.ConfState{Voters: []uint64{raftID(self.ID)}}}
	if err := d.writeSnapshot(meta, members, state); err != nil {
		return err
	}
	first, err := d.wal.FirstIndex()
	if err != nil {
		return err
	}
	lastIdx, err := d.wal.LastIndex()
	if err != nil {
		return err
	}
	if first > 0 {
		if err := d.wal.DeleteRange(first, lastIdx); err != nil {
			return fmt.Errorf("drop the folded log: %w", err)
		}
	}
	hs := raftpb.HardState{Term: term, Commit: last.index}
	b, err := hs.Marshal()
	if err != nil {
		return err
	}
	return d.meta.Set(hardStateKey, b)
}
