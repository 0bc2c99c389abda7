// Package certs writes throwaway certificates for trying TLS on one
// machine (tenure certs init): a CA, and signed by it a server
// certificate for the API and a peer certificate for raft traffic (server
// and client use); and a client CA, and signed by it a client
// certificate. Clients have a CA of their own because, with a policy, a
// certificate from the peer CA speaks for the cluster's nodes. They name
// localhost,
// 127.0.0.1 and ::1 unless told other hosts. ECDSA P-256 and the
// standard library only: nothing to install, nothing to trust beyond the
// directory written.
//
// For production, use certificates from your own CA; these keys are
// written unencrypted next to the certificates.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the names Init writes, in its directory.
var Files = []string{
	"ca.pem", "ca-key.pem",
	"client-ca.pem", "client-ca-key.pem",
	"server.pem", "server-key.pem",
	"peer.pem", "peer-key.pem",
	"client.pem", "client-key.pem",
}

// ErrExists is returned by Init when a file it would write is there
// already: certificates in use are never overwritten.
var ErrExists = errors.New("already exists")

// Options say what Init writes.
type Options struct {
	// Hosts are the DNS names and IP addresses the server and peer
	// certificates are valid for (default localhost, 127.0.0.1, ::1).
	Hosts []string
	// ClientName is the client certificate's subject CN, the principal
	// it authenticates as (default "admin").
	ClientName string
	// Validity is how long the certificates are valid (default a year).
	Validity time.Duration
	// Now is the start of validity (default time.Now), for tests.
	Now time.Time
}

// Init writes a CA and the server, peer and client certificates it signs
// into dir, which it creates. It refuses to overwrite any file.
func Init(dir string, o Options) error {
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"localhost", "127.0.0.1", "::1"}
	}
	if o.ClientName == "" {
		o.ClientName = "admin"
	}
	if o.Validity <= 0 {
		o.Validity = 365 * 24 * time.Hour
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	for _, f := range Files {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%s: %w; remove it or choose another directory", filepath.Join(dir, f), ErrExists)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, caKey, err := issue(nil, nil, o, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "Tenure development CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, dir, "ca")
	if err != nil {
		return err
	}
	// Clients get a CA of their own: with a policy, a certificate from
	// the peer CA speaks for the cluster's nodes, so no client may hold
	// one (serve refuses a client CA that is also the peer CA).
	clientCA, clientCAKey, err := issue(nil, nil, o, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "Tenure development client CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, dir, "client-ca")
	if err != nil {
		return err
	}
	var dns []string
	var ips []net.IP
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	leaves := []struct {
		name string
		cn   string
		eku  []x509.ExtKeyUsage
		sans bool
	}{
		{"server", "tenure server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, true},
		// A node both accepts raft connections and makes them.
		{"peer", "tenure peer", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, true},
		{"client", o.ClientName, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false},
	}
	for _, l := range leaves {
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: l.cn},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: l.eku,
		}
		if l.sans {
			tmpl.DNSNames, tmpl.IPAddresses = dns, ips
		}
		parent, parentKey := ca, caKey
		if l.name == "client" {
			parent, parentKey = clientCA, clientCAKey
		}
		if _, _, err := issue(parent, parentKey, o, tmpl, dir, l.name); err != nil {
			return err
		}
	}
	return nil
}

// issue signs tmpl with parent (self-signed when parent is nil) and
// writes NAME.pem and NAME-key.pem.
func issue(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, o Options, tmpl *x509.Certificate, dir, name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = o.Now.Add(-time.Minute) // clocks a little apart
	tmpl.NotAfter = o.Now.Add(o.Validity)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the %s certificate: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := write(filepath.Join(dir, name+".pem"), "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	if err := write(filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", keyDER, 0o600); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func write(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Client signs, with the client CA Init wrote into dir, a client
// certificate whose subject CN is cn (the principal it authenticates
// as), written as dir/NAME.pem and dir/NAME-key.pem. o's Validity and Now
// apply as in Init; its Hosts and ClientName do not.
func Client(dir, name, cn string, o Options) error {
	if cn == "" {
		return errors.New("a client certificate needs a name (its subject CN)")
	}
	if o.Validity <= 0 {
		o.Validity = 365 * 24 * time.Hour
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	for _, f := range []string{name + ".pem", name + "-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%s: %w; remove it or choose another name", filepath.Join(dir, f), ErrExists)
		}
	}
	kp, err := tls.LoadX509KeyPair(filepath.Join(dir, "client-ca.pem"), filepath.Join(dir, "client-ca-key.pem"))
	if err != nil {
		return fmt.Errorf("load the client CA (tenure certs init writes it): %w", err)
	}
	ca, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return err
	}
	caKey, ok := kp.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("the client CA's key is %T, not ECDSA", kp.PrivateKey)
	}
	_, _, err = issue(ca, caKey, o, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, dir, name)
	return err
}
