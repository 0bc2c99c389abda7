// Package proccluster runs a Tenure cluster as real `tenure serve`
// processes for fault tests: kill -9, SIGSTOP, SIGTERM, restart with the
// same command and data dir, and network partitions.
//
// # Why every byte crosses a proxy
//
// A partition must cut raft traffic and forwarded client calls between
// nodes while the nodes still bind 127.0.0.1 only and nothing in the
// product changes for tests. So each node advertises a proxy in the test
// process for its API (--advertise) and for its raft port
// (--peer-advertise); other nodes and clients only ever dial those. Raft's
// sender dials the receiver, so traffic X→Y runs through Y's proxy: to
// cut X off, Y's proxy must refuse connections that X opened, not only
// X's own proxy those that others opened. All dialers share 127.0.0.1,
// so a proxy learns who dialed an accepted connection from the kernel:
// /proc/net/tcp maps the connection's remote port to a socket inode, and
// /proc/<pid>/fd shows which node's process holds that socket (the
// harness knows every node's PID). That is Linux only; Isolate skips the
// test elsewhere.
//
// A connection is forwarded only while its two ends are in the same
// partition group; the test process (clients) is in group 0. Changing the
// groups closes every forwarded connection that the new groups forbid, so
// a cut is immediate, like a pulled cable, not "only new connections".
//
// Each node's direct API address bypasses the proxies: a test uses it to
// ask a node cut off from everyone what it thinks (Status, stale reads).
//
// # Latency
//
// Every proxy forwards through a delay line (package delayline): a chunk
// is written its one-way delay after it arrived, by a goroutine of its
// own, so a pipelined stream keeps its throughput and its order, and a
// cut link drops what is still in the line. Only the peer proxies delay,
// since the round trip between nodes is what a deployment's commit pays:
// WithPeerRTT or SetLatency adds a round trip to every raft link (rtt/2
// each way), SetLinkLatency to those between two nodes, which needs the
// dialer of each link found as partitions find it. WithSyncDelay runs a
// benchsync build whose log syncs take that much longer (raftnode's
// afterLogSync), so that a cloud disk can be played on a fast one.
//
// Use Main from TestMain: it removes the built binary and checks for
// leaked goroutines.
package proccluster
