package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
}

// --- 1: one client ---

func runOneClient(ctx context.Context, e *env) ([]Result, error) {
	r, err := e.ownLocks(ctx, 1, e.sz.duration)
	return []Result{r}, err
}

// --- 2 and 9: goroutines on their own locks ---

func runOwnLocks64(ctx context.Context, e *env) ([]Result, error) {
	r, err := e.ownLocks(ctx, 64, e.sz.duration)
	return []Result{r}, err
}

func runScaling(ctx context.Context, e *env) ([]Result, error) {
	var out []Result
	for _, n := range e.sz.scaling {
		r, err := e.ownLocks(ctx, n, e.sz.scalingDuration)
		r.Variant = strconv.Itoa(n) + " goroutines"
		out = append(out, r)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// ownLocks runs n goroutines, each looping Lock+Unlock on a lock of its
// own, spread over min(n, 4) connections with one session each: a
// user's process shares one client and one session among its
// goroutines, so 4 connections are 4 such processes.
func (e *env) ownLocks(ctx context.Context, n int, dur time.Duration) (Result, error) {
	var r Result
	conns := min(n, 4)
	ms, closeAll, err := e.fleet(ctx, conns, sessionTTL)
	if err != nil {
		return r, err
	}
	defer closeAll()
	locks := make([]locker, n)
	for i := range n {
		locks[i] = ms[i%conns].s.mutex(fmt.Sprintf("own-%d-%d", n, i))
	}
	w := e.openWindow(ctx, e.sz.warmup, dur)
	st, err := runWorkers(ctx, w, n, timed(func(ctx context.Context, i int) error {
		if err := locks[i].lock(ctx); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if err := locks[i].unlock(ctx); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		return nil
	}))
	cpu, _, werr := w.wait()
	if err = errors.Join(err, werr); err != nil {
		return r, err
	}
	ops := st.total()
	r.add("pairs/s", float64(ops)/dur.Seconds(), "/s", Higher)
	r.addLatency("pair", mergeSorted(st.lats...))
	r.addCPU(cpu, ops, "pair")
	w.addContext(&r, ops, "pair")
	return r, nil
}

// --- 3: contended ---

// contenders is how many sessions contend for the one lock of workload 3.
const contenders = 16

// runContended has 16 contenders, each with its own connection and
// session (16 processes), loop Lock+Unlock on one lock. A handoff's
// latency runs from just before the holder calls Unlock to the moment
// the next holder's Lock returns: what the next holder waits for once
// the lock is given up, with the release's round trip in it.
func runContended(ctx context.Context, e *env) ([]Result, error) {
	r, err := e.contended(ctx)
	return []Result{r}, err
}

func (e *env) contended(ctx context.Context) (Result, error) {
	var r Result
	ms, closeAll, err := e.fleet(ctx, contenders, sessionTTL)
	if err != nil {
		return r, err
	}
	defer closeAll()
	locks := make([]locker, contenders)
	for i, m := range ms {
		locks[i] = m.s.mutex("contended")
	}
	base := time.Now()
	var releasing atomic.Int64 // when the holder started to unlock, ns since base; 0 before the first
	w := e.openWindow(ctx, e.sz.warmup, e.sz.duration)
	st, err := runWorkers(ctx, w, contenders, func(ctx context.Context, i int) (time.Duration, error) {
		if err := locks[i].lock(ctx); err != nil {
			return 0, fmt.Errorf("lock: %w", err)
		}
		lat := noSample
		if at := releasing.Load(); at != 0 {
			lat = time.Since(base) - time.Duration(at)
		}
		releasing.Store(int64(time.Since(base)))
		if err := locks[i].unlock(ctx); err != nil {
			return 0, fmt.Errorf("unlock: %w", err)
		}
		return lat, nil
	})
	cpu, _, werr := w.wait()
	if err = errors.Join(err, werr); err != nil {
		return r, err
	}
	ops := st.total()
	r.add("handoffs/s", float64(ops)/e.sz.duration.Seconds(), "/s", Higher)
	r.addLatency("handoff", mergeSorted(st.lats...))
	least, most := st.counts[0], st.counts[0]
	for _, c := range st.counts {
		least, most = min(least, c), max(most, c)
	}
	r.add("fewest acquisitions of a contender", float64(least), "", Neither)
	r.add("most acquisitions of a contender", float64(most), "", Neither)
	r.addCPU(cpu, ops, "handoff")
	w.addContext(&r, ops, "handoff")
	return r, nil
}

// --- 4: heartbeat capacity ---

// runHeartbeats opens sessions in steps (1k; 10k, 50k, 100k, 200k,
// 300k), spread
// over a few connections, and holds each step for longer than the TTL
// while the clients heartbeat as they do by default (every TTL/3, both
// clients). A step passes when no session expired, on the client's
// word or the server's. The result is the largest step passed, with the
// heartbeat rate the server counted, its CPU per heartbeat and its
// memory there.
func runHeartbeats(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	sz := e.sz
	conns := make([]conn, sz.heartbeatConns)
	for i := range conns {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			closeConns(conns)
			return nil, err
		}
		conns[i] = c
	}
	// Dropping the connections ends the sessions' heartbeats; the server
	// is stopped next, so there is no point in closing 100,000 sessions
	// one by one.
	defer closeConns(conns)
	ctr := e.sys.counters()
	start, err := e.srv.Usage()
	if err != nil {
		return nil, err
	}
	var sessions []session
	kept := 0
	for _, target := range sz.heartbeatSteps {
		began := time.Now()
		opened, err := openSessions(ctx, conns, target-len(sessions), sz.heartbeatTTL, began.Add(sz.heartbeatOpen))
		sessions = append(sessions, opened...)
		if err != nil {
			// Not a failure of the run: a server too busy to open more
			// sessions in time has found its capacity.
			e.log.Info("bench: heartbeats: could not open the sessions", "system", e.sys, "target", target, "opened", len(sessions), "err", err)
			r.add("sessions opened of "+thousands(int64(target)), float64(len(sessions)), "", Neither)
			break
		}
		e.log.Info("bench: heartbeats: opened", "system", e.sys, "sessions", len(sessions), "took", time.Since(began).Round(time.Millisecond))
		beats0, err1 := e.srv.Metric(ctx, ctr.heartbeats)
		exp0, err2 := e.srv.Metric(ctx, ctr.expiries, ctr.expiryMatch...)
		w := e.openWindow(ctx, 0, sz.heartbeatHold)
		oldest := func() time.Duration { return 0 }
		if e.sys == Tenure && e.client != ClientEtcd {
			// Tenure's client knows its sessions' last acknowledged
			// heartbeats; an etcd conn learns them only when dialled
			// to (the crash workload's trackAcks).
			oldest = watchHeartbeats(sessions)
		}
		cpu, rss, err3 := w.wait()
		age := oldest()
		beats1, err4 := e.srv.Metric(ctx, ctr.heartbeats)
		exp1, err5 := e.srv.Metric(ctx, ctr.expiries, ctr.expiryMatch...)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return nil, err
		}
		lost := countLost(sessions)
		expired := max(float64(lost), exp1-exp0)
		e.log.Info("bench: heartbeats: held", "system", e.sys, "sessions", len(sessions), "expired", expired,
			"lost_by_client", lost, "expired_by_server", exp1-exp0, "oldest_heartbeat", age.Round(time.Millisecond),
			"heartbeats/s", (beats1-beats0)/sz.heartbeatHold.Seconds())
		if expired > 0 {
			r.add("expirations at "+thousands(int64(target))+" sessions", expired, "", Neither)
			if age > 0 {
				r.add("oldest acknowledged heartbeat", ms(age), "ms", Neither)
			}
			break
		}
		kept = target
		beats := beats1 - beats0
		r.Figures = nil // only the largest step passed is reported
		r.add("sessions kept alive", float64(kept), "", Higher)
		r.add("heartbeats/s", beats/sz.heartbeatHold.Seconds(), "/s", Higher)
		if age > 0 {
			r.add("oldest acknowledged heartbeat", ms(age), "ms", Neither)
		}
		if beats > 0 {
			r.add("server CPU/heartbeat", float64(cpu.Microseconds())/beats, "µs", Lower)
		}
		// Per session, so that two systems that kept different numbers
		// compare; the total is shown as measured.
		r.add("server RSS", mib(rss), "MiB", Neither)
		r.add("server RSS per 1,000 sessions", mib(rss-start.RSS)*1000/float64(kept), "MiB", Lower)
	}
	if kept == 0 {
		r.add("sessions kept alive", 0, "", Higher)
	}
	r.add("TTL", ms(sz.heartbeatTTL), "ms", Neither)
	return []Result{r}, nil
}

