package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInitWritesAChainThatVerifies: the server and peer certificates
// verify against the CA for every host asked for and no other, with the
// key usages TLS checks; the client certificate is for client auth
// under the name asked for; keys are private to their owner; and a
// second Init into the same directory changes nothing.
func TestInitWritesAChainThatVerifies(t *testing.T) {
	dir := t.TempDir()
	if err := Init(dir, Options{Hosts: []string{"tenure.example", "10.0.0.7"}, ClientName: "ops"}); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, filepath.Join(dir, "ca.pem")))
	clientRoots := x509.NewCertPool()
	clientRoots.AddCert(readCert(t, filepath.Join(dir, "client-ca.pem")))
	for _, leaf := range []struct {
		file string
		host string
		eku  x509.ExtKeyUsage
		ok   bool
	}{
		{"server.pem", "tenure.example", x509.ExtKeyUsageServerAuth, true},
		{"server.pem", "10.0.0.7", x509.ExtKeyUsageServerAuth, true},
		{"server.pem", "localhost", x509.ExtKeyUsageServerAuth, false},
		{"peer.pem", "tenure.example", x509.ExtKeyUsageServerAuth, true},
		{"peer.pem", "", x509.ExtKeyUsageClientAuth, true},
		{"client.pem", "", x509.ExtKeyUsageClientAuth, true},
		{"client.pem", "", x509.ExtKeyUsageServerAuth, false},
	} {
		pool := roots
		if leaf.file == "client.pem" {
			pool = clientRoots
		}
		_, err := readCert(t, filepath.Join(dir, leaf.file)).Verify(x509.VerifyOptions{Roots: pool, DNSName: leaf.host, KeyUsages: []x509.ExtKeyUsage{leaf.eku}})
		if (err == nil) != leaf.ok {
			t.Errorf("%s for %q as %v: got = %v, expected: ok %v", leaf.file, leaf.host, leaf.eku, err, leaf.ok)
		}
	}
	if cn := readCert(t, filepath.Join(dir, "client.pem")).Subject.CommonName; cn != "ops" {
		t.Errorf("client CN: got = %q, expected: ops", cn)
	}
	// The client certificate is not the peer CA's: with a policy that
	// would let it speak for the nodes.
	if _, err := readCert(t, filepath.Join(dir, "client.pem")).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("client.pem verifies against ca.pem, the peer CA")
	}
	for _, f := range []string{"ca-key.pem", "client-ca-key.pem", "server-key.pem", "peer-key.pem", "client-key.pem"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: got = %v, %v, expected: mode 0600", f, fi.Mode(), err)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, "server.pem"))
	if err := Init(dir, Options{}); !errors.Is(err, ErrExists) {
		t.Errorf("second Init: got = %v, expected: ErrExists", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "server.pem")); string(after) != string(before) {
		t.Error("second Init changed server.pem, expected: nothing overwritten")
	}
}

// TestServerConfigReloadsACertificateThatChanged: a renewed certificate
// on disk is served without a restart; a broken file keeps the last
// good one.
func TestServerConfigReloadsACertificateThatChanged(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if err := Init(a, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := Init(b, Options{Now: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp := func(from string) {
		for _, f := range []string{"server.pem", "server-key.pem"} {
			data, err := os.ReadFile(filepath.Join(from, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	cp(a)
	cfg, err := ServerConfig(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.String()
	}
	first := serial()
	cp(b)
	time.Sleep(1100 * time.Millisecond) // files are looked at once a second
	second := serial()
	if second == first || second != readCert(t, filepath.Join(b, "server.pem")).SerialNumber.String() {
		t.Fatalf("after replacing the files: got = serial %s (was %s), expected: the new certificate", second, first)
	}
	if err := os.WriteFile(filepath.Join(dir, "server.pem"), []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if got := serial(); got != second {
		t.Errorf("after a broken file: got = serial %s, expected: the last good one %s", got, second)
	}
}

// TestClientConfigNamesWhatIsWrong: bad inputs say which flag.
func TestClientConfigNamesWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	if err := Init(dir, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ClientConfig(filepath.Join(dir, "missing.pem"), "", ""); err == nil {
		t.Error("missing CA file: got = no error")
	}
	if _, err := ClientConfig(filepath.Join(dir, "ca-key.pem"), "", ""); err == nil {
		t.Error("a key as the CA: got = no error, expected: holds no PEM certificate")
	}
	if _, err := ClientConfig("", filepath.Join(dir, "client.pem"), ""); err == nil {
		t.Error("--cert without --key: got = no error")
	}
	if _, err := ClientConfig(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")); err != nil {
		t.Errorf("good files: %v", err)
	}
}
