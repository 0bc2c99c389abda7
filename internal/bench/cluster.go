package bench

import (
	"context"
)

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
