package server

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// Config configures a Tenure server node.
type Config struct {
	// Listener serves the API, the web page and the operational endpoints.
	// The caller creates it (tests bind 127.0.0.1:0); Close closes it.
	Listener net.Listener
	// Advertise is the API address other nodes and clients use to reach
	// this one ("host:port"); default the listener's address, which is
	// wrong when it listens on 0.0.0.0.
	Advertise string
	// Join lists API addresses of other nodes. A node without raft state
	// asks them to add it to their cluster, or, with BootstrapExpect,
	// meets them to form one. A node that already belongs to a cluster
	// ignores both.
	Join []string
	// BootstrapExpect, when above zero, forms a new cluster of that many
	// voters once this node has met that many nodes (itself included)
	// through Join, all started with the same BootstrapExpect.
	BootstrapExpect int
	// TLS, when set, serves the API over TLS only (HTTP/1.1 and HTTP/2
	// by ALPN); its certificate and client CA come from the caller
	// (internal/certs reloads them from files). Nil serves cleartext.
	TLS *tls.Config
	// PeerAPITLS is how this node calls other nodes' APIs when they serve
	// TLS (forwarding, joining, member status): its certificate is
	// presented to them, its RootCAs check theirs. Needed when TLS is set
	// on a node of a cluster.
	PeerAPITLS *tls.Config
	// Auth, when set, authenticates every request and checks it against
	// its policy (package auth). Nil lets every caller do everything.
	Auth *auth.Authenticator
	// Audit receives the audit trail (admin actions, denials, policy
	// reloads) when Auth is set; nil writes it to Logger.
	Audit  *slog.Logger
	Raft   raftnode.Config
	Limits Limits
	Logger *slog.Logger
	// Registry receives every metric; nil makes a private one.
	Registry *prometheus.Registry
	// Build names the binary in tenure_build_info.
	Build BuildInfo
	// Etcd turns on the etcd v3 API (etcd.go); off without a listener.
	Etcd EtcdConfig
	// Quota bounds the bytes the node holds (storagequota.go).
	Quota StorageQuota
	// KubernetesPrefix is the --etcd-prefix of a kube-apiserver that
	// stores its objects here ("/registry" by default, as its flag):
	// the Leases under <prefix>/leases/ are shown as leases of kind
	// nativeapi.KubernetesKind, counted in the per-lease metrics and
	// their holder changes audited (kubernetes.go). "" turns that off.
	KubernetesPrefix string
	// Pprof serves Go's profiles at /debug/pprof/ (pprof.go): off by
	// default, since a profile shows the process's internals and costs
	// CPU while it is taken.
	Pprof bool
}

// Server is one Tenure node: the replicated log, the lessor, the watch
// hub and the API on one port.
type Server struct {
	cfg     Config
	log     *slog.Logger
	node    *raftnode.Node
	lessor  *lessor.Lessor
	hub     *watch.Hub
	waiters *waiters
	quota   *quota
	http    *http.Server
	metrics *metrics
	recipes *recipeTracker // etcd recipe locks' times (recipes.go)
	kube    *kubeTracker   // Kubernetes Leases' holder changes (kubernetes.go)
	peers   *peers
	native  *nativeapi.API
	// etcdAuthRev is the auth store revision noteEtcdAuth last put in
	// force.
	etcdAuthRev atomic.Int64
	auth        *authState
	// advertise is the API address this node is known by.
	advertise string
	// etcd serves the etcd v3 API when it is on; etcdAdvertise is its
	// address, etcdPeers the connections to the leader's.
	etcd          *grpc.Server
	etcdLn        *etcdListener // gRPC and HTTP on the etcd port
	etcdGW        *etcdGateway  // etcd's JSON gateway, /health, /version
	etcdAdvertise string
	etcdTLS       *tls.Config // nil: cleartext
	etcdIdent     etcdIdentCache
	etcdPeers     etcdConns
	discovery     discovery
	space         spaceState // the storage quota's (storagequota.go)

	// draining is set by Close: no new client proposal is taken while
	// those in flight finish and leadership moves elsewhere. proposing
	// counts those in flight; drainMu makes the check and the count one
	// step against Close.
	drainMu   sync.RWMutex
	draining  bool
	proposing sync.WaitGroup
	// closing is draining for the HTTP edge, which must not take drainMu
	// on every request; lastRequest is when the last request arrived
	// (unix ns), so that Close can wait for clients to have moved on.
	closing     atomic.Bool
	lastRequest atomic.Int64

	// ready is set once this node is the promoted leader or knows one;
	// leading only while it is the promoted leader, whose reads are
	// current.
	ready, leading atomic.Bool

	stopC     chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	serveErr  chan error
}

