package cli

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// tlsNode starts a node serving its API over TLS with cfg, as `tenure
// serve --cert-file ... --client-ca-file` would with the certificates of
// `tenure certs init` in dir, and returns its address once hc finds it
// ready.
func tlsNode(t *testing.T, hc *http.Client, cfg *tls.Config) string {
	t.Helper()
	srv, err := server.Open(server.Config{
		Listener: testnet.Listen(t),
		TLS:      cfg,
		Limits:   testserver.Limits(),
		Logger:   slog.New(slog.DiscardHandler),
		Raft:     raftnode.Config{DataDir: t.TempDir(), PeerAddr: testnet.Free(t), Bootstrap: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := hc.Get("https://" + srv.Addr() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return srv.Addr()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS node not ready after 10s: %v", err)
		}
	}
}

// httpsClient trusts the server's CA and, with a name, presents that
// client certificate: httpsClient(t, dir, "") is curl --cacert ca.pem.
func httpsClient(t *testing.T, dir, cert string) *http.Client {
	t.Helper()
	certFile, keyFile := "", ""
	if cert != "" {
		certFile, keyFile = filepath.Join(dir, cert+".pem"), filepath.Join(dir, cert+"-key.pem")
	}
	cfg, err := certs.ClientConfig(filepath.Join(dir, "ca.pem"), certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func initCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := certs.Init(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTLSMismatchesSayWhatToDo: a TLS server reached without the flags
// it needs answers with what to pass, and with the exit code of what went
// wrong — a missing flag (2) or credentials it did not take (1) — never
// "unreachable" (3), since it answered.
func TestTLSMismatchesSayWhatToDo(t *testing.T) {
	dir := initCerts(t)
	cfg, err := certs.ServerConfig(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "client-ca.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsNode(t, httpsClient(t, dir, ""), cfg)
	pem := func(name string) string { return filepath.Join(dir, name) }
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // parts of stderr
	}{
		{"cleartext to a TLS port", []string{"kv", "get", "k"}, ExitUsage,
			[]string{"Client sent an HTTP request to an HTTPS server", "The server speaks TLS: pass the CA that signed its certificate with --cacert"}},
		{"a CA that did not sign the server's certificate", []string{"--cacert", pem("client-ca.pem"), "kv", "get", "k"}, ExitUsage,
			[]string{"certificate signed by unknown authority", "The server's certificate is not signed by a CA tenure was told to trust: pass the CA that signed it with --cacert"}},
		{"no client certificate", []string{"--cacert", pem("ca.pem"), "kv", "get", "k"}, ExitUnmet,
			[]string{"a client certificate is required", "give the CLI --cert and --key"}},
		{"no client certificate, to lock", []string{"--cacert", pem("ca.pem"), "lock", "x", "--", "true"}, ExitUnmet,
			[]string{"a client certificate is required"}},
	} {
		_, stderr, code := runMain(append([]string{"--endpoints", addr}, tc.args...)...)
		if code != tc.code {
			t.Errorf("%s: exit code got = %d, expected: %d (stderr %q)", tc.name, code, tc.code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: stderr got = %q, expected it to hold %q", tc.name, stderr, w)
			}
		}
	}
	if _, stderr, code := runMain("--endpoints", addr, "--cacert", pem("ca.pem"), "--cert", pem("client.pem"), "--key", pem("client-key.pem"), "kv", "put", "k", "v"); code != ExitOK {
		t.Errorf("with the client certificate: got = exit %d, %q, expected: served", code, stderr)
	}
}

// TestHealthChecksNeedNoClientCertificate: with --client-ca-file and no
// policy, /healthz, /livez and /readyz answer a caller without a client
// certificate (the README's readiness loop, a probe), and every other
// path refuses it with unauthenticated, saying a certificate is needed.
func TestHealthChecksNeedNoClientCertificate(t *testing.T) {
	dir := initCerts(t)
	cfg, err := certs.ServerConfig(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "client-ca.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	hc := httpsClient(t, dir, "")
	addr := tlsNode(t, hc, cfg)
	for _, path := range []string{"/healthz", "/livez", "/readyz"} {
		resp, err := hc.Get("https://" + addr + path)
		if err != nil {
			t.Errorf("GET %s without a client certificate: got = %v, expected: 200", path, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a client certificate: got = %s, expected: 200", path, resp.Status)
		}
	}
	for _, req := range []struct{ method, path string }{
		{http.MethodPost, "/tenure.v1.KVService/Get"}, {http.MethodGet, "/metrics"}, {http.MethodGet, "/v1/watch/leases"}, {http.MethodGet, "/"},
	} {
		r, _ := http.NewRequest(req.method, "https://"+addr+req.path, strings.NewReader("{}"))
		r.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "a client certificate is required") {
			t.Errorf("%s %s without a client certificate: got = %s %q, expected: 401 saying a client certificate is required", req.method, req.path, resp.Status, body)
		}
	}
}

// TestARefusedClientCertificateIsAnAuthFailure: a server that refuses the
// handshake for want of a client certificate (a server that requires
// one in TLS itself) answered: exit 1, as for any refused credential,
// with what to pass, not 3 "unreachable".
func TestARefusedClientCertificateIsAnAuthFailure(t *testing.T) {
	dir := initCerts(t)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "client-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	addr := tlsNode(t, httpsClient(t, dir, "client"), &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		NextProtos:   []string{"h2", "http/1.1"},
	})
	_, stderr, code := runMain("--endpoints", addr, "--cacert", filepath.Join(dir, "ca.pem"), "kv", "get", "k")
	want := "The server did not accept this client's certificate, or wants one: pass --cert and --key"
	if code != ExitUnmet || !strings.Contains(stderr, want) {
		t.Errorf("got = exit %d, stderr %q, expected: exit %d and %q", code, stderr, ExitUnmet, want)
	}
}
