package bench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// --- 12: leader failover ---

const (
	// failoverWrite bounds one write of workload 12. A write that waits
	// for a leader is not given up before the election can have ended
	// (within twice the election timeout: 1 s for tenure serve's
	// default, 2 s for etcd's), but one lost with the killed
	// leader — etcd forwards a follower's proposal to the leader it
	// knows and waits for its answer — does not hold the loop for
	// etcd's whole request timeout (7 s).
	failoverWrite = 2 * time.Second
	// failoverLimit bounds the wait for the first write after the kill,
	// and the restarted node's catch-up.
	failoverLimit = 30 * time.Second
)

// runFailover has one client write in a loop on a 3-node cluster, each
// write a new key (created if absent), with every node's endpoint, the
// leader's first, as a user's client would have them. Between two
// writes, so that none is in flight, the harness kills the raft leader's
// process with SIGKILL; the figure is the time from the kill to the
// first write acknowledged after it, which a new leader committed. The
// killed node is then restarted on its data and the next iteration
// waits until it has applied what the others had, so that every
// iteration starts from a whole cluster.
//
// The figure is mostly the followers' election timeout: a follower
// campaigns after hearing nothing from the leader for a time raft draws
// between the timeout and twice it (tenure serve's --election-timeout,
// 500 ms by default; etcd's --election-timeout, 1 s), then a pre-vote
// and a vote round and the first commit.
func runFailover(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	var lats latencies
	for i := range e.sz.failoverIterations {
		d, err := e.failover(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("failover %d: %w", i+1, err)
		}
		e.log.Info("bench: failover", "system", e.sys, "iteration", i+1, "kill→first write", d.Round(time.Millisecond))
		lats = append(lats, d)
	}
	sorted := mergeSorted(lats)
	r.add("kill→first write p50", ms(percentile(sorted, 50)), "ms", Lower)
	r.add("kill→first write max", ms(sorted[len(sorted)-1]), "ms", Lower)
	r.add("failovers", float64(len(sorted)), "", Neither)
	r.Samples = map[string][]float64{}
	for _, d := range sorted {
		r.Samples["kill→first write"] = append(r.Samples["kill→first write"], ms(d))
	}
	return []Result{r}, nil
}

// failover runs one iteration of workload 12 and returns the time from
// the kill to the first acknowledged write.
func (e *env) failover(ctx context.Context, iter int) (time.Duration, error) {
	lead, err := e.srv.leader(ctx)
	if err != nil {
		return 0, err
	}
	c, err := e.leaderFirst(lead).dial(ctx, dialOptions{})
	if err != nil {
		return 0, err
	}
	defer c.close()
	n := 0
	write := func() error {
		n++
		ctx, cancel := context.WithTimeout(ctx, failoverWrite)
		defer cancel()
		_, err := c.cas(ctx, fmt.Sprintf("/bench/failover/%d/%d", iter, n), 0, "v")
		return err
	}
	for end := time.Now().Add(e.sz.warmup); time.Now().Before(end); {
		if err := write(); err != nil {
			return 0, fmt.Errorf("write before the kill: %w", err)
		}
	}
	killed := time.Now()
	e.srv.procs[lead].kill()
	var took time.Duration
	for {
		err := write()
		if err == nil {
			took = time.Since(killed)
			break
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if time.Since(killed) > failoverLimit {
			return 0, fmt.Errorf("no write acknowledged %v after the leader (%s) was killed: %w", failoverLimit, e.srv.procs[lead].name, err)
		}
		// Tenure's client retries within a write; etcd's does not retry
		// a Txn, so its "no leader" comes back here.
		if !sleepUntil(ctx, time.Now().Add(2*time.Millisecond)) {
			return 0, ctx.Err()
		}
	}
	if err := e.srv.restart(ctx, lead); err != nil {
		return 0, err
	}
	return took, nil
}

// leaderFirst is e with its clients given every endpoint, the lead-th
// first.
func (e *env) leaderFirst(lead int) *env {
	first := func(eps []string) []string {
		if eps == nil {
			return nil
		}
		return append([]string{eps[lead]}, slices.Delete(slices.Clone(eps), lead, lead+1)...)
	}
	srv := *e.srv
	srv.Endpoints, srv.EtcdEndpoints = first(e.srv.Endpoints), first(e.srv.EtcdEndpoints)
	at := *e
	at.srv = &srv
	return &at
}

// restart starts node i again after a kill, on its data, and returns
// once every node is ready and node i has applied at least what the
// others had applied when it was ready.
func (s *Server) restart(ctx context.Context, i int) error {
	p, err := s.procs[i].restart()
	if err != nil {
		return err
	}
	s.procs[i] = p
	ctx, cancel := context.WithTimeout(ctx, failoverLimit)
	defer cancel()
	if err := waitFor(ctx, s.procs, s.ready); err != nil {
		return fmt.Errorf("restart %s: %w", p.name, err)
	}
	name := "tenure_raft_applied_index"
	if s.System == Etcd {
		name = "etcd_server_proposals_applied_total"
	}
	var want float64
	for j := range s.procs {
		if j == i {
			continue
		}
		v, err := s.nodeMetric(ctx, j, name)
		if err != nil {
			return err
		}
		want = max(want, v)
	}
	if want == 0 {
		return fmt.Errorf("%s: no node reports it (a metric renamed?)", name)
	}
	return waitFor(ctx, s.procs, func(ctx context.Context) error {
		got, err := s.nodeMetric(ctx, i, name)
		if err == nil && got < want {
			err = fmt.Errorf("%s has applied %v of %v", p.name, got, want)
		}
		return err
	})
}
