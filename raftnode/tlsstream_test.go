package raftnode

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/certs"
)

// peerTLS is a node's raft TLS configuration from a `tenure certs init`
// directory: its peer certificate, and the directory's CA for both ends.
func peerTLS(t *testing.T, dir string) *tls.Config {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(filepath.Join(dir, "peer.pem"), filepath.Join(dir, "peer-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{Certificates: []tls.Certificate{kp}, RootCAs: pool, ClientCAs: pool, MinVersion: tls.VersionTLS12}
}

func certsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := certs.Init(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPeerTLSKeepsOutANodeFromAnotherCA: three nodes whose raft traffic
// is TLS with certificates from one CA form a cluster and replicate. A
// fourth, with a certificate from another CA, added to the configuration
// all the same, receives nothing (every connection to it fails the
// handshake), and its own requests never reach the others: the leader
// stays, and writes keep committing without it.
func TestPeerTLSKeepsOutANodeFromAnotherCA(t *testing.T) {
	t.Parallel()
	good, foreign := certsDir(t), certsDir(t)
	nodes := make([]*Node, 3)
	for i := range nodes {
		cfg := testConfig(t.TempDir(), "wal")
		cfg.NodeID = fmt.Sprintf("n%d", i+1)
		cfg.Bootstrap = i == 0
		cfg.PeerTLS = peerTLS(t, good)
		// A second, not 50ms: a TLS handshake under the race detector
		// on a busy machine must not cost the leader its quorum while
		// it adds the voters.
		cfg.ElectionTimeout = time.Second
		nodes[i] = openFake(t, cfg, nil)
	}
	leader := nodes[0]
	waitLeader(t, leader)
	for _, f := range nodes[1:] {
		if err := leader.AddVoter(ctxT(t), f.ID(), f.Addr()); err != nil {
			t.Fatalf("add voter over TLS: %v", err)
		}
	}
	put(t, leader, "a", "1")
	waitFor(t, "the followers to apply the write over TLS", func() bool {
		return nodes[1].AppliedIndex() >= leader.AppliedIndex() && nodes[2].AppliedIndex() >= leader.AppliedIndex()
	})

	cfg := testConfig(t.TempDir(), "wal")
	cfg.NodeID = "intruder"
	cfg.Bootstrap = false
	cfg.PeerTLS = peerTLS(t, foreign)
	intruder := openFake(t, cfg, nil)
	if err := leader.AddNonvoter(ctxT(t), intruder.ID(), intruder.Addr()); err != nil {
		t.Fatalf("add the intruder to the configuration: %v", err)
	}
	for i := range 5 {
		put(t, leader, "b", fmt.Sprint(i))
	}
	time.Sleep(500 * time.Millisecond) // ten heartbeats' worth of tries
	if got := intruder.AppliedIndex(); got != 0 {
		t.Errorf("the intruder's applied index: got = %d, expected: 0, nothing reached it", got)
	}
	if !leader.IsLeader() {
		t.Error("the leader lost leadership while the intruder was in the configuration")
	}
	waitFor(t, "the followers to apply every write", func() bool {
		return nodes[1].AppliedIndex() >= leader.AppliedIndex() && nodes[2].AppliedIndex() >= leader.AppliedIndex()
	})
}
