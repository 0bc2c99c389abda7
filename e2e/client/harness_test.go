package client_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
)

// startServer runs a single Tenure node on 127.0.0.1 free ports, with a
// 100ms minimum TTL so loss tests run in a second, and returns its
// endpoint ("127.0.0.1:port").
func startServer(t testing.TB) string {
	t.Helper()
	return testserver.Start(t, testserver.Limits())
}

func newClient(t testing.TB, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), endpoints, client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newSession(t testing.TB, c *client.Client, opts ...client.SessionOption) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// tokenOf is g's fencing token number, 0 when nothing is held.
func tokenOf(g interface{ Token() (client.Token, bool) }) int64 {
	t, _ := g.Token()
	return t.Token
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
