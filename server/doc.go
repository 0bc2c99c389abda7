// Package server is one Tenure node: it wires the replicated log
// (raftnode), the leader's lessor, the watch hub and the state machine
// together, and serves them as the public API on one port.
//
// Why the boundary sits here: everything that knows about HTTP, connect,
// wire codes, limits and the leader's promotion lives in this package, so
// that statemachine stays pure, raftnode knows nothing of the API, and
// lessor and watch are small enough to test alone.
//
// What it owns:
//   - Validation at the edge (limits.go, selector.go, codec.go): bad input
//     is rejected with InvalidArgument naming the limit before anything
//     reaches the log.
//   - One table from domain errors to connect codes (errors.go), with the
//     error's name in the Tenure-Error header for clients.
//   - Parked Acquire calls (waiters.go): a waiting call registers before
//     it proposes and is woken only by its own grant.
//   - Leadership (server.go): after raft elects this node, a barrier and a
//     NewEpoch entry, then the lessor's deadlines restart at a full TTL.
//   - Reads only on the promoted leader, linearizable (server.go read).
//   - Watches (events.go): one check of a watch's filter and start
//     revision for the Connect streams and the NDJSON ones for curl
//     (httpwatch.go); the web page (web/), and /metrics, /healthz, /livez,
//     /readyz.
//
// The caller opens a node with Open and must call Close.
package server
