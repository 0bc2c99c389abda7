package auth_test

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/tenurehq/tenure/auth"
)

// bcryptHash hashes password at bcrypt's least cost, to keep tests fast.
func bcryptHash(t testing.TB, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// etcdPolicy gives alice (an etcd user with hash aliceHash) read and
// write under "app/", and bob (no password) the same.
func etcdPolicy(aliceHash string) string {
	return fmt.Sprintf(`
principals:
  - name: alice
    roles: [app]
    etcd_password_bcrypt: %q
  - name: bob
    roles: [app]
roles:
  app:
    - keys: [app/]
      verbs: [read, write]
`, aliceHash)
}

func TestParseEtcdPasswordErrorsNameThePrincipal(t *testing.T) {
	good := bcryptHash(t, "pw")
	// Made by hand: hashing at that cost takes seconds.
	tooCostly := fmt.Sprintf("$2a$%02d$", auth.MaxEtcdBcryptCost+1) + strings.TrimPrefix(good, "$2a$04$")
	cases := []struct {
		name, policy, want string
	}{
		{"a password in the clear is refused", etcdPolicy("hunter2"), `principals[0] (alice): etcd_password_bcrypt is not a bcrypt hash ("$2a$10$..."): store the hash of the password, never the password`},
		{"a truncated hash is refused", etcdPolicy(good[:30]), "principals[0] (alice): etcd_password_bcrypt is not a valid bcrypt hash"},
		{"a cost above the bound is refused", etcdPolicy(tooCostly), fmt.Sprintf("principals[0] (alice): etcd_password_bcrypt has cost %d: at most %d", auth.MaxEtcdBcryptCost+1, auth.MaxEtcdBcryptCost)},
		{"a pattern cannot have a password", `
principals:
  - name: team-*
    roles: [app]
    etcd_password_bcrypt: "` + good + `"
roles:
  app: [{keys: [app/], verbs: [read]}]
`, "principals[0] (team-*): etcd_password_bcrypt needs one principal, not a pattern"},
		{"a principal has one password", `
principals:
  - name: alice
    roles: [app]
    etcd_password_bcrypt: "` + good + `"
  - name: alice
    etcd_password_bcrypt: "` + good + `"
roles:
  app: [{keys: [app/], verbs: [read]}]
`, "principals[1] (alice): a second etcd_password_bcrypt for alice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := auth.Parse([]byte(c.policy))
			if !errors.Is(err, auth.ErrPolicy) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Parse: got = %v, expected: an error containing %q", err, c.want)
			}
		})
	}
	// htpasswd -B writes $2y$: accepted as Go's bcrypt accepts it.
	y := "$2y$" + strings.TrimPrefix(good, "$2a$")
	p := mustParse(t, etcdPolicy(y))
	if _, err := p.EtcdAuthenticate("alice", "pw", now); err != nil {
		t.Errorf("EtcdAuthenticate with a $2y$ hash: got = %v, expected: nil", err)
	}
}

