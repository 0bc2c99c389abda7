package auth_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/auth"
)

// now is the authenticator's clock in these tests.
var now = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC) // after tokenExpiry

// testCA is a certificate authority made for one test run.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-365 * 24 * time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

func (ca *testCA) pool() func() (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return func() (*x509.CertPool, error) { return pool, nil }
}

// leaf issues a client-auth certificate valid from notBefore to notAfter,
// named by cn and uris.
func (ca *testCA) leaf(t *testing.T, cn string, uris []string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &newKey(t).PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func (ca *testCA) valid(t *testing.T, cn string, uris ...string) *x509.Certificate {
	return ca.leaf(t, cn, uris, now.Add(-time.Hour), now.Add(time.Hour))
}

// credentials are what a request carries.
type credentials struct {
	certs         []*x509.Certificate
	authorization string
	forwardedFor  string
}

func (c credentials) request() *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if c.certs != nil {
		r.TLS = &tls.ConnectionState{PeerCertificates: c.certs}
	}
	if c.authorization != "" {
		r.Header.Set("Authorization", c.authorization)
	}
	if c.forwardedFor != "" {
		r.Header.Set(auth.ForwardedPrincipalHeader, c.forwardedFor)
	}
	return r
}

// Authenticate believes a peer certificate first (and only then the
// forwarded principal), then a bearer token, then a client certificate;
// it refuses everything else with a reason, and always removes the
// forwarded-principal header.
func TestAuthenticate(t *testing.T) {
	clientCA, peerCA, foreignCA := newCA(t, "client CA"), newCA(t, "peer CA"), newCA(t, "foreign CA")
	carol := clientCA.valid(t, "carol")
	spiffe := clientCA.valid(t, "", "spiffe://example.org/ns/jobs/sa/scheduler")
	nameless := clientCA.valid(t, "")
	expired := clientCA.leaf(t, "dave", nil, now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	notYet := clientCA.leaf(t, "erin", nil, now.Add(time.Hour), now.Add(48*time.Hour))
	mallory := foreignCA.valid(t, "mallory")
	node := peerCA.valid(t, "node-1")

	policy := auth.Static(mustParse(t, fullPolicy()))
	bearer := func(tok string) string { return "Bearer " + tok }
	const unknownToken = "tnr_unknown-token-unknown-token"

	tests := []struct {
		name     string
		creds    credentials
		noClient bool // the server takes no client certificates
		noPeer   bool // the server has no peer CA
		want     auth.Caller
		wantErr  string
	}{
		{
			name:  "A node's certificate from the peer CA is a peer acting for itself.",
			creds: credentials{certs: []*x509.Certificate{node}},
			want:  auth.Caller{By: auth.ByPeer, Peer: true},
		},
		{
			name:  "A node forwarding a call speaks for the principal it names.",
			creds: credentials{certs: []*x509.Certificate{node}, forwardedFor: "scheduler"},
			want:  auth.Caller{Principal: "scheduler", By: auth.ByForwarding, Peer: true},
		},
		{
			name:  "A node is a peer whatever bearer token it carries.",
			creds: credentials{certs: []*x509.Certificate{node}, authorization: bearer(unknownToken)},
			want:  auth.Caller{By: auth.ByPeer, Peer: true},
		},
		{
			name:    "Without a peer CA, a node's certificate is just a certificate from an unknown CA.",
			creds:   credentials{certs: []*x509.Certificate{node}, forwardedFor: "admin"},
			noPeer:  true,
			wantErr: "unknown authority",
		},
		{
			name:  "A client certificate with the forwarded-principal header is its own principal: the header gives it nothing.",
			creds: credentials{certs: []*x509.Certificate{carol}, forwardedFor: "admin"},
			want:  auth.Caller{Principal: "carol", By: auth.ByCertificate},
		},
		{
			name:  "A bearer token with the forwarded-principal header is its own principal.",
			creds: credentials{authorization: bearer(adminToken), forwardedFor: "scheduler"},
			want:  auth.Caller{Principal: "admin", By: auth.ByToken},
		},
		{
			name:    "The forwarded-principal header alone is no credential.",
			creds:   credentials{forwardedFor: "admin"},
			wantErr: "no credentials",
		},
		{
			name:  "A bearer token names its principal.",
			creds: credentials{authorization: bearer(adminToken)},
			want:  auth.Caller{Principal: "admin", By: auth.ByToken},
		},
		{
			name:  "A bearer token wins over a client certificate.",
			creds: credentials{certs: []*x509.Certificate{carol}, authorization: bearer(adminToken)},
			want:  auth.Caller{Principal: "admin", By: auth.ByToken},
		},
		{
			name:    "A token the policy does not know is refused, even beside a good client certificate.",
			creds:   credentials{certs: []*x509.Certificate{carol}, authorization: bearer(unknownToken)},
			wantErr: "not one the policy knows",
		},
		{
			name:    "An expired token is refused, saying it expired.",
			creds:   credentials{authorization: bearer(schedulerToken)},
			wantErr: "expired",
		},
		{
			name:    "A malformed Authorization header is refused, even beside a good client certificate.",
			creds:   credentials{certs: []*x509.Certificate{carol}, authorization: "Basic " + unknownToken},
			wantErr: `not "Bearer <token>"`,
		},
		{
			name:  "A client certificate from the client CA names its subject CN.",
			creds: credentials{certs: []*x509.Certificate{carol}},
			want:  auth.Caller{Principal: "carol", By: auth.ByCertificate},
		},
		{
			name:  "A client certificate with no CN names its URI SAN.",
			creds: credentials{certs: []*x509.Certificate{spiffe}},
			want:  auth.Caller{Principal: "spiffe://example.org/ns/jobs/sa/scheduler", By: auth.ByCertificate},
		},
		{
			name:    "A client certificate that names nobody is refused.",
			creds:   credentials{certs: []*x509.Certificate{nameless}},
			wantErr: "names nobody",
		},
		{
			name:    "An expired client certificate is refused, saying it expired.",
			creds:   credentials{certs: []*x509.Certificate{expired}},
			wantErr: "expired",
		},
		{
			name:    "A client certificate not valid yet is refused.",
			creds:   credentials{certs: []*x509.Certificate{notYet}},
			wantErr: "erin",
		},
		{
			name:    "A certificate from a foreign CA is refused, naming it.",
			creds:   credentials{certs: []*x509.Certificate{mallory}},
			wantErr: `"mallory"`,
		},
		{
			name:     "A client certificate is refused when the server takes none.",
			creds:    credentials{certs: []*x509.Certificate{carol}},
			noClient: true,
			wantErr:  "takes no client certificates",
		},
		{
			name:    "A request with no credentials is refused.",
			creds:   credentials{},
			wantErr: "no credentials",
		},
		{
			name:    "A TLS connection without a certificate is no credential.",
			creds:   credentials{certs: []*x509.Certificate{}},
			wantErr: "no credentials",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &auth.Authenticator{
				Policy:    policy,
				ClientCAs: clientCA.pool(),
				PeerCAs:   peerCA.pool(),
				Now:       func() time.Time { return now },
			}
			if tt.noClient {
				a.ClientCAs = nil
			}
			if tt.noPeer {
				a.PeerCAs = nil
			}
			r := tt.creds.request()
			got := a.Authenticate(r)

			if tt.wantErr != "" {
				if got.Err == nil || !strings.Contains(got.Err.Error(), tt.wantErr) {
					t.Errorf("Err got = %v, expected: an error holding %q", got.Err, tt.wantErr)
				}
				if got.Principal != "" || got.By != "" || got.Peer {
					t.Errorf("refused caller got = %+v, expected: no principal, method or peer", got)
				}
			} else if !sameCaller(got, tt.want) {
				t.Errorf("got = %+v, expected: %+v", got, tt.want)
			}
			if got.Err != nil {
				for _, tok := range []string{adminToken, schedulerToken, unknownToken} {
					if strings.Contains(got.Err.Error(), tok) {
						t.Errorf("Err got = %q, expected: no token text in it", got.Err)
					}
				}
			}
			if h := r.Header.Values(auth.ForwardedPrincipalHeader); len(h) != 0 {
				t.Errorf("%s after Authenticate got = %q, expected: removed", auth.ForwardedPrincipalHeader, h)
			}
		})
	}
}

