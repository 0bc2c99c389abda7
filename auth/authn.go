package auth

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ForwardedPrincipalHeader carries, from the node that forwards a call to
// the leader, the principal it authenticated. Only a node (a certificate
// from the peer CA) is believed; from anybody else the header is dropped.
const ForwardedPrincipalHeader = "Tenure-Forwarded-Principal"

// How a caller was authenticated.
const (
	ByToken       = "token"
	ByEtcdToken   = "etcd-token" // an etcd user's token (EtcdAuthenticate)
	ByCertificate = "certificate"
	ByPeer        = "peer"      // a node, for itself
	ByForwarding  = "forwarded" // a node, for a principal it authenticated
)

// Caller is who made a request, or why that is not known.
type Caller struct {
	// Principal is the authenticated name; "" for a node acting for
	// itself or an unauthenticated caller.
	Principal string
	// By is how it was authenticated (ByToken...).
	By string
	// Peer is set for a node of the cluster: trusted with everything
	// when it acts for itself.
	Peer bool
	// Err is why the caller is not authenticated; nil when it is.
	Err error

	// The credential, kept so that a stream or pipeline can check it
	// again on every message (Recheck): a bearer token's hash, an etcd
	// token, or the client certificate's NotAfter.
	tokenHash string
	etcdToken string
	notAfter  time.Time
}

// Authenticator finds the caller of a request.
type Authenticator struct {
	Policy *Source
	// ClientCAs return the pool client certificates must chain to; nil
	// when client certificates are not accepted.
	ClientCAs func() (*x509.CertPool, error)
	// PeerCAs return the pool node certificates chain to; nil without
	// peer TLS.
	PeerCAs func() (*x509.CertPool, error)
	// Now is the clock for certificate and token expiry (time.Now).
	Now func() time.Time
}