// Open starts a node and begins serving on cfg.Listener. The caller must
// call Close.
func Open(cfg Config) (*Server, error) {
	if cfg.Listener == nil {
		return nil, errors.New("server: no listener")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits()
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.BootstrapExpect < 0 {
		return nil, fmt.Errorf("server: bootstrap-expect %d: must be 1 or more, or 0 for none", cfg.BootstrapExpect)
	}
	if cfg.BootstrapExpect > 1 && len(cfg.Join) == 0 {
		return nil, fmt.Errorf("server: bootstrap-expect %d needs the other nodes' addresses to meet them (--join)", cfg.BootstrapExpect)
	}
	if cfg.TLS != nil && cfg.PeerAPITLS == nil && (len(cfg.Join) > 0 || cfg.BootstrapExpect > 1) {
		return nil, errors.New("server: a node of a cluster that serves its API over TLS needs PeerAPITLS to call the other nodes' APIs")
	}
	if cfg.Advertise == "" {
		cfg.Advertise = cfg.Listener.Addr().String()
	}
	if err := checkAdvertise(cfg.Advertise); err != nil {
		return nil, err
	}
	if cfg.Etcd.Listener != nil && cfg.Etcd.Advertise == "" {
		cfg.Etcd.Advertise = cfg.Etcd.Listener.Addr().String()
	}
	s := &Server{
		cfg:           cfg,
		log:           cfg.Logger,
		hub:           watch.NewHubBytes(cfg.Limits.WatchHistory, cfg.Quota.watchHistoryBytes()),
		peers:         newPeers(cfg.PeerAPITLS),
		advertise:     cfg.Advertise,
		etcdAdvertise: cfg.Etcd.Advertise,
		etcdTLS:       cfg.TLS.Clone(), // before the HTTP server writes to cfg.TLS
		stopC:         make(chan struct{}),
		serveErr:      make(chan error, 1),
	}
	// Without a policy file the policy is etcd's users and roles alone,
	// in force once etcdctl enables auth (policyOn).
	authn := cfg.Auth
	if authn == nil {
		authn = &auth.Authenticator{Policy: auth.Static(nil)}
	}
	audit := cfg.Audit
	if audit == nil {
		audit = cfg.Logger.With("log", "audit")
	}
	s.auth = &authState{authn: authn, audit: auth.NewAuditor(audit)}
	s.metrics = newMetrics(cfg.Registry, s)
	s.recipes = newRecipeTracker(s.metrics.leases)
	s.kube = newKubeTracker(cfg.KubernetesPrefix, s.metrics.leases, s.kubeAudit, s.leading.Load)
	s.quota = newQuota()
	s.waiters = newWaiters(s.propose, s.holdWait, s.metrics.waiting.Add, cfg.Logger)
	s.lessor = lessor.New(lessor.Config{
		Proposer: proposer{s},
		// Collections wait for the cluster version, which rises within a
		// second of the last member registering: ask again soon after.
		PostponeInterval: 10 * time.Second,
		Logger:           cfg.Logger.With("component", "lessor"),
		Registerer:       cfg.Registry,
		// The raft node starts below; the lessor takes no heartbeat
		// before it is promoted, which is after the node leads.
		Leased: func(now time.Time) bool { return s.node.LeaseHeld(now) },
	})
	rc := cfg.Raft
	if rc.MaxLogMemoryBytes == 0 {
		rc.MaxLogMemoryBytes = cfg.Quota.raftLogBytes() // a share of the storage quota
	}
	rc.Logger = cfg.Logger
	rc.Registerer = cfg.Registry
	rc.Observer = s.observe
	rc.OnRestore = s.restored
	if len(cfg.Join) > 0 || cfg.BootstrapExpect > 1 {
		// The cluster is formed (or this node added to one) by the
		// membership loop, once it has met the others.
		rc.Bootstrap, rc.InitialVoters = false, nil
	}
	node, err := raftnode.Open(rc)
	if err != nil {
		s.lessor.Stop()
		return nil, fmt.Errorf("open raft node: %w", err)
	}
	s.node = node
	// HTTP/1.1 for curl and browsers, cleartext HTTP/2 for gRPC and for
	// Go clients' bidirectional keep-alive streams.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	if cfg.TLS != nil {
		protocols.SetHTTP2(true)
	}
	s.native = nativeapi.New(nativeNode{frontNode{s}}, cfg.Limits.native(), cfg.Logger)
	s.http = &http.Server{
		Handler:           s.routes(),
		Protocols:         &protocols,
		TLSConfig:         cfg.TLS,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.wg.Add(5)
	go func() {
		defer s.wg.Done()
		s.leadershipLoop()
	}()
	go func() {
		defer s.wg.Done()
		s.storageLoop()
	}()
	go func() {
		defer s.wg.Done()
		s.maxHoldLoop()
	}()
	go func() {
		defer s.wg.Done()
		s.membershipLoop()
	}()
	go func() {
		defer s.wg.Done()
		serve := s.http.Serve
		if cfg.TLS != nil {
			// The certificate comes from TLSConfig, not from files here.
			serve = func(ln net.Listener) error { return s.http.ServeTLS(ln, "", "") }
		}
		if err := serve(bufferedListener{cfg.Listener}); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.serveErr <- err
		}
	}()
	if err := s.startEtcd(); err != nil {
		_ = s.Close()
		return nil, err
	}
	s.log.Info("tenure serving", "addr", cfg.Listener.Addr().String(), "advertise", s.advertise, "node", node.ID(), "peer", node.Addr(), "data", rc.DataDir)
	return s, nil
}

