package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// Authorization: with a policy (Config.Auth), every request is
// authenticated at the HTTP edge, and every operation is checked against
// the policy in force where it is decoded, by one function (check) for
// unary calls, each message of a stream and each pipelined operation
// alike, so that no path can skip it. A follower checks before it
// forwards, and the leader checks again as the principal the follower
// names (believed only from a node's peer certificate), against its own
// state. Without a policy none of this runs.
//
// Those checks are a fast path. Whether the caller owns the session or
// grant a command acts on is decided when the command is applied
// (statemachine.Actor, DESIGN.md rule 10): every such proposal carries
// the caller's principal and identity patterns (actorFor), because the
// state a check reads may not yet hold the session the command will meet.
// The fast path therefore never lets an ID it does not know through as
// allowed: it lets the state machine decide, or refuses. Credentials are
// checked on every call, every stream message and every pipelined
// operation against the policy in force (grants), not once per
// connection.

var (
	errUnauthenticated  = frontend.ErrUnauthenticated
	errPermissionDenied = frontend.ErrPermissionDenied
	errRateLimited      = frontend.ErrRateLimited
)

type callerKey struct{}

// callerOf is who made the request ctx belongs to.
func callerOf(ctx context.Context) (auth.Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(auth.Caller)
	return c, ok
}

func withCaller(ctx context.Context, c auth.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// policyOn reports whether a policy governs callers: a policy file, or
// etcd's users and roles once auth is enabled. Without one every caller
// may do everything, and none is audited.
func (s *Server) policyOn() bool { return s.auth.authn.Policy.Policy().InForce() }

// authState is the server's authorization machinery.
type authState struct {
	authn   *auth.Authenticator
	audit   *auth.Auditor
	limiter auth.RateLimiter
	// opening serialises Opens per principal on this node (the leader,
	// where they all end up), so that the per-principal session count
	// is exact.
	opening sync.Map // principal → *sync.Mutex
}

// authenticate attaches the caller to every request. Health checks and
// the page itself (not its data) need no credentials.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := s.auth.authn.Authenticate(r)
		// The address goes with the caller, for the audit lines of
		// checks made far from the request (a heartbeat's owner).
		next.ServeHTTP(w, r.WithContext(withCaller(frontend.WithRemote(r.Context(), r.RemoteAddr), c)))
	})
}

// grants returns what the caller of ctx may do, nil for a node acting for
// itself (everything), or the error that refuses it: unauthenticated,
// unknown to the policy, or, when the request counts against its rate
// (once per request or stream message, not again to filter its answer),
// over that rate.
func (s *Server) grants(ctx context.Context, counts bool) (*auth.Grants, error) {
	c, ok := callerOf(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: no caller on the request", errUnauthenticated)
	}
	if err := s.auth.authn.Recheck(c); err != nil {
		return nil, fmt.Errorf("%w: %v", errUnauthenticated, err)
	}
	if c.Peer && c.Principal == "" {
		return nil, nil
	}
	g := s.auth.authn.Policy.Policy().For(c.Principal)
	if !g.Known() {
		return nil, fmt.Errorf("%w: principal %s is not in the policy", errPermissionDenied, c.Principal)
	}
	// A forwarded call was counted by the node that took it.
	if counts && c.By != auth.ByForwarding {
		if err := s.auth.limiter.Allow(g, time.Now()); err != nil {
			return nil, fmt.Errorf("%w: %v", errRateLimited, err)
		}
	}
	return g, nil
}

func deny(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errPermissionDenied, fmt.Sprintf(format, args...))
}

