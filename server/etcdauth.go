package server

import (
	"context"
	"crypto/x509"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/frontend"
)

// Authorization of the etcd API. With a policy, every etcd call is
// authenticated by the interceptors below, before the call is forwarded
// or served, and its caller put on the context exactly as the native
// API's is (withCaller), so that grants, actorFor and the audit log
// treat both APIs alike. The caller is, in order: a node (peer
// certificate, speaking for the principal its metadata names), the
// "token" metadata (an etcd token from Authenticate, or a Tenure token),
// a client certificate (its CN, as etcd names the user). Each key range
// a call touches is then checked by etcdAuthorize, which the etcd
// services call through the Backend.
//
// As etcd 3.5 does when auth is enabled, a call without credentials is
// refused with "user name is empty" and one whose token does not work
// with "invalid auth token" (clients log in again on it), except
// Authenticate itself; Status, MemberList and Alarm GET need an
// authenticated caller (etcd's requireAuthInfo), and the calls etcd
// keeps for its root user need admin on every namespace. Credentials
// are checked again on every message a stream receives or sends, as on
// the native API, so a revoked token or a changed password ends the
// streams it opened.

// etcdOpenMethods need no credentials.
var etcdOpenMethods = map[string]bool{
	"/etcdserverpb.Auth/Authenticate": true,
}

// etcdAdminMethods are those etcd 3.5 keeps for its root user
// (apply_auth.go needAdminPermission, v3rpc authMaintenanceServer);
// Alarm's ACTIVATE and DEACTIVATE are too (etcdNeedsAdmin).
var etcdAdminMethods = map[string]bool{
	"/etcdserverpb.Auth/AuthEnable":           true,
	"/etcdserverpb.Auth/AuthDisable":          true,
	"/etcdserverpb.Auth/AuthStatus":           true,
	"/etcdserverpb.Auth/UserAdd":              true,
	"/etcdserverpb.Auth/UserDelete":           true,
	"/etcdserverpb.Auth/UserChangePassword":   true,
	"/etcdserverpb.Auth/UserGrantRole":        true,
	"/etcdserverpb.Auth/UserRevokeRole":       true,
	"/etcdserverpb.Auth/UserList":             true,
	"/etcdserverpb.Auth/UserGet":              true, // etcd lets a user read itself
	"/etcdserverpb.Auth/RoleGet":              true, // and its own roles
	"/etcdserverpb.Auth/RoleAdd":              true,
	"/etcdserverpb.Auth/RoleDelete":           true,
	"/etcdserverpb.Auth/RoleGrantPermission":  true,
	"/etcdserverpb.Auth/RoleRevokePermission": true,
	"/etcdserverpb.Auth/RoleList":             true,
	"/etcdserverpb.Maintenance/Defragment":    true,
	"/etcdserverpb.Maintenance/Hash":          true,
	"/etcdserverpb.Maintenance/HashKV":        true,
	"/etcdserverpb.Maintenance/Snapshot":      true,
	"/etcdserverpb.Maintenance/MoveLeader":    true,
	"/etcdserverpb.Maintenance/Downgrade":     true,
	// etcd's checkMembershipOperationPermission.
	"/etcdserverpb.Cluster/MemberAdd":     true,
	"/etcdserverpb.Cluster/MemberRemove":  true,
	"/etcdserverpb.Cluster/MemberUpdate":  true,
	"/etcdserverpb.Cluster/MemberPromote": true,
}

func etcdNeedsAdmin(method string, req any) bool {
	if a, ok := req.(*pb.AlarmRequest); ok && a.Action != pb.AlarmRequest_GET {
		return true
	}
	return etcdAdminMethods[method]
}

// etcdUnaryAuth authenticates each unary call and checks that its
// caller may make it at all; the key ranges are checked by the service.
func (s *Server) etcdUnaryAuth() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !s.policyOn() {
			return handler(ctx, req)
		}
		ctx, err := s.etcdAdmit(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// etcdStreamAuth authenticates each stream when it opens, and checks
// its credential again on every message it receives or sends.
func (s *Server) etcdStreamAuth() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !s.policyOn() {
			return handler(srv, ss)
		}
		ctx, err := s.etcdAdmit(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &etcdCheckedStream{ServerStream: ss, s: s, ctx: ctx, method: info.FullMethod})
	}
}

