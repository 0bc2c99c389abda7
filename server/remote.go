package server

import "context"

// A pipelined operation runs long after the request that carried its
// connection, on a context of its own, so the caller's address travels
// on that context for the audit log: the upgraded connection's and the
// Pipeline stream's peer.

type remoteKey struct{}

func withRemote(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, remoteKey{}, addr)
}

// remoteOf is the address withRemote put on ctx, or "".
func remoteOf(ctx context.Context) string {
	addr, _ := ctx.Value(remoteKey{}).(string)
	return addr
}