// check decides whether the caller of ctx may make the request msg. It
// may fill in a default (a session's identity) and returns, for an Open,
// a function to call when the call is over.
func (s *Server) check(ctx context.Context, msg any) (done func(), err error) {
	if !s.policyOn() {
		return nil, nil
	}
	g, err := s.grants(ctx, true)
	if err != nil || g == nil {
		return nil, err
	}
	who := g.Principal
	ns := func(n string) string { return api.NewLeaseName(n, "").Namespace }
	namespace := func(v auth.Verb, n string) error {
		if !g.Namespace(v, ns(n)) {
			return deny("%s may not %s in namespace %s", who, v, ns(n))
		}
		return nil
	}
	key := func(v auth.Verb, k string, prefix bool) error {
		if prefix && !g.KeyPrefix(v, k) {
			return deny("%s may not %s every key under prefix %q", who, v, k)
		}
		if !prefix && !g.Key(v, k) {
			return deny("%s may not %s key %q", who, v, k)
		}
		return nil
	}
	clusterAdmin := func(what string) error {
		if !g.ClusterAdmin() {
			return deny("%s may not %s: that takes admin on every namespace (\"*\")", who, what)
		}
		return nil
	}
	switch m := msg.(type) {
	case *tenurev1.OpenSessionRequest:
		if !g.AnyNamespace(auth.Lock) && !g.AnyKey(auth.Write) {
			return nil, deny("%s may not open sessions: it has lock on no namespace and write on no key", who)
		}
		if m.Identity == "" {
			m.Identity = g.DefaultIdentity()
		}
		if !g.Identity(m.Identity) {
			return nil, deny("%s may not open a session as identity %q", who, m.Identity)
		}
		return nil, nil // the leader counts it (openingSession)
	case *tenurev1.KeepAliveRequest:
		// Heartbeats never enter the log, so no apply-time check backs
		// this one up: the heartbeat itself checks the session's owner,
		// in the same step that reaches the lessor (ownHeartbeat).
		return nil, nil
	case *tenurev1.CloseSessionRequest:
		return nil, s.ownSession(g, m.GetSessionId(), "close", true)
	case *tenurev1.GetSessionRequest, *tenurev1.ListSessionsRequest:
		return nil, nil // the answer is filtered
	case *tenurev1.AcquireRequest:
		if err := namespace(auth.Lock, m.Namespace); err != nil {
			return nil, err
		}
		return nil, s.ownSession(g, m.GetSessionId(), "acquire for", false)
	case *tenurev1.ReleaseRequest:
		if g.ClusterAdmin() {
			return nil, nil // breaking a lock, as Revoke does
		}
		if err := namespace(auth.Lock, m.Namespace); err != nil {
			return nil, err
		}
		return nil, s.ownGrant(g, ns(m.Namespace), m.Name, m.Token, "release", true)
	case *tenurev1.SetValueRequest:
		if err := namespace(auth.Lock, m.Namespace); err != nil {
			return nil, err
		}
		return nil, s.ownGrant(g, ns(m.Namespace), m.Name, m.Token, "set the value of", false)
	case *tenurev1.RevokeRequest:
		return nil, namespace(auth.Admin, m.Namespace)
	case *tenurev1.SetPreferredHolderRequest:
		return nil, namespace(auth.Admin, m.Namespace)
	case *tenurev1.GetLeaseRequest:
		return nil, namespace(auth.Read, m.Namespace)
	case *tenurev1.ValidateRequest:
		return nil, namespace(auth.Validate, m.Namespace)
	case *tenurev1.ListLeasesRequest:
		if m.AllNamespaces {
			return nil, nil // the answer is filtered
		}
		return nil, namespace(auth.Read, m.Namespace)
	case *tenurev1.WatchLeasesRequest:
		if m.AllNamespaces {
			return nil, nil // the events are filtered
		}
		return nil, namespace(auth.Read, m.Namespace)
	case *tenurev1.WatchGrantRequest:
		if g.Namespace(auth.Lock, ns(m.Namespace)) {
			return nil, nil
		}
		return nil, namespace(auth.Read, m.Namespace)
	case *tenurev1.GetRequest:
		return nil, key(auth.Read, m.Key, false)
	case *tenurev1.ValidateKeyRequest:
		return nil, key(auth.Read, m.Key, false)
	case *tenurev1.RangeRequest:
		return nil, key(auth.Read, m.Prefix, true)
	case *tenurev1.WatchRequest:
		return nil, key(auth.Read, m.Key, m.Prefix)
	case *tenurev1.PutRequest:
		if err := key(auth.Write, m.Key, false); err != nil {
			return nil, err
		}
		if m.SessionId != 0 {
			return nil, s.ownSession(g, m.SessionId, "bind a key to", false)
		}
		return nil, nil
	case *tenurev1.DeleteRequest:
		return nil, key(auth.Write, m.Key, m.Prefix)
	case *tenurev1.CompareAndSwapRequest:
		if err := key(auth.Write, m.Key, false); err != nil {
			return nil, err
		}
		if m.SessionId != 0 && !m.Delete {
			return nil, s.ownSession(g, m.SessionId, "bind a key to", false)
		}
		return nil, nil
	case *tenurev1.MembersRequest, *tenurev1.StatusRequest:
		return nil, nil // any principal the policy knows
	case *tenurev1.JoinRequest, *tenurev1.IntroduceRequest:
		return nil, clusterAdmin("change the cluster's members")
	case *tenurev1.RemoveMemberRequest:
		return nil, clusterAdmin("remove members")
	case *tenurev1.TransferLeadershipRequest:
		return nil, clusterAdmin("transfer leadership")
	case *tenurev1.SnapshotRequest:
		return nil, clusterAdmin("take snapshots")
	case *tenurev1.PipelineRequest:
		return nil, nil // each operation is checked when it runs
	}
	// A method added without a rule is refused, not let through.
	return nil, deny("%T has no authorization rule", msg)
}

