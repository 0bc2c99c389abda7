package raftnode

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/hashicorp/raft"
)

// MembershipError is returned by Open when a bootstrapping node's DataDir
// holds raft state whose configuration does not list the node's ID. Raft
// neither campaigns nor votes as a server it cannot find in its
// configuration, so such a node would stay a follower without a leader,
// and unready, forever. The usual cause is a backup copied to a node
// started with another ID, which tenure serve derives from --peer-listen.
type MembershipError struct {
	DataDir string   // Config.DataDir
	NodeID  string   // this node's ID
	Addr    string   // this node's raft address
	Servers []Member // the stored configuration, none of them this node
}

func (e *MembershipError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "raftnode: data dir %s holds the state of cluster %s, which does not list this node %s@%s: raft would never let it vote or be elected, so it would never become ready. ",
		e.DataDir, formatServers(e.Servers), e.NodeID, e.Addr)
	if len(e.Servers) == 1 {
		s := e.Servers[0]
		fmt.Fprintf(&b, "To run it as the node it was, start it with --node-id %s --peer-listen %s. ", s.ID, s.Address)
	} else {
		b.WriteString("To run it as one of the nodes it was, start it with the --node-id and --peer-listen of one of those servers. ")
	}
	b.WriteString(`To restore this copy onto this node's address as a new single-node cluster, start it once with --force-new-cluster; ` +
		`that is a restore tool, never for a member of a live cluster (see "Restoring a backup onto new addresses" in docs/operations.md)`)
	return b.String()
}

// formatServers writes a configuration as operators read it: "[id@addr
// (voter), ...]".
func formatServers(servers []Member) string {
	parts := make([]string, len(servers))
	for i, s := range servers {
		role := "nonvoter"
		if s.Voter {
			role = "voter"
		}
		parts[i] = fmt.Sprintf("%s@%s (%s)", s.ID, s.Address, role)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// reconcileConfiguration runs in open after the stores and the transport
// are open and before raft starts, when the stored configuration can
// still be read and rewritten without racing raft.
//
// With cfg.ForceNewCluster it rewrites the configuration to this node
// alone, a voter at trans.LocalAddr(), keeping the state: RecoverCluster
// replays the snapshot and log into a scratch FSM from newFSM, writes one
// snapshot carrying the new configuration, and empties the log. It fails
// on a data dir with no state, where there is nothing to restore, and does
// nothing when the configuration already is this node alone at this
// address, so that a flag left on a single node's restarts is harmless.
//
// Otherwise, on a node with cfg.Bootstrap and existing state, it returns a
// *MembershipError when the configuration lists servers but not this
// node's ID. It checks nothing on a node without state (it bootstraps or
// waits to be added) nor on a node started without Bootstrap: such a node
// waits for a leader to add it, and until that leader's configuration
// entry reaches it its log may name a cluster without it. A node listed
// at another address only gets a warning: raft elects by ID, so it
// works, and restarting on a fresh "127.0.0.1:0" port as the same ID is
// common in tests and embedding; only the members list, and peers that
// would dial it, see the old address.
func reconcileConfiguration(cfg Config, rc *raft.Config, logs raft.LogStore, stable raft.StableStore,
	snaps raft.SnapshotStore, trans raft.Transport, newFSM func() raft.FSM, log *slog.Logger,
) error {
	if !cfg.Bootstrap && !cfg.ForceNewCluster {
		return nil
	}
	exists, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("raftnode: inspect state: %w", err)
	}
	if !exists {
		if cfg.ForceNewCluster {
			return fmt.Errorf("raftnode: force new cluster: data dir %s holds no raft state, so there is nothing to restore (is it the copied backup?)", cfg.DataDir)
		}
		return nil
	}
	stored, err := storedConfiguration(logs, snaps)
	if err != nil {
		return err
	}
	id, addr := rc.LocalID, trans.LocalAddr()
	if cfg.ForceNewCluster {
		if len(stored.Servers) == 1 && stored.Servers[0].ID == id && stored.Servers[0].Address == addr && stored.Servers[0].Suffrage == raft.Voter {
			log.Info("force new cluster: the configuration already is this node alone at this address; nothing to rewrite", "addr", string(addr))
			return nil
		}
		log.Warn("FORCE NEW CLUSTER: rewriting the stored raft configuration to this node alone; every other member is forgotten. "+
			"This is a restore tool: on a member of a live cluster it makes a second cluster that diverges from the first",
			"dir", cfg.DataDir, "old_configuration", formatServers(members(stored)), "new_configuration", formatServers([]Member{{ID: string(id), Address: string(addr), Voter: true}}))
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: id, Address: addr}}}
		if err := raft.RecoverCluster(rc, newFSM(), logs, stable, snaps, trans, conf); err != nil {
			return fmt.Errorf("raftnode: force new cluster: %w", err)
		}
		log.Warn("force new cluster: configuration rewritten; remove the flag from later starts", "addr", string(addr))
		return nil
	}
	if len(stored.Servers) == 0 {
		return nil
	}
	for _, s := range stored.Servers {
		if s.ID != id {
			continue
		}
		if s.Address != addr {
			log.Warn("the stored configuration records this node at another address; it can still be elected, but members and other nodes see the old one",
				"stored_addr", string(s.Address), "addr", string(addr))
		}
		return nil
	}
	return &MembershipError{DataDir: cfg.DataDir, NodeID: string(id), Addr: string(addr), Servers: members(stored)}
}

// storedConfiguration returns the latest configuration in the stores, as
// NewRaft will find it: the last configuration entry in the log after the
// newest snapshot, else that snapshot's. It reads only what NewRaft reads
// again right after.
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
