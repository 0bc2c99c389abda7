// Package client_test runs the Go client (module
// github.com/tenurehq/tenure/client) against real Tenure servers: single
// nodes, TCP clusters, TLS, restarts and failovers. These tests live in
// the core module because they need the server; were they in client/,
// the client's go.mod would have to require the core, and every program
// importing the client would inherit raft, bolt and the rest in its
// module graph. The client's own directory keeps the tests that need no
// server (scripted fake endpoints, error texts, the validity clock).
package client_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind:
// heartbeat loops, grant monitors, watches and proxy pipes must all end
// once their owners are closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