// ownSession refuses a session the principal may not act for: one whose
// identity the policy does not give it. A cluster admin may break in
// (close a session, release a grant: adminMay) but never act as its
// holder (acquire, heartbeat, set a value). A session this node does not
// know yet (it may be newer than this node's state) is not let through
// as allowed: from cluster version 4 the command goes on and the state
// machine decides when it applies it. Before (a rolling upgrade, when
// replicas would apply it differently) a follower passes it on to the
// leader, and the leader, whose state holds every session a client has
// been told of, refuses it.
func (s *Server) ownSession(g *auth.Grants, id int64, what string, adminMay bool) error {
	if adminMay && g.ClusterAdmin() {
		return nil
	}
	var identity string
	var found, decidedAtApply bool
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		var sess statemachine.Session
		sess, found = m.Session(id)
		identity = sess.Identity
		decidedAtApply = m.ClusterVersion() >= 4
		return nil
	})
	switch {
	case !found && !decidedAtApply && s.leading.Load():
		return deny("%s may not %s session %d: this node does not know it (yet)", g.Principal, what, id)
	case found && !g.Identity(identity):
		return deny("%s may not %s session %d of identity %q", g.Principal, what, id, identity)
	}
	return nil
}

// ownGrant refuses a grant held by a session the principal may not act
// for. An unknown token is treated as ownSession treats an unknown
// session.
func (s *Server) ownGrant(g *auth.Grants, namespace, name string, token int64, what string, adminMay bool) error {
	if adminMay && g.ClusterAdmin() {
		return nil
	}
	var holder string
	var found, decidedAtApply bool
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		decidedAtApply = m.ClusterVersion() >= 4
		l, ok := m.Lease(statemachine.LeaseID{Namespace: namespace, Name: name})
		if !ok {
			return nil
		}
		for _, h := range l.Holders {
			if h.Token == token {
				holder, found = h.Holder, true
			}
		}
		return nil
	})
	switch {
	case !found && !decidedAtApply && s.leading.Load():
		return deny("%s may not %s token %d of %s/%s: this node knows no such grant (yet)", g.Principal, what, token, namespace, name)
	case found && !g.Identity(holder):
		return deny("%s may not %s the grant of %q (token %d)", g.Principal, what, holder, token)
	}
	return nil
}