// watchHeartbeats samples, until the returned function is called, how
// long ago the oldest acknowledged heartbeat of sessions was sent, and
// that function returns the most seen: how close the step came to an
// expiry (the server's at the TTL; Tenure's client gives a session up
// at 0.75×TTL). It samples every 100ms, or every microsecond per
// session when there are more than 100,000, so that it takes a few
// percent of a core at most. A figure for context, not compared: a
// loaded machine delays heartbeats as much as a slow server does.
func watchHeartbeats(sessions []session) (oldest func() time.Duration) {
	stop, done := make(chan struct{}), make(chan time.Duration, 1)
	every := max(100*time.Millisecond, time.Duration(len(sessions))*time.Microsecond)
	go func() {
		var most time.Duration
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			now := time.Now()
			for _, s := range sessions {
				most = max(most, now.Sub(s.lastAck()))
			}
			select {
			case <-stop:
				done <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() time.Duration {
		close(stop)
		return <-done
	}
}

// countLost counts the sessions their client found lost.
func countLost(sessions []session) int {
	n := 0
	for _, s := range sessions {
		select {
		case <-s.lost():
			n++
		default:
		}
	}
	return n
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

// --- 5: clean resign ---

// runResign has two campaigners, each with its own connection and
// session. The leader resigns once the other is waiting: the server (or
// the store) lists both, and 150ms more have passed. etcd's Campaign
// writes its key, reads, then watches from the revision it read; etcd
// puts a watch that starts at a past revision in a group it catches up
// every 100ms, so a delete in the watch's first 100ms is delivered up to
// 100ms late. A steadily waiting candidate, the case measured, has long
// been caught up. The figure is the time from just before Resign is
// called to the moment the other's Campaign returns. Then they swap.
func runResign(ctx context.Context, e *env) ([]Result, error) {
	r, err := e.resign(ctx)
	if err != nil {
		return nil, err
	}
	return []Result{r}, nil
}

func (e *env) resign(ctx context.Context) (Result, error) {
	var r Result
	ms, closeAll, err := e.fleet(ctx, 2, sessionTTL)
	if err != nil {
		return r, err
	}
	defer closeAll()
	els := []elector{ms[0].s.election("resign"), ms[1].s.election("resign")}
	if err := els[0].campaign(ctx, "a"); err != nil {
		return r, fmt.Errorf("campaign: %w", err)
	}
	u0, err := e.srv.Usage()
	if err != nil {
		return r, err
	}
	var lats latencies
	leader := 0
	end := time.Now().Add(e.sz.duration)
	for len(lats) < e.sz.resignMax && time.Now().Before(end) {
		next := 1 - leader
		elected, err := campaignInBackground(ctx, els[next], strconv.Itoa(next))
		if err != nil {
			return r, err
		}
		if err := waitCampaigners(ctx, ms[leader].c, "resign", 2); err != nil {
			return r, err
		}
		if !sleepUntil(ctx, time.Now().Add(150*time.Millisecond)) {
			return r, ctx.Err()
		}
		resigned := time.Now()
		if err := els[leader].resign(ctx); err != nil {
			return r, fmt.Errorf("resign: %w", err)
		}
		res := <-elected
		if res.err != nil {
			return r, fmt.Errorf("campaign: %w", res.err)
		}
		lats = append(lats, res.at.Sub(resigned))
		leader = next
	}
	u1, err := e.srv.Usage()
	if err != nil {
		return r, err
	}
	if err := els[leader].resign(ctx); err != nil {
		return r, fmt.Errorf("resign: %w", err)
	}
	r.addLatency("resign→next", mergeSorted(lats))
	r.add("handovers", float64(len(lats)), "", Neither)
	// The whole cycle: the next campaign, the polls that wait for it to
	// be listed, the idle 150ms (both servers' background ticks) and the
	// resign.
	r.addCPU(u1.CPU-u0.CPU, int64(len(lats)), "handover")
	return r, nil
}

type electedAt struct {
	at  time.Time
	err error
}

// campaignInBackground starts a campaign and returns when it ended.
func campaignInBackground(ctx context.Context, el elector, value string) (<-chan electedAt, error) {
	out := make(chan electedAt, 1)
	go func() {
		err := el.campaign(ctx, value)
		out <- electedAt{time.Now(), err}
	}()
	return out, nil
}

// waitCampaigners polls until n sessions campaign for name.
func waitCampaigners(ctx context.Context, c conn, name string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		got, err := c.campaigners(ctx, name)
		if err != nil {
			return fmt.Errorf("count campaigners: %w", err)
		}
		if got >= n {
			return nil
		}
		if !sleepUntil(ctx, time.Now().Add(time.Millisecond)) {
			return fmt.Errorf("waiting for %d campaigners (have %d): %w", n, got, ctx.Err())
		}
	}
}

// --- 6: holder crash ---

// errEarlyLeader is a safety violation: the next leader was elected less
// than a TTL after the crashed holder's last acknowledged heartbeat.
var errEarlyLeader = errors.New("next leader elected before the crashed holder's TTL ran out")

// runCrash has a holder lead an election and a second campaigner wait,
// each with its own connection and a session of TTL 5s; then the holder
// "crashes": its connections are closed without ending its session
// (Tenure's Client.Close does not close sessions; closing etcd's client
// stops keep-alives without revoking the lease), so the server must
// expire it. The figure is the time from the crash to the moment the
// waiter's Campaign returns.
//
// It must not be less than the TTL after the holder's last acknowledged
// heartbeat's send time (which the holder may count on for its
// validity), or two leaders could overlap: that is reported as an
// error. From the crash itself the wait can legitimately be shorter than
// the TTL, by up to one heartbeat interval.
func runCrash(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	ttl := e.sz.crashTTL
	var fromCrash, fromAck latencies
	for i := range e.sz.crashIterations {
		name := fmt.Sprintf("crash-%d", i)
		hc, err := e.dial(ctx, dialOptions{trackAcks: true})
		if err != nil {
			return nil, err
		}
		crashed := false
		defer func() {
			if !crashed {
				_ = hc.close()
			}
		}()
		hs, err := hc.session(ctx, ttl)
		if err != nil {
			return nil, fmt.Errorf("open the holder's session: %w", err)
		}
		if err := hs.election(name).campaign(ctx, "holder"); err != nil {
			return nil, fmt.Errorf("holder's campaign: %w", err)
		}
		ms, closeWaiter, err := e.fleet(ctx, 1, ttl)
		if err != nil {
			return nil, err
		}
		waiter := ms[0].s.election(name)
		elected, err := campaignInBackground(ctx, waiter, "waiter")
		if err != nil {
			closeWaiter()
			return nil, err
		}
		if err := waitCampaigners(ctx, ms[0].c, name, 2); err != nil {
			closeWaiter()
			return nil, err
		}
		// Let a heartbeat or two pass, as a holder would have.
		if !sleepUntil(ctx, time.Now().Add(ttl/2)) {
			closeWaiter()
			return nil, ctx.Err()
		}
		ack := hs.lastAck()
		crash := time.Now()
		_ = hc.close()
		crashed = true
		var res electedAt
		select {
		case res = <-elected:
		case <-time.After(4 * ttl):
			res.err = fmt.Errorf("no new leader %v after the crash", 4*ttl)
		}
		closeWaiter()
		if res.err != nil {
			return nil, fmt.Errorf("waiter's campaign: %w", res.err)
		}
		fromCrash = append(fromCrash, res.at.Sub(crash))
		fromAck = append(fromAck, res.at.Sub(ack))
		if d := res.at.Sub(ack); d < ttl {
			return nil, fmt.Errorf("%w: %v after it, TTL %v", errEarlyLeader, d.Round(time.Millisecond), ttl)
		}
	}
	fc, fa := mergeSorted(fromCrash), mergeSorted(fromAck)
	r.add("crash→next", ms(percentile(fc, 50)), "ms", Lower)
	r.add("last acknowledged heartbeat→next (≥ TTL)", ms(fa[0]), "ms", Neither)
	r.add("TTL", ms(ttl), "ms", Neither)
	return []Result{r}, nil
}

// --- 7: compare-and-swap ---

// runCAS has 64 goroutines over 4 connections each own a key: Get it
// once, then loop compare-and-swap on its mod revision, carrying on from
// the revision each write returns.
func runCAS(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	const n, connN = 64, 4
	conns := make([]conn, connN)
	defer closeConns(conns)
	for i := range conns {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			return nil, err
		}
		conns[i] = c
	}
	revs := make([]int64, n)
	for i := range n {
		rev, err := conns[i%connN].get(ctx, casKey(i))
		if err != nil {
			return nil, fmt.Errorf("get: %w", err)
		}
		revs[i] = rev
	}
	w := e.openWindow(ctx, e.sz.warmup, e.sz.duration)
	st, err := runWorkers(ctx, w, n, timed(func(ctx context.Context, i int) error {
		rev, err := conns[i%connN].cas(ctx, casKey(i), revs[i], "v"+strconv.FormatInt(revs[i], 10))
		if err != nil {
			return fmt.Errorf("compare-and-swap: %w", err)
		}
		revs[i] = rev
		return nil
	}))
	cpu, _, werr := w.wait()
	if err = errors.Join(err, werr); err != nil {
		return nil, err
	}
	ops := st.total()
	r.add("CAS/s", float64(ops)/e.sz.duration.Seconds(), "/s", Higher)
	r.addLatency("CAS", mergeSorted(st.lats...))
	r.addCPU(cpu, ops, "CAS")
	w.addContext(&r, ops, "CAS")
	return []Result{r}, nil
}

func casKey(i int) string { return "/bench/cas/" + strconv.Itoa(i) }

// --- 8: memory ---

// runMemory reads the server's resident memory when it has started,
// after opening idle sessions (10,000, heartbeating, TTL 1 minute), and after those
// sessions' first 1,000 take 100,000 locks between them; the deltas are
// scaled to per 10,000 sessions and per 100,000 locks. RSS is what the
// OS charges: it includes garbage not yet collected, so it is the
// operator's figure, not the live heap's.
func runMemory(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	sz := e.sz
	conns := make([]conn, 8)
	defer closeConns(conns)
	for i := range conns {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			return nil, err
		}
		conns[i] = c
	}
	settle := func() (int64, error) {
		if !sleepUntil(ctx, time.Now().Add(time.Second)) {
			return 0, ctx.Err()
		}
		u, err := e.srv.Usage()
		return u.RSS, err
	}
	rss0, err := settle()
	if err != nil {
		return nil, err
	}
	sessions, err := openSessions(ctx, conns, sz.idleSessions, memoryTTL, time.Now().Add(5*time.Minute))
	if err != nil {
		return nil, fmt.Errorf("open %d sessions: %w", sz.idleSessions, err)
	}
	rss1, err := settle()
	if err != nil {
		return nil, err
	}
	holders := sessions[:min(sz.heldSessions, len(sessions))]
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= sz.heldLeases || ctx.Err() != nil {
					return
				}
				if err := holders[i%len(holders)].grant(ctx, "held-"+strconv.Itoa(i)); err != nil {
					errs <- fmt.Errorf("take lock %d: %w", i, err)
					next.Store(int64(sz.heldLeases))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	rss2, err := settle()
	if err != nil {
		return nil, err
	}
	r.add("server RSS at start", mib(rss0), "MiB", Lower)
	r.add("RSS per 10,000 idle sessions", mib(rss1-rss0)*10000/float64(sz.idleSessions), "MiB", Lower)
	r.add("RSS per 100,000 held locks", mib(rss2-rss1)*100000/float64(sz.heldLeases), "MiB", Lower)
	return []Result{r}, nil
}

// memoryTTL is the TTL of workload 8's sessions: a minute, not the
// default 10s, because the workload measures memory, not liveness. In the
// first full run, on a machine loaded by other work, a 10s session
// expired on both systems while its locks were being taken; at a minute
// the heartbeats (every 20s) are a sixth as many and far from their
// deadline, and what the server keeps per session is the same.
const memoryTTL = time.Minute

// --- 10: a 3-node cluster ---

// Workload 10's variants, which issue 24's goals name.
const (
	clusterOneClient = "1: one client"
	cluster64        = "2: 64 goroutines, own locks"
	clusterContended = "3: 16 contenders, one lock"
)

// runCluster runs workloads 1-3 and 5 on a 3-node cluster, every client given
// all three endpoints, as a user's would be; with delayed peer links,
// the leader's only (atLeader).
func runCluster(ctx context.Context, e *env) ([]Result, error) {
	var out []Result
	e, err := e.atLeader(ctx)
	if err != nil {
		return nil, err
	}
	r, err := e.ownLocks(ctx, 1, e.sz.duration)
	r.Variant = clusterOneClient
	out = append(out, r)
	if err != nil {
		return out, err
	}
	r, err = e.ownLocks(ctx, 64, e.sz.duration)
	r.Variant = cluster64
	out = append(out, r)
	if err != nil {
		return out, err
	}
	r, err = e.contended(ctx)
	r.Variant = clusterContended
	out = append(out, r)
	if err != nil {
		return out, err
	}
	r, err = e.resign(ctx)
	r.Variant = "4: resign → next leader"
	out = append(out, r)
	return out, err
}