// Addr is the address the API listens on.
func (s *Server) Addr() string { return s.cfg.Listener.Addr().String() }

// Err reports a fatal serving error, if the HTTP server stopped by itself.
func (s *Server) Err() <-chan error { return s.serveErr }

// Advertise is the API address other nodes and clients reach this one at.
func (s *Server) Advertise() string { return s.advertise }

// Close hands over and stops, in an order that leaves nothing in doubt:
// it stops taking client proposals, ends parked Acquire calls (their
// clients retry on the next leader, where their place in the queue is
// kept), waits for proposals in flight, hands leadership to another voter
// if it leads, then stops serving and shuts the node, so that no request
// is acknowledged after the log is closed and a rolling restart costs
// clients a retry, not an error. Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.drain()
		// Pipelines answer what they have read, then tell their clients
		// where they stopped reading, so nothing sent is left in doubt.
		s.native.ClosePipelines(time.Second)
		close(s.stopC)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// Streams (watches, keep-alives) never finish by themselves:
		// Shutdown waits for the unary calls, then Close cuts the rest.
		_ = s.http.Shutdown(ctx)
		_ = s.http.Close()
		s.stopEtcd()
		s.lessor.Stop()
		s.closeErr = s.node.Close()
		s.wg.Wait()
		s.peers.close()
		s.etcdPeers.close()
		// Last, when nothing audits any more: writes what was folded.
		s.auth.audit.Close()
	})
	return s.closeErr
}

