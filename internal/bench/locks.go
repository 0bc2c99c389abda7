package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

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
	return e.ownLocksAfter(ctx, n, e.sz.warmup, dur)
}

// ownLocksAfter is ownLocks with a warm-up of warm before the window.
func (e *env) ownLocksAfter(ctx context.Context, n int, warm, dur time.Duration) (Result, error) {
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
	// One client's pairs are compared with the commit floor, timed
	// before the window so that it does not share the machine with it.
	var fl floor
	var commit time.Duration
	if n == 1 {
		if fl, commit, err = e.floor(ctx); err != nil {
			return r, err
		}
	}
	syncs0, cluster, err := e.clusterSyncs(ctx, n == 1)
	if err != nil {
		return r, err
	}
	w := e.openWindow(ctx, warm, dur)
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
	if n == 1 {
		r.addFloor(fl, commit, float64(ops)/dur.Seconds())
	}
	if cluster {
		syncs1, err := e.srv.logSyncs(ctx)
		if err != nil {
			return r, err
		}
		r.addClusterFloor(fl, e.spec, syncs0, syncs1, float64(ops)/dur.Seconds())
	}
	return r, nil
}

// clusterSyncs reads the nodes' log syncs before a window whose floor is
// compared at the nodes' own sync (addClusterFloor): when want is set
// and the server is a cluster.
func (e *env) clusterSyncs(ctx context.Context, want bool) (syncs, bool, error) {
	if !want || len(e.srv.procs) < 2 {
		return syncs{}, false, nil
	}
	s, err := e.srv.logSyncs(ctx)
	return s, err == nil, err
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
	fl, commit, err := e.floor(ctx)
	if err != nil {
		return r, err
	}
	syncs0, cluster, err := e.clusterSyncs(ctx, true)
	if err != nil {
		return r, err
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
	r.addFloor(fl, commit, 0)
	// A handoff is the release's commit and the grant's push to the
	// next holder: issue 32 asks for its p50 within 0.2 ms of one commit.
	r.add("handoff p50 over one commit's floor", float64(percentile(mergeSorted(st.lats...), 50)-commit)/float64(time.Millisecond), "ms", Lower)
	if cluster {
		syncs1, err := e.srv.logSyncs(ctx)
		if err != nil {
			return r, err
		}
		r.addClusterFloor(fl, e.spec, syncs0, syncs1, 0)
	}
	return r, nil
}