func TestEtcdTokens(t *testing.T) {
	hash := bcryptHash(t, "s3cret")
	p := mustParse(t, etcdPolicy(hash))

	if _, err := p.EtcdAuthenticate("alice", "wrong", now); !errors.Is(err, auth.ErrEtcdAuthFailed) {
		t.Errorf("wrong password: got = %v, expected: ErrEtcdAuthFailed", err)
	}
	if _, err := p.EtcdAuthenticate("bob", "", now); !errors.Is(err, auth.ErrEtcdAuthFailed) {
		t.Errorf("a principal without an etcd password: got = %v, expected: ErrEtcdAuthFailed", err)
	}
	if _, err := p.EtcdAuthenticate("nobody", "s3cret", now); !errors.Is(err, auth.ErrEtcdAuthFailed) {
		t.Errorf("an unknown name: got = %v, expected: ErrEtcdAuthFailed", err)
	}

	token, err := p.EtcdAuthenticate("alice", "s3cret", now)
	if err != nil {
		t.Fatal(err)
	}
	if !auth.IsEtcdToken(token) || strings.Contains(token, "s3cret") {
		t.Fatalf("token %q: expected an etcd token that does not hold the password", token)
	}
	// Another node parses the same file on its own: it accepts the token.
	other := mustParse(t, etcdPolicy(hash))
	for _, c := range []struct {
		name   string
		policy *auth.Policy
		at     time.Time
		want   string // "" for alice
	}{
		{"the node that issued it", p, now, ""},
		{"another node with the same policy", other, now, ""},
		{"just before it expires", other, now.Add(auth.EtcdTokenTTL - time.Second), ""},
		{"once it expires", other, now.Add(auth.EtcdTokenTTL), "expired"},
		{"after the password changed", mustParse(t, etcdPolicy(bcryptHash(t, "s3cret"))), now, "is not one this policy issues"},
		{"after the principal lost its password", mustParse(t, strings.Replace(etcdPolicy(hash), "etcd_password_bcrypt", "identities: [alice]\n    #", 1)), now, "is not one this policy issues"},
	} {
		principal, err := c.policy.EtcdTokenPrincipal(token, c.at)
		switch {
		case c.want == "" && (err != nil || principal != "alice"):
			t.Errorf("%s: got = %q, %v, expected: alice", c.name, principal, err)
		case c.want != "" && (!errors.Is(err, auth.ErrInvalidToken) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got = %q, %v, expected: ErrInvalidToken saying %q", c.name, principal, err, c.want)
		}
	}

	// A token cannot be moved to another principal or another expiry.
	parts := strings.Split(strings.TrimPrefix(token, "tnr_etcd."), ".")
	for name, forged := range map[string]string{
		"another principal": "tnr_etcd.Ym9i." + parts[1] + "." + parts[2],
		"a later expiry":    "tnr_etcd." + parts[0] + ".99999999999." + parts[2],
		"a bad MAC":         "tnr_etcd." + parts[0] + "." + parts[1] + ".AAAA",
		"malformed":         "tnr_etcd.x",
		"not base64":        "tnr_etcd.!!." + parts[1] + "." + parts[2],
	} {
		if _, err := p.EtcdTokenPrincipal(forged, now); !errors.Is(err, auth.ErrInvalidToken) {
			t.Errorf("a token with %s: got = %v, expected: ErrInvalidToken", name, err)
		}
	}
}

// AuthenticateEtcd takes an etcd token, a Tenure token or a client
// certificate, and says which failure is which; Recheck holds an etcd
// token to the policy in force.
func TestAuthenticateEtcd(t *testing.T) {
	clock := now
	path := filepath.Join(t.TempDir(), "policy.yaml")
	hash := bcryptHash(t, "s3cret")
	tenureToken := auth.NewToken()
	policy := fmt.Sprintf(`
principals:
  - name: alice
    roles: [app]
    etcd_password_bcrypt: %q
  - name: carol
    roles: [app]
    tokens: [{sha256: %q}]
roles:
  app:
    - keys: [app/]
      verbs: [read, write]
`, hash, auth.HashToken(tenureToken))
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := auth.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	clientCA, peerCA := newCA(t, "client CA"), newCA(t, "peer CA")
	a := &auth.Authenticator{Policy: src, ClientCAs: clientCA.pool(), PeerCAs: peerCA.pool(), Now: func() time.Time { return clock }}
	etcdToken, err := src.Policy().EtcdAuthenticate("alice", "s3cret", clock)
	if err != nil {
		t.Fatal(err)
	}
	dave := []*x509.Certificate{clientCA.valid(t, "dave")}
	node := []*x509.Certificate{peerCA.valid(t, "node2")}

	for _, c := range []struct {
		name                string
		chain               []*x509.Certificate
		forwardedFor, token string
		want                auth.Caller
		wantErr             error
	}{
		{name: "an etcd token", token: etcdToken, want: auth.Caller{Principal: "alice", By: auth.ByEtcdToken}},
		{name: "a Tenure token", token: tenureToken, want: auth.Caller{Principal: "carol", By: auth.ByToken}},
		{name: "a client certificate names its CN", chain: dave, want: auth.Caller{Principal: "dave", By: auth.ByCertificate}},
		{name: "a token wins over a certificate", chain: dave, token: etcdToken, want: auth.Caller{Principal: "alice", By: auth.ByEtcdToken}},
		{name: "a node forwarding for a principal", chain: node, forwardedFor: "alice", want: auth.Caller{Principal: "alice", By: auth.ByForwarding, Peer: true}},
		{name: "a forwarded principal from a client is ignored", chain: dave, forwardedFor: "admin", want: auth.Caller{Principal: "dave", By: auth.ByCertificate}},
		{name: "nothing", wantErr: auth.ErrNoCredentials},
		{name: "an unknown Tenure token", token: auth.NewToken(), wantErr: auth.ErrInvalidToken},
		{name: "a forged etcd token", token: "tnr_etcd.YWxpY2U.1.AAAA", wantErr: auth.ErrInvalidToken},
		{name: "a token with a space", token: "a b", wantErr: auth.ErrInvalidToken},
	} {
		got := a.AuthenticateEtcd(c.chain, c.forwardedFor, c.token)
		if c.wantErr != nil {
			if !errors.Is(got.Err, c.wantErr) {
				t.Errorf("%s: got = %+v, expected: an error matching %v", c.name, got, c.wantErr)
			}
			continue
		}
		if got.Err != nil || got.Principal != c.want.Principal || got.By != c.want.By || got.Peer != c.want.Peer {
			t.Errorf("%s: got = %+v, expected: %+v", c.name, got, c.want)
		}
	}

	alice := a.AuthenticateEtcd(nil, "", etcdToken)
	if err := a.Recheck(alice); err != nil {
		t.Fatalf("Recheck of a fresh etcd token: got = %v, expected: nil", err)
	}
	clock = now.Add(auth.EtcdTokenTTL)
	if err := a.Recheck(alice); !errors.Is(err, auth.ErrInvalidToken) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Recheck of an expired etcd token: got = %v, expected: an error saying it expired", err)
	}
	clock = now
	if err := os.WriteFile(path, []byte(strings.Replace(policy, hash, bcryptHash(t, "new"), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := a.Recheck(alice); !errors.Is(err, auth.ErrInvalidToken) {
		t.Errorf("Recheck after the password changed: got = %v, expected: ErrInvalidToken", err)
	}
}

func TestKeyRange(t *testing.T) {
	p := mustParse(t, `
principals:
  - {name: app, roles: [app]}
  - {name: root, roles: [root]}
roles:
  app:
    - keys: ["app/", "logs*"]
      verbs: [read, write]
    - keys: ["ro/"]
      verbs: [read]
  root:
    - keys: ["*"]
      verbs: [read]
`)
	app, root := p.For("app"), p.For("root")
	for _, c := range []struct {
		name     string
		g        *auth.Grants
		v        auth.Verb
		key, end string
		want     bool
	}{
		{"a single key under the prefix", app, auth.Write, "app/x", "", true},
		{"a single key outside it", app, auth.Read, "other", "", false},
		{"the prefix's own range", app, auth.Read, "app/", "app0", true},
		{"a longer prefix's range", app, auth.Read, "app/sub/", "app/sub0", true},
		{"a range inside the prefix", app, auth.Read, "app/a", "app/m", true},
		{"a range that ends past the prefix", app, auth.Read, "app/a", "app1", false},
		{"a range that starts before the prefix", app, auth.Read, "apo", "app/z", false},
		{"a prefix pattern with a star", app, auth.Write, "logs", "logt", true},
		{"every key from a key on needs a prefix with no end", app, auth.Read, "app/", "\x00", false},
		{"the whole keyspace needs *", app, auth.Read, "\x00", "\x00", false},
		{"a range two rules cover only together is refused", app, auth.Read, "app/", "logt", false},
		{"a verb the covering rule lacks", app, auth.Write, "ro/", "ro0", false},
		{"an empty range is refused", app, auth.Read, "app/b", "app/a", false},
		{"a range ending at its start is refused", app, auth.Read, "app/b", "app/b", false},
		{"* reads the whole keyspace", root, auth.Read, "\x00", "\x00", true},
		{"* reads every key from a key on", root, auth.Read, "zzz", "\x00", true},
		{"* reads any range", root, auth.Read, "a", "b", true},
		{"* does not write", root, auth.Write, "a", "b", false},
	} {
		if got := c.g.KeyRange(c.v, c.key, c.end); got != c.want {
			t.Errorf("%s: KeyRange(%s, %q, %q) got = %v, expected: %v", c.name, c.v, c.key, c.end, got, c.want)
		}
	}
}
