package testserver

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/raftnode"
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
	srv, err := server.Open(server.Config{
		Listener: ln,
		Limits:   limits,
		Logger:   slog.New(slog.DiscardHandler),
		Auth:     &auth.Authenticator{Policy: auth.Static(policy)},
		Raft: raftnode.Config{
			DataDir:            dir,
			PeerAddr:           "127.0.0.1:0",
			Bootstrap:          true,
			HeartbeatTimeout:   100 * time.Millisecond,
			ElectionTimeout:    100 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond,
		},
	})
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	// Registered after TempDir's cleanup, so it runs first: the node is
	// closed before its directory goes.
	tb.Cleanup(func() { srv.Close() })
	if err := waitReady(srv.Addr()); err != nil {
		tb.Fatal(err)
	}
	return srv.Addr()
}
