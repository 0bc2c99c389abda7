package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/certs"
)

const clusterPolicy = `
metrics: open
principals:
  - name: admin
    roles: [admin]
    tokens: [{sha256: "%s"}]
  - name: team-a
    roles: [team-a]
    tokens: [{sha256: "%s"}]
  - name: team-b
    roles: [%s]
roles:
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
  team-a:
    - namespaces: [team-a]
      verbs: [read, lock]
    - keys: [team-a/]
      verbs: [read, write]
  team-b:
    - namespaces: [team-b]
      verbs: [read, lock]
    - keys: [team-b/]
      verbs: [read, write]
`

// TestSecureClusterAuthorizesThroughAnyNode: three `tenure serve`
// processes with API TLS, peer TLS and a policy (the setup of
// docs/security.md). Clients that know only a follower — team-a by
// token, team-b by client certificate — are authorized as themselves
// on the leader their calls are forwarded to: each may write its own
// keys and lock in its own namespace, and neither the other's. An admin
// revokes through a follower, and the leader's audit log says so. A
// changed policy, announced by SIGHUP, applies on every node without a
// restart.
func TestSecureClusterAuthorizesThroughAnyNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	bin := tenureBinary(t)
	dir := t.TempDir()
	f := func(name string) string { return filepath.Join(dir, name) }
	if err := certs.Init(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := certs.Client(dir, "team-b", "team-b", certs.Options{}); err != nil {
		t.Fatal(err)
	}
	adminToken, teamAToken := auth.NewToken(), auth.NewToken()
	writePolicy := func(teamBRoles string) {
		body := fmt.Sprintf(clusterPolicy, auth.HashToken(adminToken), auth.HashToken(teamAToken), teamBRoles)
		if err := os.WriteFile(f("policy.yaml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writePolicy("team-b")
	nodes := newClusterNodes(t, bin, 3)
	for i, n := range nodes {
		n.args = append(n.args,
			"--cert-file", f("server.pem"), "--key-file", f("server-key.pem"), "--client-ca-file", f("client-ca.pem"),
			"--peer-cert-file", f("peer.pem"), "--peer-key-file", f("peer-key.pem"), "--peer-ca-file", f("ca.pem"),
			"--policy", f("policy.yaml"), "--audit-log", f(fmt.Sprintf("audit%d.log", i+1)))
		n.start()
	}
	t.Setenv("TENURE_CACERT", f("ca.pem"))
	t.Setenv("TENURE_TOKEN", adminToken)
	eps := endpointsOf(nodes)
	ms, leader := settled(t, bin, eps, 3, 0, 30*time.Second)
	var follower string
	for _, m := range ms {
		if m.ID != leader {
			follower = m.APIAddress
			break
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	newClient := func(opts ...client.Option) *client.Client {
		cfg, err := certs.ClientConfig(f("ca.pem"), "", "")
		if err != nil {
			t.Fatal(err)
		}
		opts = append([]client.Option{client.WithTLS(cfg), client.WithRetry(20, 100*time.Millisecond),
			client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
		c, err := client.New(ctx, []string{follower}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := newClient(client.WithToken(teamAToken))
	bCfg, err := certs.ClientConfig(f("ca.pem"), f("team-b.pem"), f("team-b-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	b := newClient(client.WithTLS(bCfg))

	if _, err := a.KV().Put(ctx, "team-a/config", "a"); err != nil {
		t.Errorf("team-a puts its key through a follower: %v", err)
	}
	if _, err := b.KV().Put(ctx, "team-b/config", "b"); err != nil {
		t.Errorf("team-b (by certificate) puts its key through a follower: %v", err)
	}
	if _, err := b.KV().Put(ctx, "team-a/config", "b was here"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("team-b puts team-a's key: got = %v, expected: ErrPermissionDenied", err)
	}
	sa, err := a.NewSession(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close(context.Background())
	if err := sa.Mutex("deploy", client.WithNamespace("team-a")).TryLock(ctx); err != nil {
		t.Errorf("team-a locks in its namespace: %v", err)
	}
	sb, err := b.NewSession(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	if sb.Identity() != "team-b" {
		t.Errorf("team-b's session identity: got = %q, expected: its certificate's CN", sb.Identity())
	}
	if err := sb.Mutex("deploy", client.WithNamespace("team-a")).TryLock(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("team-b locks in team-a's namespace: got = %v, expected: ErrPermissionDenied", err)
	}
	if kv, err := a.KV().Get(ctx, "team-a/config"); err != nil || kv.Value != "a" {
		t.Errorf("team-a's key after team-b's attempt: got = %+v, %v, expected: a", kv, err)
	}

	// An admin's revoke through a follower is audited by the leader.
	if out, errOut, code := tenureRun(t, bin, "--endpoints", follower, "-n", "team-a", "revoke", "deploy", "--reason", "e2e"); code != 0 {
		t.Errorf("admin revoke: exit %d: %s%s", code, out, errOut)
	}
	leaderNode := nodeByID(t, nodes, leader)
	waitFor(t, 10*time.Second, "the revoke in the leader's audit log", func() bool {
		log, _ := os.ReadFile(f("audit" + strings.TrimPrefix(leaderNode.id, "node") + ".log"))
		return strings.Contains(string(log), `"action":"/tenure.v1.LeaseService/Revoke","target":"team-a/deploy","outcome":"allowed"`) &&
			strings.Contains(string(log), `"principal":"admin"`)
	})

	// team-b joins team-a; SIGHUP tells every node.
	writePolicy("team-b, team-a")
	for _, n := range nodes {
		if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "team-b to be let into team-a's keys", func() bool {
		_, err := b.KV().Put(ctx, "team-a/config", "b, now allowed")
		return err == nil
	})
	for _, n := range nodes {
		if log, _ := os.ReadFile(n.logPath); strings.Contains(string(log), teamAToken) || strings.Contains(string(log), adminToken) {
			t.Errorf("%s's log holds a token", n.id)
		}
	}
}

// TestServeRefusesToExposeItselfUnprotected: serve will not listen beyond
// loopback without TLS and a policy, nor take raft traffic from beyond
// it without peer TLS, unless told --insecure, and each refusal names
// what to add. A policy on a cluster node needs TLS both ways, and a
// client CA that is not the peer CA.
func TestServeRefusesToExposeItselfUnprotected(t *testing.T) {
	e := newCLIEnv(t)
	if r := e.run("certs", "init", "certs"); r.code != 0 {
		t.Fatal(r)
	}
	if r := e.run("auth", "token", "admin"); r.code != 0 {
		t.Fatal(r)
	} else {
		tok := strings.SplitN(r.stdout, "\n", 2)[0]
		if err := os.WriteFile(e.path("policy.yaml"), []byte(fmt.Sprintf("principals:\n  - name: admin\n    roles: [admin]\n    tokens: [{sha256: %q}]\nroles:\n  admin:\n    - namespaces: [\"*\"]\n      verbs: [admin]\n", auth.HashToken(tok))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsFlags := []string{"--cert-file", "certs/server.pem", "--key-file", "certs/server-key.pem"}
	peerFlags := []string{"--peer-cert-file", "certs/peer.pem", "--peer-key-file", "certs/peer-key.pem", "--peer-ca-file", "certs/ca.pem"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a public API in the clear", []string{"--listen", "0.0.0.0:1", "--advertise", "10.0.0.5:1"}, "--insecure"},
		{"a public API with TLS but no policy", append([]string{"--listen", "0.0.0.0:1", "--advertise", "10.0.0.5:1"}, tlsFlags...), "--policy"},
		{"a public peer port without peer TLS", []string{"--peer-listen", "0.0.0.0:1", "--peer-advertise", "10.0.0.5:1"}, "--insecure"},
		{"a policy on a cluster node without TLS", []string{"--policy", "policy.yaml", "--join", "127.0.0.1:1"}, "needs --cert-file and the --peer-* flags"},
		{"a client CA that is the peer CA", append(append([]string{"--policy", "policy.yaml", "--client-ca-file", "certs/ca.pem"}, tlsFlags...), peerFlags...), "share a CA"},
		{"a policy that does not parse", []string{"--policy", "certs/ca.pem"}, "--policy"},
	} {
		r := e.run(append([]string{"serve", "--data-dir", "data"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: got = %v, expected: exit 2 naming %s", c.name, r, c.want)
		}
	}
	if r := e.run("auth", "check", "policy.yaml"); r.code != 0 {
		t.Errorf("auth check of a valid policy: got = %v, expected: exit 0", r)
	}
	if r := e.run("auth", "check", "certs/ca.pem"); r.code != 2 || !strings.Contains(r.stderr, "invalid policy") {
		t.Errorf("auth check of a PEM file: got = %v, expected: exit 2, invalid policy", r)
	}
}
