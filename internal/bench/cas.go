package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

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