// ownHeartbeat decides a heartbeat for session id by the caller of ctx,
// on the leader, just before the lessor renews the session. Heartbeats
// stay out of the log, so this is the only check: it reads the session
// as it is now, and the lessor only knows sessions the state already
// holds. known is false for a session the state does not hold (answered
// as expired, as the lessor would); err refuses a session the caller may
// not use, which ends its stream.
func (s *Server) ownHeartbeat(ctx context.Context, id int64) (known bool, err error) {
	var identity string
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		var sess statemachine.Session
		sess, known = m.Session(id)
		identity = sess.Identity
		return nil
	})
	if !known || !s.policyOn() {
		return known, nil
	}
	g, err := s.grants(ctx, false)
	if err != nil || g == nil {
		return known, err
	}
	if !g.Identity(identity) {
		return known, deny("%s may not heartbeat for session %d of identity %q", g.Principal, id, identity)
	}
	return known, nil
}

// actorFor is who the caller of ctx is to the state machine, for a
// command that acts on a session or grant; nil without a policy or for a
// node acting for itself. A caller the policy no longer knows gets an
// actor that may act as nobody.
func (s *Server) actorFor(ctx context.Context) *statemachine.Actor {
	if !s.policyOn() {
		return nil
	}
	c, ok := callerOf(ctx)
	if !ok || c.Peer && c.Principal == "" {
		return nil
	}
	a := &statemachine.Actor{Principal: c.Principal}
	if g, err := s.grants(ctx, false); err == nil && g != nil {
		a.Identities, a.Breaker = g.Identities(), g.ClusterAdmin()
	}
	return a
}

// openingSession, on the leader, counts the sessions of the caller of
// ctx against its policy's sessions, whichever API opens one: it holds
// the principal's Open lock, which the caller unlocks once the session
// is opened or refused. nil, nil without a policy or limit.
func (s *Server) openingSession(ctx context.Context) (unlock func(), err error) {
	if !s.policyOn() {
		return nil, nil
	}
	g, err := s.grants(ctx, false)
	if err != nil || g == nil {
		return nil, err
	}
	return s.sessionQuota(g)
}

// sessionQuota holds the principal's Open lock while the session count
// is checked and the session opened.
func (s *Server) sessionQuota(g *auth.Grants) (func(), error) {
	if g.Limits.Sessions == 0 {
		return nil, nil
	}
	mu, _ := s.auth.opening.LoadOrStore(g.Principal, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	unlock := mu.(*sync.Mutex).Unlock
	n := 0
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		for _, sess := range m.Sessions() {
			if g.Identity(sess.Identity) {
				n++
			}
		}
		return nil
	})
	if n >= g.Limits.Sessions {
		unlock()
		return nil, fmt.Errorf("%w: principal %s has %d sessions open, its limit (sessions in the policy)", statemachine.ErrTooManySessions, g.Principal, n)
	}
	return unlock, nil
}

// filter removes from a list what the caller may not read, and refuses
// a session the caller may not see exactly as a session that does not
// exist, so that Get is no oracle of which IDs are open.
func (s *Server) filter(ctx context.Context, res any) error {
	if !s.policyOn() {
		return nil
	}
	g, err := s.grants(ctx, false)
	if err != nil || g == nil {
		return nil
	}
	switch m := res.(type) {
	case *tenurev1.ListLeasesResponse:
		m.Leases = slices.DeleteFunc(m.Leases, func(l *tenurev1.Lease) bool {
			if l.GetKind() == nativeapi.RecipeKind {
				// Shown to whoever may range over its keys, as etcd's
				// Range of the prefix would.
				return !g.KeyPrefix(auth.Read, string(l.GetKeyPrefix()))
			}
			if l.GetKind() == nativeapi.KubernetesKind {
				// Shown to whoever may read its key, as etcd's Range
				// of it would; its namespace is not a Tenure one.
				return !g.Key(auth.Read, string(l.GetKey()))
			}
			return !g.Namespace(auth.Read, l.GetNamespace())
		})
	case *tenurev1.ListSessionsResponse:
		m.Sessions = slices.DeleteFunc(m.Sessions, func(sess *tenurev1.Session) bool { return !s.showSession(g, sess) })
	case *tenurev1.GetSessionResponse:
		if m.Session != nil && !s.showSession(g, m.Session) {
			return toConnect(nativeapi.SessionNotFound(m.Session.Id))
		}
	}
	return nil
}

