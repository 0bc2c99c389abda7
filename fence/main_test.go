package fence_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// source is a fake Source: a token and whether it is valid.
type source struct {
	mu    sync.Mutex // guards tok and valid
	tok   client.Token
	valid bool
}

func newSource(t client.Token, valid bool) *source { return &source{tok: t, valid: valid} }

func (s *source) set(t client.Token, valid bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tok, s.valid = t, valid
}

func (s *source) Token() (client.Token, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tok, s.valid
}

func tok(ns, name string, n int64) client.Token {
	return client.Token{Namespace: ns, Name: name, Token: n}
}

// closedAddr returns a 127.0.0.1 address where nothing listens: one
// the kernel handed out a moment ago, then closed. (internal/testnet.Free,
// which this module cannot import without taking the server's module into
// its graph.)
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port on 127.0.0.1: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
