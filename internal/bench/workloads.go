package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// sizes are a run's durations and counts.
type sizes struct {
	duration time.Duration // each measured window of workloads 1-3, 7, 10
	warmup   time.Duration // before each window

	heartbeatSteps []int         // workload 4: sessions held at each step
	heartbeatTTL   time.Duration // their TTL
	heartbeatHold  time.Duration // how long each step is held and measured
	heartbeatConns int
	heartbeatOpen  time.Duration // at most this long to open each step's sessions

	resignMax int // workload 5: at most this many handovers per run

	crashTTL        time.Duration // workload 6
	crashIterations int

	idleSessions int // workload 8
	heldLeases   int
	heldSessions int // the sessions that hold them

	scaling         []int // workload 9: goroutines at each point
	scalingDuration time.Duration

	failoverIterations int // workload 12: leaders killed per run

	growth growthSizes // workload 13
}

// sizesFor returns the full run's sizes, or the short mode's, which
// bound each workload to a second or a few. The crash workload uses the
// smallest TTL both servers allow, 2s, to stay short. The heartbeat
// workload's check (no session expired) must hold on a loaded machine —
// the test suite runs it beside -race tests and fuzzing — so its TTL
// leaves room: at 2s a heartbeat every TTL/3 may be 0.8s late before the
// Tenure client gives its session up (0.75×TTL after the last
// acknowledged one), and a race-built client on two cores kept busy by
// others fell that far behind and gave up 576 to 1,000 of its 1,000
// sessions (the server expired none); at 5s it may be 2.1s late, and the
// server waits 3.3s. Under the race detector, whose clients run several
// times slower, it holds 250 sessions instead of 1,000.
func sizesFor(short bool, d time.Duration) sizes {
	if short {
		sessions := 1000
		if raceDetector {
			sessions = 250
		}
		return sizes{
			duration: d, warmup: 200 * time.Millisecond,
			heartbeatSteps: []int{sessions}, heartbeatTTL: 5 * time.Second, heartbeatHold: 6 * time.Second, heartbeatConns: 2, heartbeatOpen: 20 * time.Second,
			resignMax: 20,
			crashTTL:  2 * time.Second, crashIterations: 1,
			idleSessions: 500, heldLeases: 2000, heldSessions: 20,
			scaling: []int{1, 16}, scalingDuration: d,
			failoverIterations: 1,
			growth:             growthSizesFor(true, d),
		}
	}
	return sizes{
		duration: d, warmup: min(time.Second, max(d/5, 200*time.Millisecond)),
		heartbeatSteps: []int{10000, 50000, 100000, 200000, 300000}, heartbeatTTL: 10 * time.Second, heartbeatHold: 11 * time.Second, heartbeatConns: 8,
		heartbeatOpen: 45 * time.Second,
		resignMax:     300,
		crashTTL:      5 * time.Second, crashIterations: 1,
		idleSessions: 10000, heldLeases: 100000, heldSessions: 1000,
		scaling: []int{1, 4, 16, 64, 256}, scalingDuration: max(d/2, time.Second),
		failoverIterations: 5,
		growth:             growthSizesFor(false, d),
	}
}

// sessionTTL is the TTL of the sessions that hold locks and campaign in
// workloads other than 4 and 6: the default of both clients' users.
const sessionTTL = 10 * time.Second

// workload is one of issue 10's workloads.
type workload struct {
	ID    int
	Name  string // for --workloads, with the number
	Title string
	nodes int
	run   func(ctx context.Context, e *env) ([]Result, error)
	// once runs the workload in the first round only, in the full run:
	// for a ramp whose steps are its measurement, and which takes
	// minutes per system.
	once bool
	// etcdClient marks the workloads that --client etcd runs: those
	// issue 23 compares through etcd's own client (lock pairs, resign,
	// compare-and-swap, keep-alive capacity), on one node or three. The others are written
	// against the same interfaces, but their figures through Tenure's
	// etcd API have not been checked, so they are refused rather than
	// published unexamined.
	etcdClient bool
	// optIn marks a workload that runs only when --workloads names it:
	// one that takes most of half an hour at full size.
	optIn bool
	// timeout bounds one run of the workload (0: runOne's ten minutes).
	timeout time.Duration
}

// Workloads are the harness's workloads, in order.
var Workloads = []workload{
	{ID: 1, Name: "one-client", Title: "one client, Lock+Unlock pairs", nodes: 1, run: runOneClient, etcdClient: true},
	{ID: 2, Name: "64-clients", Title: "64 goroutines on their own locks over 4 connections", nodes: 1, run: runOwnLocks64, etcdClient: true},
	{ID: 3, Name: "contended", Title: "16 contenders on one lock", nodes: 1, run: runContended, etcdClient: true},
	{ID: 4, Name: "heartbeats", Title: "heartbeat capacity: most sessions kept alive with no expiry", nodes: 1, run: runHeartbeats, once: true, etcdClient: true},
	{ID: 5, Name: "resign", Title: "clean resign → next leader", nodes: 1, run: runResign, etcdClient: true},
	{ID: 6, Name: "crash", Title: "holder crash → next leader", nodes: 1, run: runCrash},
	{ID: 7, Name: "cas", Title: "compare-and-swap, 64 goroutines on their own keys over 4 connections", nodes: 1, run: runCAS, etcdClient: true},
	{ID: 8, Name: "memory", Title: "server memory per idle session and per held lock", nodes: 1, run: runMemory},
	{ID: 9, Name: "scaling", Title: "own locks at 1 to 256 goroutines over up to 4 connections", nodes: 1, run: runScaling},
	{ID: 10, Name: "cluster", Title: "workloads 1-3 and 5 on a 3-node cluster", nodes: 3, run: runCluster, etcdClient: true},
	{ID: 11, Name: "commit", Title: "commit latency: one client's sequential writes on a 3-node cluster", nodes: 3, run: runCommits, etcdClient: true},
	{ID: 12, Name: "failover", Title: "leader killed → first acknowledged write on a 3-node cluster", nodes: 3, run: runFailover},
	{ID: 13, Name: "growth", Title: "how cost grows with keys, sessions, watchers and history", nodes: 1, run: runGrowth, once: true, optIn: true, timeout: 30 * time.Minute},
}

func closeConns(conns []conn) {
	for _, c := range conns {
		if c != nil {
			_ = c.close()
		}
	}
}

// openSessions opens n sessions round robin over conns, 64 at a time,
// starting none after deadline, and returns those it opened. The
// sessions live on after ctx ends only until their conns are closed.
func openSessions(ctx context.Context, conns []conn, n int, ttl time.Duration, deadline time.Time) ([]session, error) {
	const parallel = 64
	out := make([]session, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range min(parallel, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if time.Now().After(deadline) {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("not all %d sessions opened within the time allowed", n)
					}
					mu.Unlock()
					return
				}
				s, err := conns[i%len(conns)].session(ctx, ttl)
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
						next.Store(int64(n)) // stop the others
					}
					mu.Unlock()
					return
				}
				out[i] = s
			}
		})
	}
	wg.Wait()
	opened := out[:0]
	for _, s := range out {
		if s != nil {
			opened = append(opened, s)
		}
	}
	if first == nil {
		first = ctx.Err()
	}
	return opened, first
}
