package server

import (
	"context"
	"errors"
	"runtime"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// metrics are the node's series. requests and latency count the calls
// of both front ends, each once, on the node its client called
// (etcdmetrics.go says how the etcd API's calls are counted).
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	waiting  prometheus.Gauge
	// forwarded counts calls this follower answered with the leader's
	// answer.
	forwarded prometheus.Counter
	leases    *leaseMetrics
	// etcdUnary and etcdStream count etcd API calls in etcd's own
	// grpc_server_* series.
	etcdUnary  grpc.UnaryServerInterceptor
	etcdStream grpc.StreamServerInterceptor
}

func newMetrics(reg *prometheus.Registry, s *Server) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_requests_total",
			Help: "API requests by method and result code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tenure_request_duration_seconds",
			Help:    "API request latency by method; for streams, the stream's lifetime.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}, []string{"method"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_acquire_calls_parked",
			Help: "Acquire calls parked on this node waiting for a grant.",
		}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tenure_forwarded_calls_total",
			Help: "Calls this node forwarded to the leader and answered with its answer.",
		}),
	}
	m.leases = newLeaseMetrics(reg, s.cfg.Limits.MetricsLeaseNames)
	m.leases.recipeKeep = s.cfg.Limits.LeaseGCAfter
	etcd := newEtcdServerMetrics()
	m.etcdUnary, m.etcdStream = etcd.UnaryServerInterceptor(), etcd.StreamServerInterceptor()
	reg.MustRegister(m.requests, m.latency, m.waiting, m.forwarded, etcd, stateCollector{s})
	// What pages an operator first: memory, goroutines, GC, file
	// descriptors. They go on the server's registry, not the global one,
	// so that tests running several servers in one process each get
	// their own (the process's figures, the same in each).
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo(s.cfg.Build))
	return m
}

// BuildInfo names the running binary: tenure_build_info's labels.
type BuildInfo struct {
	Version string // "(devel)" when empty
	Commit  string
	// GoVersion is the toolchain that built it; runtime.Version() when
	// empty.
	GoVersion string
}

// buildInfo is tenure_build_info, always 1, so that a query can join
// the version onto any series by instance, or count the versions a
// rolling upgrade leaves running.
func buildInfo(b BuildInfo) prometheus.Collector {
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.GoVersion == "" {
		b.GoVersion = runtime.Version()
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "tenure_build_info",
		Help:        "Always 1; its labels name the running binary's version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion},
	})
	g.Set(1)
	return g
}

// record counts one call of method that ended with code, begun at start.
func (m *metrics) record(method, code string, start time.Time) {
	m.requests.WithLabelValues(method, code).Inc()
	m.latency.WithLabelValues(method).Observe(time.Since(start).Seconds())
}

// interceptor counts and times every call by method and connect code,
// but for calls another node forwarded here: the node that took them
// counts them, so that a call is counted once over the cluster.
func (m *metrics) interceptor() connect.Interceptor {
	return &metricsInterceptor{m}
}

// forwardedByNode reports whether a native call whose ForwardedHeader is
// forwarded says so truly: under a policy, only a node's certificate
// makes a caller a node (authenticate attached it), so that a client
// cannot hide its calls from the metrics by claiming the header.
// Without a policy every caller is trusted with everything anyway.
func forwardedByNode(ctx context.Context, forwarded string) bool {
	if forwarded == "" {
		return false
	}
	c, ok := callerOf(ctx)
	return !ok || c.Peer
}

type metricsInterceptor struct{ m *metrics }

func (i *metricsInterceptor) observe(procedure string, start time.Time, err error) {
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
		if errors.Is(err, context.Canceled) {
			code = connect.CodeCanceled.String()
		}
	}
	i.m.record(procedure, code, start)
}

func (i *metricsInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if forwardedByNode(ctx, req.Header().Get(ForwardedHeader)) {
			return next(ctx, req)
		}
		start := time.Now()
		resp, err := next(ctx, req)
		i.observe(req.Spec().Procedure, start, err)
		return resp, err
	}
}

func (i *metricsInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *metricsInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if forwardedByNode(ctx, conn.RequestHeader().Get(ForwardedHeader)) {
			return next(ctx, conn)
		}
		start := time.Now()
		err := next(ctx, conn)
		i.observe(conn.Spec().Procedure, start, err)
		return err
	}
}

// stateCollector reads the gauges from the state at scrape time, so the
// apply path pays nothing for them.
type stateCollector struct{ s *Server }

var (
	sessionsDesc = prometheus.NewDesc("tenure_sessions", "Open sessions.", nil, nil)
	leasesDesc   = prometheus.NewDesc("tenure_leases", "Leases known, held or not.", nil, nil)
	heldDesc     = prometheus.NewDesc("tenure_lease_grants", "Grants currently held (a semaphore counts each holder).", nil, nil)
	waitersDesc  = prometheus.NewDesc("tenure_lease_waiters", "Sessions queued for a lease.", nil, nil)
	keysDesc     = prometheus.NewDesc("tenure_keys", "Keys stored.", nil, nil)
	revisionDesc = prometheus.NewDesc("tenure_revision", "The store's revision.", nil, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sessionsDesc, leasesDesc, heldDesc, waitersDesc, keysDesc, revisionDesc, leaseHoldersDesc, leaseQueuedDesc, leaseHeldDesc} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.node == nil {
		return
	}
	_ = c.s.node.ReadLocal(func(m *statemachine.Machine) error {
		var held, waiters int
		leases := m.Leases("")
		for _, l := range leases {
			held += len(l.Holders)
			waiters += len(l.Waiters)
		}
		gauge := func(d *prometheus.Desc, v int) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
		}
		gauge(sessionsDesc, len(m.Sessions()))
		gauge(leasesDesc, len(leases))
		gauge(heldDesc, held)
		gauge(waitersDesc, waiters)
		gauge(keysDesc, m.KeyCount())
		gauge(revisionDesc, int(m.Revision()))
		if c.s.metrics != nil {
			var recipes []recipeGauge
			for _, l := range m.RecipeLocks() {
				since, _ := c.s.recipes.times(l)
				recipes = append(recipes, recipeGauge{id: statemachine.LeaseID{Namespace: recipeNamespace, Name: nativeapi.RecipeName(l.Prefix)}, holders: 1, queued: len(l.Contenders) - 1, since: since})
			}
			now := time.Now()
			recipes = append(recipes, c.s.kube.gauges(m, now)...)
			c.s.metrics.leases.collectGauges(leases, recipes, now, ch)
		}
		return nil
	})
}
