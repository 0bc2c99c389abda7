// Package cluster runs a Tenure cluster of real servers in one process,
// for tests. It wires every node's raft traffic over one
// raftnode.MemNetwork, so that a partition, a crash and a restart are
// plain function calls. Each node is a whole
// server.Server, with its own data directory (the real log store, not a
// stand-in), its own API port on 127.0.0.1 and its own metrics registry.
//
// Why the boundary sits here. Failover is where the log, the lessor's
// promotion and the API meet, so it can only be tested with all of them:
// raftnode's tests cannot import the server, the server's own tests run
// one node, and process-level tests (e2e) cannot cut raft traffic without
// cutting everything. This package needs only raftnode's plug point for a
// network (raftnode.Config.Network) and the server's Open; the server
// knows nothing about it. It is internal because it is a testing tool:
// exported, it would become API that production code could lean on, as
// hashicorp/raft's exported MockFSM did.
//
// What it does not cut: the client network. Partition and Disconnect cut
// raft traffic only, so a test's clients still reach every node's API,
// including a deposed leader that has not noticed yet. That is the case
// the safety rules are about, and the one a proxy in front of the API
// cannot reach.
//
// Caller's duties:
//   - Call New, and the methods that change the cluster (Partition,
//     Disconnect, Heal, Stop, Restart), from the test goroutine. Leader,
//     Followers, Nodes, Node and every method of a Node are safe from any
//     goroutine, e.g. a client heartbeating in the background.
//   - Bound every wait with a context: Leader waits for as long as its
//     context allows.
//   - Close every stream opened on a node's API before the test ends: the
//     cluster's cleanup closes the servers, and goleak finds what is left.
package cluster
