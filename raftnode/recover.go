package raftnode

import (
	"fmt"
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
