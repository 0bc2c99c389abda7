package client_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// startServer runs a single Tenure node on 127.0.0.1 free ports, with a
// 100ms minimum TTL so loss tests run in a second, and returns its
// endpoint ("127.0.0.1:port").
func startServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limits := server.DefaultLimits()
	limits.MinTTL = 100 * time.Millisecond
	srv, err := server.Open(server.Config{
		Listener: ln,
		Limits:   limits,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Raft: raftnode.Config{
			DataDir:            t.TempDir(),
			PeerAddr:           "127.0.0.1:0",
			Bootstrap:          true,
			HeartbeatTimeout:   100 * time.Millisecond,
			ElectionTimeout:    100 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := client.New(context.Background(), []string{srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Ready when a session can be opened.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := c.NewSession(ctx, client.WithTTL(2*time.Second))
		cancel()
		if err == nil {
			s.Close(context.Background())
			return srv.Addr()
		}
		if time.Now().After(deadline) {
			t.Fatalf("server at %s not ready: %v", srv.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