// The clock for token expiry is the authenticator's: the scheduler's
// token works before its expiry.
func TestAuthenticateTokenClock(t *testing.T) {
	a := &auth.Authenticator{
		Policy: auth.Static(mustParse(t, fullPolicy())),
		Now:    func() time.Time { return tokenExpiry.Add(-time.Minute) },
	}
	r := credentials{authorization: "Bearer " + schedulerToken}.request()
	if got, want := a.Authenticate(r), (auth.Caller{Principal: "scheduler", By: auth.ByToken}); !sameCaller(got, want) {
		t.Errorf("got = %+v, expected: %+v", got, want)
	}
}

// sameCaller compares what a caller says of itself; the credential it
// keeps for Recheck is the authenticator's business.
func sameCaller(a, b auth.Caller) bool {
	return a.Principal == b.Principal && a.By == b.By && a.Peer == b.Peer && a.Err == b.Err
}

// TestRecheckRefusesACredentialThatNoLongerHolds: a caller authenticated
// once is checked again against the policy in force and the clock: a
// token whose hash left the policy, a token past its expiry and a
// certificate past its NotAfter all fail, naming why; a node is not
// rechecked.
func TestRecheckRefusesACredentialThatNoLongerHolds(t *testing.T) {
	clock := tokenExpiry.Add(-time.Minute)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(fullPolicy()), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := auth.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &auth.Authenticator{Policy: src, Now: func() time.Time { return clock }}
	scheduler := a.Authenticate(credentials{authorization: "Bearer " + schedulerToken}.request())
	if err := a.Recheck(scheduler); err != nil {
		t.Fatalf("Recheck of a valid token: got = %v, expected: nil", err)
	}
	clock = tokenExpiry.Add(time.Second)
	if err := a.Recheck(scheduler); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Recheck of a token past its expiry: got = %v, expected: an error naming the expiry", err)
	}
	clock = tokenExpiry.Add(-time.Minute)
	admin := a.Authenticate(credentials{authorization: "Bearer " + adminToken}.request())
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(fullPolicy(), auth.HashToken(adminToken), auth.HashToken(auth.NewToken()))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := a.Recheck(admin); err == nil || !strings.Contains(err.Error(), "not one the policy knows") {
		t.Errorf("Recheck of a token that left the policy: got = %v, expected: an error saying so", err)
	}
	if err := a.Recheck(auth.Caller{By: auth.ByPeer, Peer: true}); err != nil {
		t.Errorf("Recheck of a node: got = %v, expected: nil", err)
	}

	clock = now // the test certificates' clock
	clientCA := newCA(t, "client CA")
	a.ClientCAs = clientCA.pool()
	carol := a.Authenticate(credentials{certs: []*x509.Certificate{clientCA.valid(t, "carol")}}.request())
	if carol.Err != nil {
		t.Fatal(carol.Err)
	}
	if err := a.Recheck(carol); err != nil {
		t.Errorf("Recheck of a valid certificate: got = %v, expected: nil", err)
	}
	clock = now.Add(2 * time.Hour)
	if err := a.Recheck(carol); err == nil || !strings.Contains(err.Error(), "certificate of carol expired") {
		t.Errorf("Recheck of a certificate past its NotAfter: got = %v, expected: an error naming its expiry", err)
	}
}

