// Package server is one Tenure node: it wires the replicated log
// (raftnode), the leader's lessor, the watch hub and the state machine
// together, and serves them through the native API (nativeapi) and
// etcd's v3 API (etcdapi) on their ports.
//
// Why the boundary sits here: the APIs only turn wire messages into
// commands and reads; everything that knows whether this node leads,
// who the caller is and how much of the node it holds lives in this
// package, behind the one seam both APIs use (frontend.Node, written
// once in frontnode.go), so that a rule reaches both APIs or neither.
// statemachine stays pure, raftnode knows nothing of the APIs, and
// lessor and watch are small enough to test alone.
//
// What it owns:
//   - The seam (frontnode.go), and each API's extras over it
//     (nativenode.go, etcd.go).
//   - Parked Acquire calls (waiters.go): a waiting call registers before
//     it proposes and is woken only by its own grant.
//   - Leadership (server.go): after raft elects this node, a barrier and a
//     NewEpoch entry, then the lessor's deadlines restart at a full TTL.
//   - Reads only on the promoted leader, linearizable (server.go read).
//   - Membership (cluster.go, membership.go), forwarding to the leader
//     (forward.go, etcdforward.go), the policy (auth.go), quotas
//     (quota.go, storagequota.go) and metrics.
//   - The web page (web/), and /metrics, /healthz, /livez, /readyz.
//   - What the keys of etcd's locks do not say (recipes.go): when each
//     holder of a Mutex or Election became the holder, followed on every
//     node from the applied key events rather than kept in the
//     replicated state, and their per-lease metrics; unknown for a
//     handover older than the snapshot the node started from.
//   - Kubernetes' Leases (kubernetes.go): each change of holder of a
//     Lease kube-apiserver stores, followed from the applied key events
//     into the per-lease metrics, and audited once, by the leader.
//
// The caller opens a node with Open and must call Close.
package server