// mayRead reports whether the caller of ctx may read key: a write-only
// principal learns nothing of a key's value from a write's answer.
func (s *Server) mayRead(ctx context.Context, key string) bool {
	if !s.policyOn() {
		return true
	}
	g, err := s.grants(ctx, false)
	return err == nil && (g == nil || g.Key(auth.Read, key))
}

// showSession reports whether g may see sess, and trims it to what g may
// read: its own sessions whole; others' only where they hold or wait in
// namespaces g reads, and only those leases.
func (s *Server) showSession(g *auth.Grants, sess *tenurev1.Session) bool {
	if g.Identity(sess.Identity) || g.AllNamespaces(auth.Read) {
		return true
	}
	readable := func(l string) bool {
		n, err := api.ParseLeaseName(l)
		return err == nil && g.Namespace(auth.Read, n.Namespace)
	}
	sess.Leases = slices.DeleteFunc(sess.Leases, func(l string) bool { return !readable(l) })
	sess.Waiting = slices.DeleteFunc(sess.Waiting, func(l string) bool { return !readable(l) })
	return len(sess.Leases)+len(sess.Waiting) > 0
}

// readable returns the filter of events the caller of ctx may read under
// the policy in force at each event, or nil to send everything.
// The credential is checked again at each event, and so is reads (nil:
// nothing more), the watch's own scope: an error ends the stream.
func (s *Server) readable(ctx context.Context, reads func(*auth.Grants) bool) func(*statemachine.Event) (bool, error) {
	if !s.policyOn() {
		return nil
	}
	c, _ := callerOf(ctx)
	if c.Peer && c.Principal == "" {
		return nil
	}
	return func(e *statemachine.Event) (bool, error) {
		if err := s.auth.authn.Recheck(c); err != nil {
			return false, toConnect(fmt.Errorf("%w: %v", errUnauthenticated, err))
		}
		g := s.auth.authn.Policy.Policy().For(c.Principal)
		if reads != nil && !reads(g) {
			return false, toConnect(deny("%s may no longer read what this watch follows", c.Principal))
		}
		if e.KV != nil {
			return g.Key(auth.Read, e.KV.Key), nil
		}
		if e.Lease.Namespace != "" {
			return g.Namespace(auth.Read, e.Lease.Namespace) || g.Namespace(auth.Lock, e.Lease.Namespace), nil
		}
		return g.AllNamespaces(auth.Read), nil
	}
}

// refusedAtApply reports whether err is the state machine's refusal of a
// command whose caller does not own the session or grant it names: the
// edge let it through as a fast path, so the audit line is written when
// it comes back.
func refusedAtApply(err error) bool { return errors.Is(err, statemachine.ErrNotOwner) }

// audited are the administrative calls written to the audit log
// whatever their outcome.
var audited = map[string]bool{
	tenurev1connect.LeaseServiceRevokeProcedure:               true,
	tenurev1connect.LeaseServiceSetPreferredHolderProcedure:   true,
	tenurev1connect.ClusterServiceJoinProcedure:               true,
	tenurev1connect.ClusterServiceRemoveMemberProcedure:       true,
	tenurev1connect.ClusterServiceTransferLeadershipProcedure: true,
	tenurev1connect.ClusterServiceSnapshotProcedure:           true,
}

// record writes one audit entry for the call of ctx. remote "" takes the
// address a pipeline put on ctx.
func (s *Server) record(ctx context.Context, action string, msg any, remote string, err error) {
	if !s.policyOn() {
		return
	}
	s.audit(ctx, action, target(msg), remote, err)
}

