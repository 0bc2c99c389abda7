package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/nativeapi"
)

// What /metrics shows to whom, with a policy: a series with a namespace
// label (the per-lease series, and the per-namespace count of collected
// records) names a namespace's leases and their activity, which every
// other surface shows only to principals with read on that namespace; so
// does /metrics. Every other series (raft, lessor, requests, the Go
// runtime) is shown to whoever may scrape (metricsAccess decides). A
// node acting for itself, a principal with read on every namespace and
// a cluster admin (who may snapshot the whole state anyway) see
// everything. With `metrics: open` the operator has published the page
// to anybody who reaches the port, credentials or not, and nothing is
// filtered: filtering only those who present credentials would hide
// from them what an anonymous scraper sees.

// metricsHandler serves /metrics, filtered for the caller as above.
// metricsAccess runs before it and has refused whoever may not scrape.
func (s *Server) metricsHandler() http.Handler {
	opts := promhttp.HandlerOpts{}
	all := promhttp.HandlerFor(s.cfg.Registry, opts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.policyOn() || s.auth.authn.Policy.Policy().Metrics() == auth.MetricsOpen {
			all.ServeHTTP(w, r)
			return
		}
		// Not counted against the rate again: metricsAccess did.
		g, err := s.grants(r.Context(), false)
		if err != nil {
			nativeapi.HTTPError(w, toConnect(err))
			return
		}
		if g == nil || g.AllNamespaces(auth.Read) || g.ClusterAdmin() {
			all.ServeHTTP(w, r)
			return
		}
		keep := func(ns string) bool { return g.Namespace(auth.Read, ns) }
		promhttp.HandlerFor(namespaceFilter{s.cfg.Registry, keep}, opts).ServeHTTP(w, r)
	})
}

// namespaceFilter gathers what its Gatherer does, less the series whose
// namespace label keep refuses. A family left without series is left
// out.
type namespaceFilter struct {
	prometheus.Gatherer
	keep func(namespace string) bool
}

func (f namespaceFilter) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := f.Gatherer.Gather()
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		ms := make([]*dto.Metric, 0, len(mf.GetMetric()))
		for _, m := range mf.GetMetric() {
			if ns, ok := namespaceOf(m); !ok || f.keep(ns) {
				ms = append(ms, m)
			}
		}
		if len(ms) == 0 && len(mf.GetMetric()) > 0 {
			continue
		}
		mf.Metric = ms
		out = append(out, mf)
	}
	// A Gatherer may return families and an error together (some
	// collectors failed); promhttp decides what to serve of them.
	return out, err
}

func namespaceOf(m *dto.Metric) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == "namespace" {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// metricsAccess guards /metrics as the policy says.
func (s *Server) metricsAccess(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.policyOn() {
			next.ServeHTTP(w, r)
			return
		}
		var msg any = &tenurev1.StatusRequest{}
		switch s.auth.authn.Policy.Policy().Metrics() {
		case auth.MetricsOpen:
			next.ServeHTTP(w, r)
			return
		case auth.MetricsAdmin:
			msg = &tenurev1.SnapshotRequest{}
		}
		if err := (nativeNode{frontNode{s}}).Check(r.Context(), r.URL.Path, msg); err != nil {
			nativeapi.HTTPError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}
