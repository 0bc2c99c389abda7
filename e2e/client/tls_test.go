package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// tlsServer starts a single node serving its API over TLS only, with
// the certificates of `tenure certs init`, and returns its address and
// the certificates' directory.
func tlsServer(t *testing.T, clientCA bool) (addr, dir string) {
	t.Helper()
	dir = t.TempDir()
	if err := certs.Init(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	ca := ""
	if clientCA {
		ca = filepath.Join(dir, "client-ca.pem")
	}
	cfg, err := certs.ServerConfig(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), ca, "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Open(server.Config{
		Listener: testnet.Listen(t),
		TLS:      cfg,
		Limits:   testserver.Limits(),
		Logger:   slog.New(slog.DiscardHandler),
		Raft: raftnode.Config{
			DataDir:   t.TempDir(),
			PeerAddr:  testnet.Free(t),
			Bootstrap: true,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Addr(), dir
}

func tlsClient(t *testing.T, addr, dir string, withCert bool) *client.Client {
	t.Helper()
	cert, key := "", ""
	if withCert {
		cert, key = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	}
	cfg, err := certs.ClientConfig(filepath.Join(dir, "ca.pem"), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(context.Background(), []string{addr}, client.WithTLS(cfg),
		client.WithRetry(2, 10*time.Millisecond), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTLSServesEveryPathOfTheGoClient: over TLS, a session heartbeats,
// a lock is taken and released (pipelined, over the upgraded TLS
// connection), keys are written and read, and a lease watch streams.
func TestTLSServesEveryPathOfTheGoClient(t *testing.T) {
	addr, dir := tlsServer(t, false)
	c := tlsClient(t, addr, dir, false)
	if got := c.Endpoints()[0]; got != "https://"+addr {
		t.Fatalf("endpoint: got = %s, expected: https://%s (no scheme given, TLS configured)", got, addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, client.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	events := c.WatchLeases(ctx, client.ListOptions{}, 0)
	m := s.Mutex("tls-job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Err != nil || ev.Name != "tls-job" {
		t.Fatalf("lease watch over TLS: got = %+v, expected: an event on tls-job", ev)
	}
	// Heartbeats over TLS keep the session past its TTL.
	time.Sleep(4 * time.Second)
	if !s.Valid() || !m.Valid() {
		t.Fatalf("after a TTL over TLS: session valid %v, lock valid %v, expected: both valid", s.Valid(), m.Valid())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The grant was watched on the pipeline: WatchGrant exists only there,
	// so the upgrade worked over TLS rather than falling back to unary.
	tc, err := certs.ClientConfig(filepath.Join(dir, "ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `method="/tenure.v1.LeaseService/WatchGrant"`) {
		t.Errorf("metrics over TLS: got = no WatchGrant requests, expected: the lock's grant watched on the pipeline")
	}
	if _, err := c.KV().Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if kv, err := c.KV().Get(ctx, "k"); err != nil || kv.Value != "v" {
		t.Fatalf("get over TLS: got = %+v, %v, expected: v", kv, err)
	}
}

// TestTLSRefusesWhatItShould: a client that does not trust the server's
// CA gets a certificate error and nothing else; cleartext is not served
// on a TLS port; with a client CA, a client without a certificate is
// refused and one with the CA's client certificate is served.
func TestTLSRefusesWhatItShould(t *testing.T) {
	addr, dir := tlsServer(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	untrusting, err := client.New(ctx, []string{addr}, client.WithTLS(&tls.Config{}), client.WithRetry(1, time.Millisecond),
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer untrusting.Close()
	_, err = untrusting.KV().Put(ctx, "k", "v")
	var unknownCA x509.UnknownAuthorityError
	if err == nil || !errors.As(err, &unknownCA) {
		t.Errorf("a client without the CA: got = %v, expected: an unknown-authority certificate error", err)
	}

	resp, err := http.Get("http://" + addr + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("cleartext on the TLS port: got = %s, expected: no answer in cleartext", resp.Status)
		}
	}

	if _, err := tlsClient(t, addr, dir, false).KV().Put(ctx, "k", "v"); err == nil {
		t.Error("a client without a certificate, client CA required: got = served, expected: refused")
	}
	if _, err := tlsClient(t, addr, dir, true).KV().Put(ctx, "k", "v"); err != nil {
		t.Errorf("a client with the CA's client certificate: got = %v, expected: served", err)
	}
}
