package frontend

import "context"

// The caller's address travels on the context for the audit log: the
// HTTP edge puts the request's there, an etcd stream its peer's, and a
// pipelined operation, which runs long after the request that carried
// its connection, the connection's.

type remoteKey struct{}

// WithRemote is ctx carrying the caller's network address.
func WithRemote(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, remoteKey{}, addr)
}

// RemoteOf is the address WithRemote put on ctx, or "".
func RemoteOf(ctx context.Context) string {
	addr, _ := ctx.Value(remoteKey{}).(string)
	return addr
}

// actionKey carries the name of the call a context is for, when the API
// does not name it itself (gRPC's methods are on the context already).
type actionKey struct{}

// WithAction is ctx naming its call, action (a procedure, a method), for
// the audit lines the node writes of it.
func WithAction(ctx context.Context, action string) context.Context {
	return context.WithValue(ctx, actionKey{}, action)
}

// ActionOf is the action WithAction put on ctx.
func ActionOf(ctx context.Context) (string, bool) {
	a, ok := ctx.Value(actionKey{}).(string)
	return a, ok
}