func (a *Authenticator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Authenticate reads r's credentials: a peer certificate (a node, maybe
// forwarding for a principal), else a bearer token, else a client
// certificate. It removes ForwardedPrincipalHeader from r, so that
// nothing downstream can mistake a caller's claim for a node's word.
func (a *Authenticator) Authenticate(r *http.Request) Caller {
	forwardedFor := r.Header.Get(ForwardedPrincipalHeader)
	r.Header.Del(ForwardedPrincipalHeader)
	var chain []*x509.Certificate
	if r.TLS != nil {
		chain = r.TLS.PeerCertificates
	}
	if c, ok := a.peer(chain, forwardedFor); ok {
		return c
	}
	token, err := ParseBearer(r.Header.Get("Authorization"))
	switch {
	case err == nil && IsEtcdToken(token):
		// An etcd user's token works on the native API too: with etcd's
		// auth enabled and no policy file, it is how those users call it.
		return a.etcdTokenCaller(token)
	case err == nil:
		return a.tokenCaller(token)
	case !errors.Is(err, ErrNoCredentials):
		return Caller{Err: err}
	}
	return a.certCaller(chain, "send a bearer token (Authorization: Bearer ...) or a client certificate")
}

// AuthenticateEtcd finds the caller of an etcd API call from its
// parts: chain is the TLS peer's certificates, forwardedFor what the
// forwarding node's metadata names (believed only from a node), token
// the "token" metadata, as etcd clients send it. The token is an etcd
// token (EtcdAuthenticate) or a Tenure token; without one, a client
// certificate names the principal by its CN (CertName), as etcd names
// the user. A token that does not work is an error matching
// ErrInvalidToken; none at all, one matching ErrNoCredentials.
func (a *Authenticator) AuthenticateEtcd(chain []*x509.Certificate, forwardedFor, token string) Caller {
	if c, ok := a.peer(chain, forwardedFor); ok {
		return c
	}
	if token == "" {
		return a.certCaller(chain, `authenticate (the "token" metadata) or send a client certificate`)
	}
	if err := checkToken(token); err != nil {
		return Caller{Err: fmt.Errorf("%w: %v", ErrInvalidToken, err)}
	}
	if IsEtcdToken(token) {
		return a.etcdTokenCaller(token)
	}
	c := a.tokenCaller(token)
	if c.Err != nil {
		c.Err = fmt.Errorf("%w: %v", ErrInvalidToken, c.Err)
	}
	return c
}

// etcdTokenCaller is the caller an etcd token (EtcdAuthenticate) names.
func (a *Authenticator) etcdTokenCaller(token string) Caller {
	principal, err := a.Policy.Policy().EtcdTokenPrincipal(token, a.now())
	if err != nil {
		return Caller{Err: err}
	}
	return Caller{Principal: principal, By: ByEtcdToken, etcdToken: token}
}

// peer is the caller of a request from a node, when chain is a node's.
func (a *Authenticator) peer(chain []*x509.Certificate, forwardedFor string) (Caller, bool) {
	if len(chain) == 0 || a.PeerCAs == nil || a.verify(chain, a.PeerCAs) != nil {
		return Caller{}, false
	}
	if forwardedFor != "" {
		return Caller{Principal: forwardedFor, By: ByForwarding, Peer: true}, true
	}
	return Caller{By: ByPeer, Peer: true}, true
}

// tokenCaller is the caller a Tenure bearer token names.
func (a *Authenticator) tokenCaller(token string) Caller {
	hash := HashToken(token)
	principal, err := a.Policy.Policy().hashPrincipal(hash, a.now())
	if err != nil {
		return Caller{Err: err}
	}
	return Caller{Principal: principal, By: ByToken, tokenHash: hash}
}

// certCaller is the caller a client certificate names; without one, an
// error matching ErrNoCredentials that tells what to send.
func (a *Authenticator) certCaller(chain []*x509.Certificate, send string) Caller {
	if len(chain) == 0 {
		return Caller{Err: fmt.Errorf("%w: %s", ErrNoCredentials, send)}
	}
	name := CertName(chain[0])
	if a.ClientCAs == nil {
		return Caller{Err: fmt.Errorf("client certificate %q: this server takes no client certificates (no --client-ca-file)", name)}
	}
	if err := a.verify(chain, a.ClientCAs); err != nil {
		return Caller{Err: fmt.Errorf("client certificate %q: %w", name, err)}
	}
	if name == "" {
		return Caller{Err: errors.New("client certificate names nobody: no subject CN and no SAN")}
	}
	return Caller{Principal: name, By: ByCertificate, notAfter: chain[0].NotAfter}
}

// Recheck checks c's credential again, against the policy in force and
// the clock now: a request is authenticated once, but a stream or a
// pipeline is used for as long as it stays open, and a token that
// expired or left the policy, or a certificate past its NotAfter, must
// stop working on it too. Nodes (peer certificates) are not rechecked:
// their connections are the cluster's own.
func (a *Authenticator) Recheck(c Caller) error {
	if c.Err != nil {
		return c.Err
	}
	switch c.By {
	case ByToken:
		principal, err := a.Policy.Policy().hashPrincipal(c.tokenHash, a.now())
		if err != nil {
			return fmt.Errorf("no longer valid: %w", err)
		}
		if principal != c.Principal {
			return fmt.Errorf("no longer valid: the bearer token of %s now names %s", c.Principal, principal)
		}
	case ByEtcdToken:
		principal, err := a.Policy.Policy().EtcdTokenPrincipal(c.etcdToken, a.now())
		if err != nil {
			return fmt.Errorf("no longer valid: %w", err)
		}
		if principal != c.Principal {
			return fmt.Errorf("no longer valid: the etcd token of %s now names %s", c.Principal, principal)
		}
	case ByCertificate:
		if now := a.now(); !c.notAfter.IsZero() && now.After(c.notAfter) {
			return fmt.Errorf("no longer valid: the client certificate of %s expired at %s", c.Principal, c.notAfter.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

func (a *Authenticator) verify(chain []*x509.Certificate, pool func() (*x509.CertPool, error)) error {
	roots, err := pool()
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err = chain[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   a.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return err
}

// CertName is the principal a certificate names: its subject CN, else its
// first URI SAN (a SPIFFE ID), DNS SAN or email SAN.
func CertName(c *x509.Certificate) string {
	switch {
	case c.Subject.CommonName != "":
		return c.Subject.CommonName
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case len(c.EmailAddresses) > 0:
		return c.EmailAddresses[0]
	}
	return ""
}
