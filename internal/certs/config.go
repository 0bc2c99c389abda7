package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ServerConfig is the TLS configuration of the API port: the certificate
// in certFile and keyFile, and, with clientCAFile, client certificates
// checked against that CA (etcd's --client-cert-auth), or against
// peerCAFile, from which the other nodes of a cluster present theirs when
// they call this one. A certificate is asked for, not required: the
// server's HTTP layer refuses every call without one but the health
// checks (server.requireClientCert), which probes and readiness loops
// without a certificate must reach. The files are read again when they
// change on disk, checked at most once a second on a new connection, so
// that a renewed certificate is used without a restart; a file that fails
// to load keeps the last good one.
func ServerConfig(certFile, keyFile, clientCAFile, peerCAFile string) (*tls.Config, error) {
	kp, err := keyPair(certFile, keyFile, "--cert-file", "--key-file")
	if err != nil {
		return nil, err
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get()
		},
	}
	if clientCAFile == "" {
		return base, nil
	}
	files, flags := []string{clientCAFile}, []string{"--client-ca-file"}
	if peerCAFile != "" {
		files, flags = append(files, peerCAFile), append(flags, "--peer-ca-file")
	}
	cas := &reloading[x509.CertPool]{files: files, load: func() (*x509.CertPool, error) {
		pool := x509.NewCertPool()
		for i, f := range files {
			if err := addPEM(pool, f, flags[i]); err != nil {
				return nil, err
			}
		}
		return pool, nil
	}}
	if _, err := cas.get(); err != nil {
		return nil, err
	}
	// Not RequireAndVerifyClientCert: the handshake cannot tell /readyz
	// from a call, and a caller refused after it learns why ("a client
	// certificate is required") rather than from a bare TLS alert. A
	// certificate that is given must still verify here.
	base.ClientAuth = tls.VerifyClientCertIfGiven
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := cas.get()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = pool
		return c, nil
	}
	return base, nil
}

// AuthServerConfig is ServerConfig for a server with a policy: a client
// certificate is asked for but not required or checked here, because a
// caller may authenticate with a token instead, and one whose certificate
// fails (expired, another CA) must get an "unauthenticated" answer that
// says why, not a failed handshake. package auth checks it, against Pool.
func AuthServerConfig(certFile, keyFile string) (*tls.Config, error) {
	c, err := ServerConfig(certFile, keyFile, "", "")
	if err != nil {
		return nil, err
	}
	c.ClientAuth = tls.RequestClientCert
	return c, nil
}

// Pool returns the CA certificates in file, read again when it changes
// (checked at most once a second); flag names it in errors.
func Pool(file, flag string) (func() (*x509.CertPool, error), error) {
	r := &reloading[x509.CertPool]{files: []string{file}, load: func() (*x509.CertPool, error) {
		return loadPool(file, flag)
	}}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	return r.get, nil
}

// PeerConfig is a node's TLS configuration for raft traffic and for
// calling other nodes' APIs: its peer certificate, presented both when it
// accepts a connection and when it makes one, and the peer CA that every
// other node's certificate must come from, both ways. All three files are
// re-read when they change (as ServerConfig's), so that certificates and
// the CA can be rotated without a restart.
func PeerConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	kp, err := keyPair(certFile, keyFile, "--peer-cert-file", "--peer-key-file")
	if err != nil {
		return nil, err
	}
	pool, err := Pool(caFile, "--peer-ca-file")
	if err != nil {
		return nil, err
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		// The pool may change, and RootCAs cannot: the server's chain
		// is checked below against the pool of the moment, host name
		// included, in place of the standard check.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the peer sent no certificate")
			}
			roots, err := pool()
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
			if !cs.DidResume && cs.ServerName != "" && len(cs.VerifiedChains) == 0 {
				opts.DNSName = cs.ServerName
			}
			_, err = cs.PeerCertificates[0].Verify(opts)
			return err
		},
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		roots, err := pool()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = roots
		c.ClientAuth = tls.RequireAndVerifyClientCert
		return c, nil
	}
	return base, nil
}

// ClientConfig is a client's TLS configuration: servers checked against
// caFile (the system's roots when empty), and with certFile and keyFile
// a client certificate to present.
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := loadPool(caFile, "--cacert")
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--cert and --key go together: give both or neither")
	}
	if certFile != "" {
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load --cert %s and --key %s: %w", certFile, keyFile, err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

// keyPair is a certificate and key loaded now, and again when their
// files change; the flags name them in errors.
func keyPair(certFile, keyFile, certFlag, keyFlag string) (*reloading[tls.Certificate], error) {
	kp := &reloading[tls.Certificate]{files: []string{certFile, keyFile}, load: func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load %s %s and %s %s: %w", certFlag, certFile, keyFlag, keyFile, err)
		}
		return &c, nil
	}}
	if _, err := kp.get(); err != nil {
		return nil, err
	}
	return kp, nil
}

func loadPool(file, flag string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if err := addPEM(pool, file, flag); err != nil {
		return nil, err
	}
	return pool, nil
}

func addPEM(pool *x509.CertPool, file, flag string) error {
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read %s %s: %w", flag, file, err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s %s holds no PEM certificate", flag, file)
	}
	return nil
}

// SameCA reports whether any CA certificate in a is also in b.
func SameCA(a, b string) (bool, error) {
	certsIn := func(file string) ([][]byte, error) {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		var out [][]byte
		for {
			var block *pem.Block
			block, data = pem.Decode(data)
			if block == nil {
				return out, nil
			}
			out = append(out, block.Bytes)
		}
	}
	ca, err := certsIn(a)
	if err != nil {
		return false, err
	}
	cb, err := certsIn(b)
	if err != nil {
		return false, err
	}
	for _, x := range ca {
		for _, y := range cb {
			if bytes.Equal(x, y) {
				return true, nil
			}
		}
	}
	return false, nil
}

// reloading is a value loaded from files and loaded again when any of
// them changes (size or modification time), looked at no more than once
// a second.
type reloading[T any] struct {
	files []string
	load  func() (*T, error)

	mu      sync.Mutex
	val     *T
	stamp   string
	checked time.Time
	reread  int64
}

// rereads counts calls to Reread: a reloading value loads its files again
// when it has changed, whatever their stamps say.
var rereads atomic.Int64

// Reread makes every certificate, key and CA be read again from disk on
// its next use (serve calls it on SIGHUP), even when a file's size and
// modification time are unchanged.
func Reread() { rereads.Add(1) }

func (r *reloading[T]) get() (*T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	forced := false
	if n := rereads.Load(); n != r.reread {
		r.reread, forced = n, true
	}
	if r.val != nil && !forced && time.Since(r.checked) < time.Second {
		return r.val, nil
	}
	r.checked = time.Now()
	stamp := ""
	for _, f := range r.files {
		fi, err := os.Stat(f)
		if err != nil {
			if r.val != nil {
				return r.val, nil // keep serving with the last good one
			}
			return nil, err
		}
		stamp += fmt.Sprintf("%s:%d:%d;", f, fi.Size(), fi.ModTime().UnixNano())
	}
	if r.val != nil && stamp == r.stamp && !forced {
		return r.val, nil
	}
	v, err := r.load()
	if err != nil {
		if r.val != nil {
			return r.val, nil
		}
		return nil, err
	}
	r.val, r.stamp = v, stamp
	return v, nil
}
