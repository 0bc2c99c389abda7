// Package bench is the side-by-side benchmark behind `tenure bench`: the
// workloads of issue 10, run against Tenure and against etcd on the same
// machine in the same run, with the ratio of each figure.
//
// # Why it is shaped this way
//
// A comparison is only as honest as its weakest asymmetry, so the
// harness removes the ones that are cheap to remove and names the rest.
//
// Each system is used through its own Go client the way its
// documentation shows a user: Tenure's client package (Session, Mutex,
// Election, KV) and etcd's clientv3 with its concurrency package
// (Session, Mutex, Election, and a Txn comparing ModRevision for
// compare-and-swap). A workload is written once against four small
// interfaces (conn, session, locker, elector), one implementation per
// system, so both are timed by the same code at the same points. What
// the interfaces cannot hide is said where it matters: Tenure's Mutex
// keeps a watch per grant, etcd's does not; Tenure's client opens an
// HTTP/1.1 connection per concurrent call and a stream per session,
// etcd's multiplexes everything on one HTTP/2 connection.
//
// Config.Client = ClientEtcd removes that asymmetry for the workloads
// issue 23 names: Tenure too is driven through etcd's clientv3 and
// concurrency packages, on its etcd API (tenure serve --etcd-listen),
// so both servers see the same requests from the same code and the
// figures compare the servers alone.
//
// Servers are real processes started by the harness, not in-process
// servers: the figures then include what a deployment pays (system
// calls, the loopback network, fsync on every acknowledged write, both
// systems' defaults) and the server's CPU and memory can be read from
// /proc apart from the clients'. Every run gets a fresh server in a
// fresh directory, so that no workload inherits another's log, keys or
// garbage. Within a round the systems alternate, and the order flips
// each round: on a shared two-core machine load drifts over minutes,
// and alternation spreads that drift over both systems instead of
// charging it to whichever ran second. Each figure is reported as the
// median over the rounds with its range; a wide range says the machine
// was busy, not that one system is erratic.
//
// Throughput is counted in a window that opens after a warm-up (so that
// connection set-up and the first allocation of everything are not
// counted) and closes on the clock, not after a fixed number of
// operations, so that a slow system is not given more time. An
// operation counts when it ends inside the window. Server CPU per
// operation is the server processes' user+system time across the same
// window over the operations counted in it.
//
// Workloads that measure a safety property fail loudly instead of
// producing a number: workload 6 reports an error if the next leader
// is elected less than a TTL after the crashed holder's last
// acknowledged heartbeat, the earliest moment the holder itself may
// believe it still leads.
//
// # A deployment's latencies on one machine
//
// On one machine a commit pays neither a network round trip nor a cloud
// disk's sync, and an engine that syncs before it replicates
// (hashicorp/raft) looks as fast as one that does both at once. So
// ServerSpec.PeerRTT puts a delay line (internal/proccluster/delayline)
// in front of every cluster node's peer port, for Tenure and etcd alike,
// and ServerSpec.SyncDelay has a benchsync build of tenure sleep after
// every log sync (raftnode's afterLogSync) and etcd run under strace,
// which returns from each of its syncs as much later (etcdsync.go). With
// delayed peer links the
// cluster workloads' clients talk to the leader alone: etcd forwards a
// follower's proposals over its peer link and Tenure over its API, which
// is not delayed, and that hop is not what is measured. Workload 11,
// one client's sequential writes, is a single commit's latency, the
// figure issue 24's model predicts. Workload 12 kills the leader's
// process between two of one client's writes and times the first write
// a new leader acknowledges: the election timeout, mostly, which is why
// its figure is p50 and max over a few kills, not a throughput.
//
// # How cost grows
//
// Workload 13 (growth.go) asks issue 32's question: not how fast an
// empty server is, but how its latency, throughput and memory change as
// it holds more keys, sessions, watchers or history. Each kind of state
// gets a fresh server, grown in steps; at each step the server's RSS and
// live Go heap are read and workloads 1 and 2 run for a short window.
// Filling is bounded in time, so a system that cannot reach a step is
// recorded with the largest it reached rather than failing the run. It
// runs only when named: at full size it takes most of half an hour.
//
// # What the caller must do
//
// Run needs the tenure binary (its serve command is what is measured)
// and, to compare, the etcd binary; it starts and stops the servers on
// free 127.0.0.1 ports itself and stops them when ctx ends. Servers run
// in their own process groups with a parent-death signal, so none
// outlives the harness; they are forked on an OS thread that each
// Server keeps locked until it stops, since the kernel sends that signal
// when the forking thread ends, not the process. Run is not safe to call concurrently with
// itself on a machine that should give meaningful figures, since the
// runs would share the CPUs.
package bench
