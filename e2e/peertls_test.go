package e2e

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
)

// TestPeerTLSClusterKeepsOutANodeWithoutItsCA: three `tenure serve`
// processes whose raft traffic is TLS with peer certificates from one CA
// form a cluster and take writes. A fourth node whose peer certificate
// comes from another CA asks to join: it is refused (the leader checks
// its raft port's certificate first), never becomes ready, and the
// cluster stays three members, all serving.
func TestPeerTLSClusterKeepsOutANodeWithoutItsCA(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	bin := tenureBinary(t)
	good, foreign := t.TempDir(), t.TempDir()
	for _, dir := range []string{good, foreign} {
		if err := certs.Init(dir, certs.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	peerFlags := func(dir string) []string {
		return []string{"--peer-cert-file", filepath.Join(dir, "peer.pem"), "--peer-key-file", filepath.Join(dir, "peer-key.pem"), "--peer-ca-file", filepath.Join(dir, "ca.pem")}
	}
	nodes := newClusterNodes(t, bin, 3)
	for _, n := range nodes {
		n.args = append(n.args, peerFlags(good)...)
		n.start()
	}
	eps := endpointsOf(nodes)
	ms, _ := settled(t, bin, eps, 3, 0, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := quietClient(t, ctx, eps)
	if _, err := c.KV().Put(ctx, "k", "over-peer-tls"); err != nil {
		t.Fatal(err)
	}

	free := testnet.FreeN(t, 2)
	intruder := &clusterNode{
		t: t, bin: bin, id: "intruder", api: free[0], peer: free[1],
		dataDir: filepath.Join(t.TempDir(), "intruder"), logPath: filepath.Join(t.TempDir(), "intruder.log"),
		args: append([]string{"--node-id", "intruder", "--join", nodes[0].api}, peerFlags(foreign)...),
	}
	t.Cleanup(intruder.kill)
	intruder.start()
	// Long enough for the intruder's membership loop to ask several
	// times, and the leader to try replicating to it if it had let it in.
	time.Sleep(3 * time.Second)
	after, err := members(t, bin, eps)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(ms) {
		t.Errorf("members after the intruder asked to join: got = %+v, expected: the same %d", after, len(ms))
	}
	for _, m := range after {
		if m.ID == "intruder" {
			t.Errorf("the intruder is a member: %+v", m)
		}
	}
	if log, _ := os.ReadFile(intruder.logPath); !strings.Contains(string(log), "peer CA") {
		t.Errorf("the intruder's log does not say why it was refused (the peer CA):\n%s", log)
	}
	if kv, err := c.KV().Get(ctx, "k"); err != nil || kv.Value != "over-peer-tls" {
		t.Errorf("the cluster after the intruder: got = %+v, %v, expected: still serving k", kv, err)
	}
}

// TestTLSEverywhereOnAThreeNodeCluster: API TLS with client
// certificates required and raft over peer TLS, on three processes. The
// nodes call each other's API with their peer certificates, so the
// cluster forms, `tenure members` (over TLS) lists every member's own
// status, and a Go client given only a follower locks, writes and reads:
// the follower forwards its first call to the leader over TLS, and the
// client follows to the leader's pipeline.
func TestTLSEverywhereOnAThreeNodeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	bin := tenureBinary(t)
	dir := t.TempDir()
	if err := certs.Init(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	nodes := newClusterNodes(t, bin, 3)
	for _, n := range nodes {
		n.args = append(n.args,
			"--cert-file", f("server.pem"), "--key-file", f("server-key.pem"), "--client-ca-file", f("client-ca.pem"),
			"--peer-cert-file", f("peer.pem"), "--peer-key-file", f("peer-key.pem"), "--peer-ca-file", f("ca.pem"))
		n.start()
	}
	// The CLI (members) takes its TLS settings from the environment.
	t.Setenv("TENURE_CACERT", f("ca.pem"))
	t.Setenv("TENURE_CERT", f("client.pem"))
	t.Setenv("TENURE_KEY", f("client-key.pem"))
	eps := endpointsOf(nodes)
	ms, leader := settled(t, bin, eps, 3, 0, 30*time.Second)

	var follower string
	for _, m := range ms {
		if m.ID != leader {
			follower = m.APIAddress
			break
		}
	}
	cfg, err := certs.ClientConfig(f("ca.pem"), f("client.pem"), f("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New(ctx, []string{follower}, client.WithTLS(cfg), client.WithRetry(20, 100*time.Millisecond),
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.KV().Put(ctx, "k", "tls-everywhere"); err != nil {
		t.Fatalf("put through follower %s: %v", follower, err)
	}
	leaderAPI := nodeByID(t, nodes, leader).api
	if got := c.Endpoints()[0]; got != "https://"+leaderAPI {
		t.Errorf("endpoint after the first call: got = %s, expected: the leader https://%s", got, leaderAPI)
	}
	s, err := c.NewSession(ctx, client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	m := s.Mutex("tls-cluster")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if kv, err := c.KV().Get(ctx, "k"); err != nil || kv.Value != "tls-everywhere" {
		t.Errorf("get over TLS: got = %+v, %v, expected: tls-everywhere", kv, err)
	}
}
