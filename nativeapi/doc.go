// Package nativeapi is Tenure's own API: Connect's SessionService,
// LeaseService and KVService (gRPC, gRPC-Web, Connect and JSON on one
// port), the pipelines that carry a Go client's operations on one
// connection, and the NDJSON watches for curl. It turns each request
// into a state machine command or a read of a node (Backend), and the
// node's errors into wire codes with a reason clients branch on
// (errors.go, over api.Reasons).
//
// Why the boundary sits here. Tenure serves two APIs over one node, and
// the rules of who may do what and how much of the node a caller may
// hold are written once, behind frontend.Node, in the server. This
// package is the native API's half of that bargain, beside etcdapi:
// what it knows is the wire — messages, codes, the codec, the edge's
// limits — and what it asks of the node it asks through Backend, in the
// open. It cannot import the server, so it cannot grow a second copy of
// a rule. etcd is built the same way: its v3rpc handlers over RaftKV,
// Lessor and Authenticator.
//
// What it owns:
//   - Validation at the edge (limits.go, selector.go, codec.go): bad
//     input is refused with InvalidArgument naming the field, the limit
//     and its flag before anything reaches the log.
//   - The one table from the node's errors to connect codes (errors.go),
//     with the reason in the Tenure-Error header for clients.
//   - Watches (events.go): one check of a watch's filter and start
//     revision for the Connect streams and the NDJSON ones (httpwatch.go);
//     a key watch is package keyfeed's, the same as etcd's.
//   - etcd's locks as leases (recipe.go): ListLeases across all
//     namespaces appends each lock of etcd's concurrency recipes, read
//     from its keys (statemachine.RecipeLocks), as a Lease of kind
//     RecipeKind — told apart by kind, not by a namespace a user could
//     own — with the times the server saw (Backend.RecipeTimes); the
//     server's filter shows it to callers that may read its keys. A
//     lease watch with etcd_locks adds an event per change of their keys.
//   - Kubernetes' Leases as leases (kubernetes.go): likewise, the
//     coordination.k8s.io Leases a kube-apiserver stores under
//     Backend.KubernetesPrefix (statemachine.KubernetesLeases), as kind
//     KubernetesKind, read-only; kubernetes_leases on a lease watch adds
//     an event per write of their keys.
//   - Pipelines (pipeline.go, pipeidle.go): each operation runs its
//     unary handler, checked by the policy and counted in the metrics as
//     its unary twin is (Backend.Check, Backend.Observe).
//
// What it leaves to the server: Connect's interceptors (the policy's
// check of every call and stream message, metrics, forwarding a
// follower's call to the leader), which the server passes to Register;
// parked acquires (Backend.Acquire), whose wake-ups follow the log.
//
// Caller's duties: call Register once on the mux that serves the API,
// and ClosePipelines when the node stops, before its Backend does.
package nativeapi
