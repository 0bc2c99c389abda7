package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ServerConfig is the TLS configuration of the API port: the certificate
// in certFile and keyFile, and, with clientCAFile, client certificates
// required and checked against that CA (etcd's --client-cert-auth). The
// files are read again when they change on disk, checked at most once a
// second on a new connection, so that a renewed certificate is used
// without a restart; a file that fails to load keeps the last good one.
func ServerConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
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
	ca := &reloading[x509.CertPool]{files: []string{clientCAFile}, load: func() (*x509.CertPool, error) {
		return loadPool(clientCAFile, "--client-ca-file")
	}}
	if _, err := ca.get(); err != nil {
		return nil, err
	}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := ca.get()
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

// PeerConfig is a node's TLS configuration for raft traffic: its peer
// certificate, presented both when it accepts a connection and when it
// makes one (re-read when the files change, as ServerConfig's), and the
// peer CA that every other node's certificate must come from, both
// ways.
func PeerConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	kp, err := keyPair(certFile, keyFile, "--peer-cert-file", "--peer-key-file")
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(caFile, "--peer-ca-file")
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		RootCAs:   pool,
		ClientCAs: pool,
	}, nil
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
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", flag, file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", flag, file)
	}
	return pool, nil
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
}

func (r *reloading[T]) get() (*T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.val != nil && time.Since(r.checked) < time.Second {
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
	if r.val != nil && stamp == r.stamp {
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
