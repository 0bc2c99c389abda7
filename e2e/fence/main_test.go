// Package fence_test runs package fence (module
// github.com/tenurehq/tenure/fence) against a real Tenure server:
// Validate asking the server, and a Source following a real grant. They
// live in the core module because they need the server; fence's own
// directory keeps the tests that need none, so that fence's go.mod
// requires only the client and the API.
package fence_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startServer runs a single Tenure node on 127.0.0.1 free ports and
// returns its endpoint, ready for sessions.
func startServer(t testing.TB) string {
	t.Helper()
	return testserver.Start(t, server.DefaultLimits())
}

func newClient(t testing.TB, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), endpoints,
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		client.WithRetry(2, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newSession(t testing.TB, c *client.Client, identity string) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, client.WithTTL(5*time.Second), client.WithIdentity(identity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func tok(ns, name string, n int64) client.Token {
	return client.Token{Namespace: ns, Name: name, Token: n}
}
