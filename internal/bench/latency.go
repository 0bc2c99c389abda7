package bench

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// syncDelayEnv is the variable a benchsync build of tenure reads for
// its added sync delay (raftnode's afterLogSync).
const syncDelayEnv = "TENURE_BENCH_SYNC_DELAY"

// ErrNoBenchSync is returned by CheckBenchSync for a tenure binary built
// without -tags benchsync, whose log store ignores a sync delay.
var ErrNoBenchSync = errors.New("not built with -tags benchsync")

// CheckBenchSync checks that the tenure binary at bin was built with
// -tags benchsync, from the build settings the Go toolchain stamped into
// it: only such a build adds ServerSpec.SyncDelay to its syncs, and a
// release build never is one.
func CheckBenchSync(bin string) error {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("read the build settings of %s: %w", bin, err)
	}
	for _, s := range bi.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), "benchsync") {
			return nil
		}
	}
	return fmt.Errorf("%s: %w (build one with go build -tags benchsync -o tenure-bench ./cmd/tenure and give it as --tenure-binary)", bin, ErrNoBenchSync)
}

// atLeader is e with its clients given the cluster leader's endpoint
// only, when the server's peer links are delayed: a client next to the
// leader, so that a commit's figures are the replication's, not those of
// a follower's forwarding hop as well (which etcd forwards over its
// delayed peer link and Tenure over its API, not delayed here).
// Otherwise it is e unchanged.
func (e *env) atLeader(ctx context.Context) (*env, error) {
	if e.srv.proxies == nil {
		return e, nil
	}
	i, err := e.srv.leader(ctx)
	if err != nil {
		return nil, err
	}
	srv := *e.srv
	srv.Endpoints = []string{e.srv.Endpoints[i]}
	if e.srv.EtcdEndpoints != nil {
		srv.EtcdEndpoints = []string{e.srv.EtcdEndpoints[i]}
	}
	at := *e
	at.srv = &srv
	return &at, nil
}

// leader returns the index of the node that leads, as the nodes
// themselves report it.
func (s *Server) leader(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		for i, ep := range s.Endpoints {
			if lead, err := s.leads(ctx, ep); err == nil && lead {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("find the %s cluster's leader: %w", s.System, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Server) leads(ctx context.Context, ep string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if s.System == Etcd {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: time.Second, Logger: zap.NewNop(), Context: ctx})
		if err != nil {
			return false, err
		}
		defer c.Close()
		st, err := c.Status(ctx, ep)
		if err != nil {
			return false, err
		}
		return st.Leader == st.Header.MemberId, nil
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	st, err := tenurev1connect.NewClusterServiceClient(hc, "http://"+ep).Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
	if err != nil {
		return false, err
	}
	return st.Msg.GetRole() == "leader", nil
}

// --- 11: commits ---

// runCommits has one client write one key over and over on a 3-node
// cluster, each write a compare-and-swap on the revision the last one
// made, so that one write is in flight at a time: each one's latency is
// one commit's, the figure the issue-24 model predicts (leader sync +
// round trip + follower sync for an engine that syncs before it sends,
// sync + round trip for one that does both at once).
func runCommits(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	e, err := e.atLeader(ctx)
	if err != nil {
		return nil, err
	}
	c, err := e.dial(ctx, dialOptions{})
	if err != nil {
		return nil, err
	}
	defer c.close()
	const key = "/bench/commit"
	rev, err := c.get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	syncs0, err := e.srv.logSyncs(ctx)
	if err != nil {
		return nil, err
	}
	w := e.openWindow(ctx, e.sz.warmup, e.sz.duration)
	st, err := runWorkers(ctx, w, 1, timed(func(ctx context.Context, _ int) error {
		next, err := c.cas(ctx, key, rev, "v"+strconv.FormatInt(rev, 10))
		if err != nil {
			return fmt.Errorf("compare-and-swap: %w", err)
		}
		rev = next
		return nil
	}))
	cpu, _, werr := w.wait()
	if err = errors.Join(err, werr); err != nil {
		return nil, err
	}
	syncs1, err := e.srv.logSyncs(ctx)
	if err != nil {
		return nil, err
	}
	ops := st.total()
	r.add("writes/s", float64(ops)/e.sz.duration.Seconds(), "/s", Higher)
	r.addLatency("commit", mergeSorted(st.lats...))
	if n := syncs1.count - syncs0.count; n > 0 {
		r.add("log sync mean, all nodes", (syncs1.seconds-syncs0.seconds)/n*1000, "ms", Lower)
	}
	r.addCPU(cpu, ops, "write")
	w.addContext(&r, ops, "write")
	return []Result{r}, nil
}

// syncs is how many log writes a cluster's nodes have made durable and
// the seconds they took, from their metrics.
type syncs struct{ count, seconds float64 }

// logSyncs reads the nodes' log-sync histograms: Tenure's raft log
// append (raft-wal's write and fsync, and the benchsync delay) and
// etcd's WAL fsync. Their mean is the sync time the model uses.
func (s *Server) logSyncs(ctx context.Context) (syncs, error) {
	name := "tenure_raft_store_logs_duration_seconds"
	if s.System == Etcd {
		name = "etcd_disk_wal_fsync_duration_seconds"
	}
	count, err := s.Metric(ctx, name+"_count")
	if err != nil {
		return syncs{}, err
	}
	secs, err := s.Metric(ctx, name+"_sum")
	return syncs{count: count, seconds: secs}, err
}
