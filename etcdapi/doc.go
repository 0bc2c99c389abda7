// Package etcdapi serves etcd's v3 API over Tenure's state: KV, Watch,
// Lease, Lock, Election, Maintenance, Cluster and Auth, as etcd 3.5 does,
// with the messages, codes and error texts of go.etcd.io/etcd/api/v3, so
// that every etcd client works against Tenure unchanged.
//
// There is one store. An etcd key is a Tenure key; an etcd lease is a
// Tenure session, with Tenure's expiry rules (never early, a full TTL
// after a failover), and the keys attached to it are the keys bound to
// the session. The etcd API reads the keys' own clock, the KV revision
// (statemachine/mvcc.go): one per write, whatever a write changes, as
// etcd's revision, while sessions and fencing tokens keep the global
// revision of the native API.
//
// The package knows nothing of raft, the network or the policy file: it
// turns etcd requests into state machine commands and reads, and runs
// them through a Backend, which the server implements. A Backend call
// that needs the leader on a node that is not it fails with
// ErrNotLeader; the server forwards such calls to the leader.
package etcdapi
