package nativeapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api/framing"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/statemachine"
)

// Backend is the node as the native API needs it: the seam every API
// shares (frontend.Node), and what only this API asks for. The server
// implements it; Connect's interceptors around the handlers (policy,
// metrics, forwarding to the leader) are the server's too, and Backend
// gives the calls this package runs itself — pipelined operations, the
// NDJSON watches — the same treatment.
type Backend interface {
	frontend.Node
	// Acquire runs cmd, and when cmd waits, parks until the state
	// machine grants its session, timeout (when positive) passes, ctx
	// ends or the session does; token 0 means not granted. A parked
	// wait holds one of the caller's wait slots.
	Acquire(ctx context.Context, cmd statemachine.Acquire, timeout time.Duration) (token int64, lease *statemachine.Lease, err error)
	// GrantWatchStart begins a watch of the grant with token on lease
	// id: ended is the event that already ended it, or else from is the
	// revision to follow it from; a token that is no grant of the lease
	// is refused.
	GrantWatchStart(ctx context.Context, id statemachine.LeaseID, token, start int64) (ended *statemachine.Event, from int64, err error)
	// LastHeartbeat is when the leader last heard from session id, for
	// display; zero on a follower.
	LastHeartbeat(id int64) time.Time
	// RecipeTimes tells, of etcd recipe lock l read in the Read this
	// is called from, when its holder became the holder and when each
	// of its contenders' keys was created (unix ns): 0 where this node
	// did not see it happen. See RecipeKind.
	RecipeTimes(l statemachine.RecipeLock) (since int64, joined []int64)
	// KubernetesPrefix is the --etcd-prefix of the kube-apiserver whose
	// Leases are shown as leases of KubernetesKind, or "" when that view
	// is off.
	KubernetesPrefix() string
	// MayRead reports, without auditing, whether the caller may read
	// key: a write's answer tells a write-only caller nothing of it.
	MayRead(ctx context.Context, key string) bool
	// Readable is the filter of events the caller may read under the
	// policy in force at each event (nil: all), which also ends the
	// stream (an error) when the caller's credential no longer holds or
	// it may no longer read what reads asks of it.
	Readable(ctx context.Context, reads func(*auth.Grants) bool) func(*statemachine.Event) (bool, error)
	// Check is the server's policy check of request msg of procedure,
	// the one its interceptor makes of a Connect call, with a refusal
	// audited: this package calls it for what no interceptor sees.
	Check(ctx context.Context, procedure string, msg any) error
	// Admit checks that the credential a long-lived connection was
	// opened with still holds, auditing a refusal under procedure.
	Admit(ctx context.Context, procedure string) error
	// Observe counts a call this package ran itself in the request
	// metrics, as the server's interceptor counts a Connect call.
	Observe(procedure string, start time.Time, err error)
	// Serving is nil when this node takes pipelines: the promoted
	// leader, not stopping. Otherwise it is why not, naming the leader.
	Serving() error
}

// API is the native API over one node: Connect's SessionService,
// LeaseService and KVService, the pipelines, and the NDJSON watches.
type API struct {
	node   Backend
	limits Limits
	log    *slog.Logger
	pipes  pipeConns
}

// New returns the native API of node, which checks requests against
// limits before anything reaches the node.
func New(node Backend, limits Limits, log *slog.Logger) *API {
	return &API{node: node, limits: limits, log: log}
}

// Register adds the native API's routes to mux, the Connect services
// with opts (the server's interceptors, read limits and compression).
// The codecs are this package's strict JSON and Connect's binary.
func (a *API) Register(mux *http.ServeMux, opts ...connect.HandlerOption) {
	opts = append(opts, strictJSONCodecs()...)
	sessionPath, sessionHandler := tenurev1connect.NewSessionServiceHandler(&sessionService{a}, opts...)
	mux.Handle(sessionPath, sessionHandler)
	mux.Handle(tenurev1connect.SessionServiceKeepAliveProcedure, coalesceFlushes(sessionHandler))
	mux.Handle(tenurev1connect.SessionServicePipelineProcedure, batchFlushes(sessionHandler))
	mux.HandleFunc("POST "+framing.Path, a.servePipelineUpgrade)
	mux.Handle(tenurev1connect.NewLeaseServiceHandler(&leaseService{a}, opts...))
	mux.Handle(tenurev1connect.NewKVServiceHandler(&kvService{a}, opts...))
	mux.HandleFunc("GET /v1/watch/leases", a.watchLeasesHTTP)
	mux.HandleFunc("GET /v1/watch/keys", a.watchKeysHTTP)
}

// Codecs are the native API's codecs, for other services on the same
// port (the server's ClusterService): strict JSON and binary.
func Codecs() []connect.HandlerOption { return strictJSONCodecs() }

// ClosePipelines refuses new upgraded pipelines and stops those open:
// each answers what it read, says GoAway, and closes. One that writes
// nothing for timeout is cut (see closeAll). http.Server.Shutdown does not see a hijacked
// connection, so the server calls this as it stops.
func (a *API) ClosePipelines(timeout time.Duration) { a.pipes.closeAll(timeout) }
