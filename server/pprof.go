package server

import (
	"net/http"
	"net/http/pprof"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/nativeapi"
)

// handlePprof serves Go's runtime profiles under /debug/pprof/, as
// etcd's --enable-pprof does: what docs/benchmarks.md's breakdowns are
// taken from. A profile names the process's code and data, so with a
// policy only a caller allowed to take a snapshot (an admin) may read
// one, whatever the policy says of /metrics.
func (s *Server) handlePprof(mux *http.ServeMux) {
	admin := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if s.policyOn() {
				if err := (nativeNode{frontNode{s}}).Check(r.Context(), r.URL.Path, &tenurev1.SnapshotRequest{}); err != nil {
					nativeapi.HTTPError(w, err)
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	}
	mux.Handle("GET /debug/pprof/", admin(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/cmdline", admin(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("GET /debug/pprof/profile", admin(http.HandlerFunc(pprof.Profile)))
	mux.Handle("GET /debug/pprof/symbol", admin(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("GET /debug/pprof/trace", admin(http.HandlerFunc(pprof.Trace)))
}