// etcdAdmit puts the caller of an etcd call on its context and refuses
// the call when the caller may not make it: unauthenticated, unknown to
// the policy, over its rate, or not an admin for an admin's call. The
// refusal is audited.
func (s *Server) etcdAdmit(ctx context.Context, method string, req any) (context.Context, error) {
	ctx = s.etcdCaller(ctx)
	if etcdOpenMethods[method] {
		return ctx, nil
	}
	g, err := s.grants(ctx, true)
	if err != nil {
		return ctx, s.etcdRefuse(ctx, method, "", err)
	}
	if g != nil && etcdNeedsAdmin(method, req) && !g.ClusterAdmin() {
		return ctx, s.etcdRefuse(ctx, method, "", deny("%s may not call %s: etcd keeps it for its root user, Tenure for admin on every namespace (\"*\")", g.Principal, method))
	}
	return ctx, nil
}

// etcdCaller authenticates the caller of an etcd call and returns ctx
// with it, its address, and without the forwarded-principal metadata,
// so that nothing downstream can take a caller's claim for a node's.
func (s *Server) etcdCaller(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	forwardedFor := first(etcdPrincipalKey)
	if forwardedFor != "" {
		md = md.Copy()
		md.Delete(etcdPrincipalKey)
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	var chain []*x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			chain = ti.State.PeerCertificates
		}
		switch p.Addr.(type) {
		case nil:
		case gatewayAddr:
			// The JSON gateway's call: its HTTP client's address.
			ctx = frontend.WithRemote(ctx, first(etcdapi.GatewayRemoteKey))
		default:
			ctx = frontend.WithRemote(ctx, p.Addr.String())
		}
	}
	// etcd 3.5 takes the token from "authorization" when "token" is
	// not set, without a "Bearer " before it (auth/store.go
	// AuthInfoFromCtx): etcd's JSON gateway passes its clients'
	// Authorization header so.
	token := first(rpctypes.TokenFieldNameGRPC)
	if _, ok := md[rpctypes.TokenFieldNameGRPC]; !ok {
		token = first(rpctypes.TokenFieldNameSwagger)
	}
	token = strings.TrimPrefix(token, "Bearer ")
	c := s.auth.authn.AuthenticateEtcd(chain, forwardedFor, token)
	return withCaller(ctx, c)
}

// etcdRefuse audits a refusal of the caller of ctx, for why, and
// returns the error etcd answers for it (frontNode's refusal, in etcd's
// words): "user name is empty" without credentials, "invalid auth
// token" for a token that does not work (now or any more), "too many
// requests" over the principal's rate, "permission denied" for the rest.
func (s *Server) etcdRefuse(ctx context.Context, method, target string, why error) error {
	s.audit(ctx, method, target, "", why)
	return etcdapi.ToGRPC(s.refusal(ctx, why))
}

// etcdCheckedStream checks the credential of its stream's caller on
// every message, as checkedConn does on the native API: a token that
// expired, left the policy or lost its password, or a certificate past
// its NotAfter, ends the stream with etcd's error for it. A message
// received counts against the caller's rate.
type etcdCheckedStream struct {
	grpc.ServerStream
	s      *Server
	ctx    context.Context
	method string
}

func (e *etcdCheckedStream) Context() context.Context { return e.ctx }

func (e *etcdCheckedStream) RecvMsg(m any) error {
	if err := e.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if _, err := e.s.grants(e.ctx, true); err != nil {
		return e.s.etcdRefuse(e.ctx, e.method, "", err)
	}
	return nil
}

func (e *etcdCheckedStream) SendMsg(m any) error {
	if _, err := e.s.grants(e.ctx, false); err != nil {
		return e.s.etcdRefuse(e.ctx, e.method, "", err)
	}
	return e.ServerStream.SendMsg(m)
}

// etcdAuthenticate checks an etcd user's password against the policy in
// force and returns its token (auth.Policy.EtcdAuthenticate): etcd's
// "authentication failed" for a wrong name or password, audited, and
// "authentication is not enabled" without a policy.
func (s *Server) etcdAuthenticate(ctx context.Context, name, password string) (string, error) {
	if !s.policyOn() {
		return "", rpctypes.ErrGRPCAuthNotEnabled
	}
	token, err := s.auth.authn.EtcdAuthenticate(name, password)
	if err != nil {
		s.auth.audit.Record(ctx, auth.Entry{Action: "/etcdserverpb.Auth/Authenticate", Target: name, Outcome: "denied", Reason: err.Error(), Remote: frontend.RemoteOf(ctx)})
		return "", rpctypes.ErrGRPCAuthFailed
	}
	return token, nil
}

// etcdIdentity is the holder identity of a lease the caller of ctx
// grants: the principal's default identity, as a native session opened
// without one gets; "etcd" without a policy or for a node acting for
// itself.
func (s *Server) etcdIdentity(ctx context.Context) string {
	if !s.policyOn() {
		return "etcd"
	}
	c, ok := callerOf(ctx)
	if !ok || c.Err != nil || c.Principal == "" {
		return "etcd"
	}
	return s.auth.authn.Policy.Policy().For(c.Principal).DefaultIdentity()
}
