package raftnode

import (
	"fmt"
	"strings"
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