// A failing CA pool refuses the certificate rather than letting it by.
func TestAuthenticatePoolError(t *testing.T) {
	clientCA := newCA(t, "client CA")
	broken := errors.New("CA file unreadable")
	a := &auth.Authenticator{
		Policy:    auth.Static(mustParse(t, fullPolicy())),
		ClientCAs: func() (*x509.CertPool, error) { return nil, broken },
		PeerCAs:   func() (*x509.CertPool, error) { return nil, broken },
		Now:       func() time.Time { return now },
	}
	got := a.Authenticate(credentials{certs: []*x509.Certificate{clientCA.valid(t, "carol")}, forwardedFor: "admin"}.request())
	if !errors.Is(got.Err, broken) || got.Principal != "" || got.Peer {
		t.Errorf("got = %+v, expected: refused with %v", got, broken)
	}
}

// CertName is the subject CN, else the first URI, DNS or email SAN.
func TestCertName(t *testing.T) {
	u, _ := url.Parse("spiffe://example.org/a")
	tests := []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"The CN comes first.", &x509.Certificate{Subject: pkix.Name{CommonName: "cn"}, URIs: []*url.URL{u}, DNSNames: []string{"dns"}}, "cn"},
		{"Then the first URI SAN.", &x509.Certificate{URIs: []*url.URL{u}, DNSNames: []string{"dns"}}, "spiffe://example.org/a"},
		{"Then the first DNS SAN.", &x509.Certificate{DNSNames: []string{"dns", "other"}, EmailAddresses: []string{"e@x"}}, "dns"},
		{"Then the first email SAN.", &x509.Certificate{EmailAddresses: []string{"e@x"}}, "e@x"},
		{"A certificate with none names nobody.", &x509.Certificate{}, ""},
	}
	for _, tt := range tests {
		if got := auth.CertName(tt.cert); got != tt.want {
			t.Errorf("%s got = %q, expected: %q", tt.name, got, tt.want)
		}
	}
}

// The auditor writes one line per event, at warning level when the
// outcome is not "allowed"; a nil auditor writes nothing.
func TestAuditor(t *testing.T) {
	var buf bytes.Buffer
	a := auth.NewAuditor(slog.New(slog.NewJSONHandler(&buf, nil)))
	a.Record(context.Background(), auth.Entry{Principal: "carol", Action: "Revoke", Target: "team-a/db", Outcome: "denied", Reason: "no admin", Remote: "10.0.0.1:5"})
	a.Record(context.Background(), auth.Entry{Principal: "root", Action: "Snapshot", Outcome: "allowed"})
	(*auth.Auditor)(nil).Record(context.Background(), auth.Entry{Outcome: "denied"})

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines got = %d, expected: 2", len(lines))
	}
	var denied, allowed map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &denied); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &allowed); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"level": "WARN", "msg": "audit", "principal": "carol", "action": "Revoke", "target": "team-a/db", "outcome": "denied", "reason": "no admin", "remote": "10.0.0.1:5"} {
		if got := denied[k]; got != want {
			t.Errorf("denied line %s got = %v, expected: %q", k, got, want)
		}
	}
	if got := allowed["level"]; got != "INFO" {
		t.Errorf("allowed line level got = %v, expected: INFO", got)
	}
}
