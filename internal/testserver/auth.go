package testserver

import (
	"net"
	"testing"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/server"
)

// StartWithPolicy is Start for a server with a policy: policyYAML, as
// auth.Parse reads it, says who may do what, and every call but the page,
// /healthz and /readyz needs a bearer token the policy names. It serves
// plain HTTP on 127.0.0.1, where a token may travel in the clear. The
// node stops when the test ends.
func StartWithPolicy(tb testing.TB, limits server.Limits, policyYAML string) string {
	tb.Helper()
	policy, err := auth.Parse([]byte(policyYAML))
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := open(ln, dir, "127.0.0.1:0", limits, &auth.Authenticator{Policy: auth.Static(policy)})
	if err != nil {
		tb.Fatal(err)
	}
	// Registered after TempDir's cleanup, so it runs first: the node is
	// closed before its directory goes.
	tb.Cleanup(func() { srv.Close() })
	return srv.Addr()
}