// drainTimeout bounds each step of drain: proposals in flight, then the
// leadership transfer. Either running out only makes the handover less
// smooth (clients retry), never unsafe.
const drainTimeout = 3 * time.Second

func (s *Server) drain() {
	// Alone, there is nowhere for clients to go: the wait would only
	// delay the stop.
	if members, err := s.node.Members(); err == nil && len(members) > 1 {
		defer s.waitForQuiet()
	}
	s.closing.Store(true)
	s.drainMu.Lock()
	s.draining = true
	s.drainMu.Unlock()
	s.waiters.endWaits(raftnode.ErrClosed)
	if !waitGroupFor(&s.proposing, drainTimeout) {
		s.log.Warn("closing with proposals still in flight")
	}
	if !s.node.IsLeader() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := s.node.TransferLeadership(ctx, ""); err != nil {
		s.log.Info("no leadership transfer before closing", "err", err)
		return
	}
	_, to := s.node.Leader()
	s.log.Info("handed leadership over before closing", "to", to)
}

// waitGroupFor waits for wg up to timeout and reports whether it finished.
func waitGroupFor(wg *sync.WaitGroup, timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// quietPeriod is how long no request must have arrived before a closing
// node stops serving, and quietMax bounds that wait. Keep-alive
// connections are the reason: a client may send a request on an idle
// connection just as the server closes it, and could not tell whether
// it was read. While closing, every response carries Connection: close
// and names the leader, so clients leave this node after one answer;
// once none has come for a moment, no request is left in flight on the
// connections Shutdown closes.
const quietPeriod, quietMax = 150 * time.Millisecond, 1500 * time.Millisecond

func (s *Server) waitForQuiet() {
	deadline := time.Now().Add(quietMax)
	for time.Now().Before(deadline) {
		if time.Since(time.Unix(0, s.lastRequest.Load())) >= quietPeriod {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// indexHTML is the web page: who holds what, sessions, and live lease
// events, built on the public JSON API alone.
//
//go:embed web/index.html
var indexHTML []byte

// compressMinBytes is the smallest response message worth gzipping when
// the client accepts it.
const compressMinBytes = 1024

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(s.cfg.Limits.MaxRequestBytes),
		connect.WithInterceptors(s.metrics.interceptor(), authInterceptor{s}, forwarder{s}),
		// Most responses are tens of bytes; gzip would cost more CPU per
		// message (a fresh compressor state) than the bytes it saves.
		// Lists and values past this size are still compressed.
		connect.WithCompressMinBytes(compressMinBytes),
	}
	// The native API's handlers live in nativeapi; the membership
	// service is the server's own.
	s.native.Register(mux, opts...)
	mux.Handle(tenurev1connect.NewClusterServiceHandler(&clusterService{s}, append(opts, nativeapi.Codecs()...)...))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// A page that holds a client certificate must not be framed by
		// another site and clickjacked into Revoke.
		w.Header().Set("Content-Security-Policy", "frame-ancestors 'none'")
		w.Header().Set("X-Frame-Options", "DENY")
		_, _ = w.Write(indexHTML)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		// Like etcd's /health under a NOSPACE alarm: alive, but an
		// operator must act. Reads and releases are still served.
		if err := s.node.DiskFull(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// /livez is for a liveness probe: the process serves HTTP. Unlike
	// /healthz it ignores a full disk, which a restart does not cure and
	// a probe that restarted on it would turn into a restart loop.
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready: no leader yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", s.metricsAccess(s.metricsHandler()))
	if s.cfg.Pprof {
		s.handlePprof(mux)
	}
	return s.leaderHeader(limitBodies(s.authenticate(s.requireClientCert(mux)), s.cfg.Limits.MaxRequestBytes, s.cfg.Limits.RequestReadTimeout))
}

// observe receives every applied command's events, in log order, on the
// FSM goroutine under the state write lock. Nothing here may block.
func (s *Server) observe(m *statemachine.Machine, events []statemachine.Event) {
	s.noteEtcdAuth(m)
	s.hub.Publish(events)
	s.lessor.Observe(events)
	s.waiters.observe(events)
	s.metrics.leases.observe(events)
	s.recipes.observe(m, events)
	s.kube.observe(events)
}

// restored is told of a state restored from a snapshot, under the
// state write lock: the hub starts again from its revision, etcd's
// users and roles are the snapshot's, and the etcd locks' times start
// again (unknown until their next change).
func (s *Server) restored(revision int64, m *statemachine.Machine) {
	s.hub.Reset(revision)
	s.noteEtcdAuth(m)
	s.recipes.reset(m)
	s.kube.reset(m)
}

// leadershipLoop promotes the lessor when this node becomes leader and
// demotes it when it stops being one.
func (s *Server) leadershipLoop() {
	// promotion is the running promote, if any; it is stopped before a
	// leadership change is acted on, so two never overlap.
	var promotion struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	stopPromotion := func() {
		if promotion.cancel != nil {
			promotion.cancel()
			<-promotion.done
			promotion.cancel, promotion.done = nil, nil
		}
	}
	defer stopPromotion()
	check := time.NewTicker(250 * time.Millisecond)
	defer check.Stop()
	for {
		select {
		case <-s.stopC:
			return
		case leader := <-s.node.LeaderChanges():
			stopPromotion()
			s.leading.Store(false)
			s.lessor.Demote()
			s.ready.Store(false)
			// Parked calls would otherwise wait for grants only a leader
			// makes; their clients (or the follower that forwarded them)
			// call the next leader, where the queue kept their place.
			s.waiters.endWaits(s.notLeader())
			if leader {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				promotion.cancel, promotion.done = cancel, done
				go func() {
					defer close(done)
					s.promote(ctx)
				}()
			}
		case <-check.C:
			// A follower is ready when it knows a leader; the leader only
			// once promote has finished.
			if !s.node.IsLeader() {
				addr, _ := s.node.Leader()
				s.ready.Store(addr != "")
			}
		}
	}
}

// promote runs after this node became leader: a barrier so the state is
// current, a NewEpoch entry so expiries from earlier leaders are void,
// then every deadline restarts at a full TTL plus an election timeout.
func (s *Server) promote(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		err := s.tryPromote(ctx)
		if err == nil {
			s.leading.Store(true)
			s.ready.Store(true)
			return
		}
		if ctx.Err() != nil || errors.Is(err, raftnode.ErrNotLeader) || errors.Is(err, raftnode.ErrClosed) {
			return
		}
		s.log.Warn("promotion to leader failed; retrying", "err", err, "attempt", attempt)
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) tryPromote(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.node.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	res, err := s.node.Propose(ctx, statemachine.NewEpoch{})
	if err != nil {
		return fmt.Errorf("new epoch: %w", err)
	}
	// Followers forward to the address the leader advertised. Serving
	// does not wait on it: the membership loop tries again.
	if err := s.register(ctx, s.node.ID(), s.advertise, s.etcdAdvertise, statemachine.Version); err != nil {
		s.log.Warn("API address not advertised yet; followers cannot forward until it is", "err", err)
	} else if err := s.raiseClusterVersion(ctx); err != nil {
		s.log.Warn("cluster version not raised yet; the membership loop tries again", "err", err)
	}
	return s.node.ReadLocal(func(m *statemachine.Machine) error {
		if m.Epoch() != res.Epoch {
			return fmt.Errorf("epoch moved from %d to %d during promotion", res.Epoch, m.Epoch())
		}
		s.lessor.Promote(res.Epoch, m.Deadlines(), s.node.ElectionTimeout())
		s.log.Info("leader ready", "epoch", res.Epoch, "sessions", len(m.Sessions()))
		return nil
	})
}

// proposer lets the lessor propose expiries through the node.
type proposer struct{ s *Server }

// Propose proposes an expiry the lessor built (lessor.Command). A
// collection is postponed while some member runs a build that would not
// apply it: the deletions would move its revisions off the others'.
func (p proposer) Propose(ctx context.Context, cmd statemachine.Command) error {
	if _, ok := cmd.(statemachine.CollectLeases); ok {
		var version int
		_ = p.s.node.ReadLocal(func(m *statemachine.Machine) error {
			version = m.ClusterVersion()
			return nil
		})
		if version < 2 {
			return fmt.Errorf("%w: the cluster runs version %d, lease collection needs 2", lessor.ErrPostponed, version)
		}
	}
	_, err := p.s.node.Propose(ctx, cmd)
	return err
}

// propose applies a client's command and returns its result, with the
// command's own error as the error. Only the promoted leader takes client
// commands: before promotion its state may still be replaying the log,
// and a command answered from it (or a waiter woken by a replayed grant)
// would see history as the present.
func (s *Server) propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	if !s.leading.Load() {
		return statemachine.Result{}, s.notLeader()
	}
	if err := s.node.DiskFull(); err != nil && !frees(cmd) {
		return statemachine.Result{}, err
	}
	if err := s.checkStorageQuota(ctx, cmd); err != nil {
		return statemachine.Result{}, err
	}
	s.drainMu.RLock()
	if s.draining {
		s.drainMu.RUnlock()
		return statemachine.Result{}, raftnode.ErrClosed
	}
	s.proposing.Add(1)
	s.drainMu.RUnlock()
	defer s.proposing.Done()
	if open, ok := cmd.(statemachine.OpenSession); ok {
		// A session is the same thing through every API: the same
		// bounds on an identity's and a principal's.
		if open.MaxPerIdentity == 0 {
			open.MaxPerIdentity = s.cfg.Limits.MaxSessionsPerIdentity
		}
		cmd = open
		unlock, err := s.openingSession(ctx)
		if err != nil {
			return statemachine.Result{}, err
		}
		if unlock != nil {
			defer unlock()
		}
	}
	res, err := s.node.Propose(ctx, statemachine.WithActor(cmd, s.actorFor(ctx)))
	if errors.Is(err, raftnode.ErrNotLeader) {
		return res, s.notLeader()
	}
	if err != nil {
		return res, err
	}
	return res, res.Err
}

// frees reports whether cmd only ends things: those are still taken when
// the disk is nearly full (as etcd takes deletes under its NOSPACE alarm),
// so that holders can still release, sessions close and the next waiter
// be granted, while nothing new is added. Each is one small entry, and the
// reserve has room for many.
func frees(cmd statemachine.Command) bool {
	switch cmd.(type) {
	case statemachine.Release, statemachine.CloseSession, statemachine.Revoke, statemachine.Delete, statemachine.CancelWait:
		return true
	}
	return false
}

// read runs fn on current state: linearizable, and only on the promoted
// leader, whose state includes every acknowledged write. A stale read
// runs on this node's state as it is, which may trail the leader's.
func (s *Server) read(ctx context.Context, stale bool, fn func(m *statemachine.Machine) error) error {
	if stale {
		return s.node.ReadLocal(fn)
	}
	if !s.leading.Load() {
		return s.notLeader()
	}
	err := s.node.Read(ctx, fn)
	if errors.Is(err, raftnode.ErrNotLeader) {
		return s.notLeader()
	}
	return err
}

// notLeader is the error for calls only the promoted leader serves,
// naming the leader when another node is it.
func (s *Server) notLeader() error {
	_, id := s.node.Leader()
	if err := s.node.LogFull(); err != nil && (id == "" || id == s.node.ID()) {
		return err // no leader because this node's log is out of space
	}
	if id == s.node.ID() {
		return &notLeaderError{} // elected, but not yet caught up
	}
	addr, _ := s.leaderAddress()
	return &notLeaderError{id: id, addr: addr}
}
