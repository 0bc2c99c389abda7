package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/testnet"
)

// TestTLSInThreeCommands runs the README's TLS set-up with the real
// binary: certs init, serve with a certificate and a client CA, and the
// CLI with the CA and the client certificate. A client without a
// certificate, or one that does not trust the CA, is refused, and the
// refusal says why.
func TestTLSInThreeCommands(t *testing.T) {
	e := newCLIEnv(t)
	if r := e.run("certs", "init", "certs"); r.code != 0 || !strings.Contains(r.stdout, "certs/server.pem") {
		t.Fatalf("certs init: got = %v, expected: exit 0 and the files listed", r)
	}
	if r := e.run("certs", "init", "certs"); r.code != 2 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("certs init again: got = %v, expected: exit 2, already exists", r)
	}
	free := testnet.FreeN(t, 2)
	api := free[0]
	srv := e.start("serve", "--listen", api, "--peer-listen", free[1], "--data-dir", "data",
		"--cert-file", "certs/server.pem", "--key-file", "certs/server-key.pem", "--client-ca-file", "certs/client-ca.pem")
	tlsFlags := []string{"--cacert", "certs/ca.pem", "--cert", "certs/client.pem", "--key", "certs/client-key.pem"}
	var r result
	waitFor(t, 20*time.Second, "the TLS server to take a put", func() bool {
		if srv.exited() {
			t.Fatalf("serve exited: stdout %q, stderr %q", srv.stdout, srv.stderr)
		}
		r = e.runAt(api, append(tlsFlags, "kv", "put", "k", "over-tls")...)
		return r.code == 0
	})
	if r := e.runAt(api, append(tlsFlags, "kv", "get", "k")...); r.code != 0 || !strings.Contains(r.stdout, "over-tls") {
		t.Errorf("kv get over TLS: got = %v, expected: exit 0 and over-tls", r)
	}
	// The server answered: a refused credential is exit 1, a TLS flag
	// that does not fit the server exit 2, each saying what to pass.
	if r := e.runAt("https://"+api, "--cacert", "certs/ca.pem", "kv", "get", "k"); r.code != 1 || !strings.Contains(r.stderr, "--cert and --key") {
		t.Errorf("without a client certificate: got = %v, expected: exit 1 asking for --cert and --key", r)
	}
	if r := e.runAt("https://"+api, "kv", "get", "k"); r.code != 2 || !strings.Contains(r.stderr, "--cacert") {
		t.Errorf("without the CA: got = %v, expected: exit 2 asking for --cacert", r)
	}
	if r := e.runAt(api, "--cert", "certs/client.pem", "kv", "get", "k"); r.code != 2 || !strings.Contains(r.stderr, "--key") {
		t.Errorf("--cert without --key: got = %v, expected: exit 2 naming --key", r)
	}
	if r := e.run("serve", "--data-dir", "data2", "--cert-file", "certs/server.pem", "--key-file", "certs/server-key.pem", "--join", "127.0.0.1:1"); r.code != 2 || !strings.Contains(r.stderr, "needs --peer-cert-file") {
		t.Errorf("a TLS API with --join but no peer certificate: got = %v, expected: exit 2 naming --peer-cert-file", r)
	}
	if r := e.run("serve", "--data-dir", "data3", "--peer-cert-file", "certs/peer.pem"); r.code != 2 || !strings.Contains(r.stderr, "give all three") {
		t.Errorf("--peer-cert-file alone: got = %v, expected: exit 2, the three peer flags go together", r)
	}
}
