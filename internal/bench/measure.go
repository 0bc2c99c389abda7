package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// errCompareFailed is returned by conn.cas when the compare did not hold.
var errCompareFailed = errors.New("compare failed")

// dialOptions change how a conn is made.
type dialOptions struct {
	// trackAcks makes an etcd conn learn its sessions' acknowledged
	// keep-alives (session.lastAck); Tenure's client tracks them anyway.
	trackAcks bool
}

// env is what a workload runs with: one system, its fresh server, and
// the sizes of this run.
type env struct {
	sys    System
	client Client // what drives Tenure
	srv    *Server
	spec   ServerSpec // how srv was started, for a workload that starts more
	sz     sizes
	log    *slog.Logger
	prof   *profiler // nil unless ServerSpec.ProfileDir is set
}

// floor measures the commit floor on the server's disk (floor.go).
func (e *env) floor(ctx context.Context) (floor, time.Duration, error) {
	f, err := measureFloor(ctx, e.srv.dataDir(), e.spec.TenureBinary)
	return f, f.commit(e.spec, e.sys, len(e.srv.procs)), err
}

func (e *env) dial(ctx context.Context, o dialOptions) (conn, error) {
	if e.sys == Etcd {
		return dialEtcd(ctx, e.srv.Endpoints, o)
	}
	if e.client == ClientEtcd {
		return dialEtcd(ctx, e.srv.EtcdEndpoints, o)
	}
	return dialTenure(ctx, e.srv.Endpoints)
}

// member is one client object with one session: one process of a user's
// fleet.
type member struct {
	c conn
	s session
}

// fleet opens n conns with a session each. The caller must call the
// returned close, which closes the sessions and then the conns.
func (e *env) fleet(ctx context.Context, n int, ttl time.Duration) ([]member, func(), error) {
	var ms []member
	closeAll := func() {
		closeMembers(ms)
	}
	for range n {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		s, err := c.session(ctx, ttl)
		if err != nil {
			c.close()
			closeAll()
			return nil, nil, fmt.Errorf("open a session: %w", err)
		}
		ms = append(ms, member{c, s})
	}
	return ms, closeAll, nil
}

// closeMembers closes the members' sessions (in parallel, each bounded by
// a few seconds), then their conns.
func closeMembers(ms []member) {
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.s == nil {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = m.s.close(ctx)
		})
	}
	wg.Wait()
	for _, m := range ms {
		_ = m.c.close()
	}
}

// window is a measured interval: it opens after a warm-up, so that
// connections are made and caches warm before anything counts, and
// reads the server's CPU time and memory at both edges.
type window struct {
	start, end time.Time
	done       chan struct{} // closed once both edges have been read
	u0, u1     usage
	// h0, h1 are the harness's own CPU time (its clients and delay
	// lines) and m0, m1 the machine's busy CPU time, at the edges; zero
	// where /proc could not be read, as they are context, not results.
	h0, h1, m0, m1 time.Duration
	err            error
}

// openWindow starts a window that opens warm from now and lasts dur.
func (e *env) openWindow(ctx context.Context, warm, dur time.Duration) *window {
	w := &window{start: time.Now().Add(warm), done: make(chan struct{})}
	w.end = w.start.Add(dur)
	go func() {
		defer close(w.done)
		if !sleepUntil(ctx, w.start) {
			w.err = ctx.Err()
			return
		}
		w.u0, w.err = e.srv.Usage()
		w.h0, w.m0 = harnessCPU(), machineBusy()
		if e.prof != nil {
			e.prof.window(ctx, dur)
		}
		if !sleepUntil(ctx, w.end) && w.err == nil {
			w.err = ctx.Err()
			return
		}
		u1, err := e.srv.Usage()
		w.h1, w.m1 = harnessCPU(), machineBusy()
		w.u1, w.err = u1, errors.Join(w.err, err)
	}()
	return w
}

// wait returns once both edges are read: the server's CPU time in the
// window and its memory at the end.
func (w *window) wait() (cpu time.Duration, rss int64, err error) {
	<-w.done
	return w.u1.CPU - w.u0.CPU, w.u1.RSS, w.err
}

// addContext adds to r what else used the CPU in the window, read after
// wait: the harness's CPU per op (the clients, and the delay lines with
// --peer-rtt), and how many of the machine's cores were busy on
// average, by anyone: a figure near runtime.NumCPU() says the window was
// bound by CPU, whoever took it.
func (w *window) addContext(r *Result, ops int64, per string) {
	if w.h1 > 0 && ops > 0 {
		r.add("harness CPU/"+per+" (clients, proxies)", float64((w.h1-w.h0).Microseconds())/float64(ops), "µs", Neither)
	}
	if w.m1 > 0 {
		r.add("machine CPU busy", (w.m1-w.m0).Seconds()/w.end.Sub(w.start).Seconds(), "cores", Neither)
	}
}

// in reports whether t falls in the window.
func (w *window) in(t time.Time) bool { return !t.Before(w.start) && !t.After(w.end) }

func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// noSample is what an op returns for a latency when it has none to give.
const noSample = time.Duration(-1)

// workerStats is what runWorkers counted.
type workerStats struct {
	counts []int64     // ops per worker that ended in the window
	lats   []latencies // their latencies
}

func (s workerStats) total() int64 {
	var n int64
	for _, c := range s.counts {
		n += c
	}
	return n
}

// runWorkers runs op on n goroutines, each again and again until the
// window ends, and counts per worker the ops that ended inside it, with
// the latency each op returns (noSample for none). The first error stops
// every worker and is returned.
func runWorkers(ctx context.Context, w *window, n int, op func(ctx context.Context, worker int) (time.Duration, error)) (workerStats, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st := workerStats{counts: make([]int64, n), lats: make([]latencies, n)}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for time.Now().Before(w.end) && ctx.Err() == nil {
				lat, err := op(ctx, i)
				if err != nil {
					cancel(fmt.Errorf("worker %d: %w", i, err))
					return
				}
				if end := time.Now(); w.in(end) {
					st.counts[i]++
					if lat != noSample {
						st.lats[i] = append(st.lats[i], lat)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return st, err
	}
	return st, ctx.Err()
}

// timed turns an operation into a runWorkers op whose latency is its
// duration.
func timed(fn func(ctx context.Context, worker int) error) func(context.Context, int) (time.Duration, error) {
	return func(ctx context.Context, worker int) (time.Duration, error) {
		start := time.Now()
		err := fn(ctx, worker)
		return time.Since(start), err
	}
}