// audit writes one audit entry for the caller of ctx: its action on
// target and the outcome, err (nil: allowed; a refusal of the caller:
// denied; anything else: failed). remote "" takes the address on ctx.
func (s *Server) audit(ctx context.Context, action, target, remote string, err error) {
	if !s.policyOn() {
		return
	}
	if remote == "" {
		remote = frontend.RemoteOf(ctx)
	}
	c, _ := callerOf(ctx)
	e := auth.Entry{Principal: c.Principal, Action: action, Target: target, Outcome: "allowed", Remote: remote}
	if c.Peer && c.Principal == "" {
		e.Principal = "(node)"
	}
	code := connect.CodeOf(err)
	switch {
	case err == nil:
	case errors.Is(err, errUnauthenticated), errors.Is(err, errPermissionDenied), errors.Is(err, errRateLimited),
		errors.Is(err, statemachine.ErrNotOwner),
		code == connect.CodeUnauthenticated, code == connect.CodePermissionDenied,
		nativeapi.ReasonOf(err) == api.ReasonRateLimited:
		e.Outcome, e.Reason = "denied", err.Error()
	case err != nil:
		e.Outcome, e.Reason = "failed", err.Error()
	}
	s.auth.audit.Record(ctx, e)
}

// target names what a request acts on, for the audit log.
func target(msg any) string {
	switch m := msg.(type) {
	case interface {
		GetNamespace() string
		GetName() string
	}:
		return api.NewLeaseName(m.GetNamespace(), m.GetName()).String()
	case interface{ GetKey() string }:
		return m.GetKey()
	case interface{ GetPrefix() string }:
		return m.GetPrefix()
	case interface{ GetSessionId() int64 }:
		return "session " + strconv.FormatInt(m.GetSessionId(), 10)
	case interface{ GetId() string }:
		return m.GetId()
	case interface{ GetNodeId() string }:
		return m.GetNodeId()
	case *tenurev1.OpenSessionRequest:
		return m.GetIdentity()
	}
	return ""
}

// authInterceptor checks unary calls and each message of a stream.
type authInterceptor struct{ s *Server }

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !a.s.policyOn() {
			return next(ctx, req)
		}
		procedure := req.Spec().Procedure
		// A refusal at apply is audited where it comes back (frontNode's
		// Propose), under this name.
		ctx = frontend.WithAction(ctx, procedure)
		done, err := a.s.check(ctx, req.Any())
		if err != nil {
			err = toConnect(err)
			a.s.record(ctx, procedure, req.Any(), req.Peer().Addr, err)
			return nil, err
		}
		if done != nil {
			defer done()
		}
		res, err := next(ctx, req)
		if audited[procedure] && !refusedAtApply(err) {
			a.s.record(ctx, procedure, req.Any(), req.Peer().Addr, err)
		}
		if err == nil {
			if err := a.s.filter(ctx, res.Any()); err != nil {
				return nil, err
			}
		}
		return res, err
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !a.s.policyOn() {
			return next(ctx, conn)
		}
		if _, err := a.s.grants(ctx, false); err != nil {
			err = toConnect(err)
			a.s.record(ctx, conn.Spec().Procedure, nil, conn.Peer().Addr, err)
			return err
		}
		return next(ctx, &checkedConn{StreamingHandlerConn: conn, s: a.s, ctx: ctx})
	}
}

// checkedConn checks every message a stream receives: a watch's request,
// each heartbeat, a snapshot's, the credential of each pipelined
// operation's message (pipeline.handle ends the pipeline when it fails;
// dispatch checks the operation itself). Nothing is remembered from one
// message to the next: a heartbeat for an ID that was unknown, or a
// credential that was valid, proves nothing about the next one.
type checkedConn struct {
	connect.StreamingHandlerConn
	s   *Server
	ctx context.Context
}

func (c *checkedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if _, ok := msg.(*tenurev1.PipelineRequest); ok {
		return nil
	}
	procedure := c.Spec().Procedure
	if _, err := c.s.check(c.ctx, msg); err != nil {
		err = toConnect(err)
		c.s.record(c.ctx, procedure, msg, c.Peer().Addr, err)
		return err
	}
	if audited[procedure] {
		c.s.record(c.ctx, procedure, msg, c.Peer().Addr, nil)
	}
	return nil
}
