package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// etcd users. An etcd client logs in with a user name and password
// (Auth.Authenticate) and sends the token it gets back in the "token"
// metadata of every later call. Tenure's etcd users are its principals:
// a principal entry with an etcd_password_bcrypt is a user of that name,
// with exactly the grants the principal has. The token is not stored
// anywhere: it is an HMAC over the principal and an expiry, keyed by the
// principal's password hash, so that
//
//   - every node with the same policy accepts it, with nothing to
//     replicate;
//   - it stops working when it expires (EtcdTokenTTL, etcd's simple
//     token TTL: clients log in again on "invalid auth token"), and at
//     once when the principal's hash changes or the principal leaves
//     the policy, since the key it was made with is gone.
//
// The price: whoever reads a password hash in the policy file can make
// tokens for that principal without knowing its password. The policy
// file must therefore be kept as a password file is, readable only by
// the server (docs/security.md says so).

// EtcdTokenTTL is how long an etcd token works: etcd's simple token
// TTL. Clients authenticate again when a call answers "invalid auth
// token".
const EtcdTokenTTL = 5 * time.Minute

// MaxEtcdBcryptCost bounds the cost of a password hash in the policy:
// each Authenticate pays it in CPU (cost 10, etcd's default, is tens of
// milliseconds; every step up doubles it).
const MaxEtcdBcryptCost = 14

// etcdTokenPrefix marks etcd tokens: "tnr_" as Tenure's tokens, so that
// one found in a log is recognised; the '.' never occurs in a Tenure
// API token, so the two kinds cannot be mistaken for each other.
const etcdTokenPrefix = "tnr_etcd."

var (
	// ErrEtcdAuthFailed is returned by EtcdAuthenticate for a name with
	// no etcd password in the policy, or the wrong password.
	ErrEtcdAuthFailed = errors.New("wrong etcd user name or password")
	// ErrInvalidToken is matched by the errors of a token that is
	// malformed, unknown, expired or no longer valid.
	ErrInvalidToken = errors.New("invalid token")
)

// dummyHash is compared against when the name has no password, so that
// a wrong name costs as much as a wrong password and Authenticate tells
// no one which names exist.
// It is made on first use: every program that imports this package (the
// CLI too) would pay for it at start.
var dummyHash = sync.OnceValue(func() []byte {
	h, _ := bcrypt.GenerateFromPassword([]byte("tenure: no such etcd user"), bcrypt.DefaultCost)
	return h
})

// parseBcrypt checks a stored etcd password hash.
func parseBcrypt(h string) ([]byte, error) {
	if !strings.HasPrefix(h, "$2") {
		return nil, errors.New(`etcd_password_bcrypt is not a bcrypt hash ("$2a$10$..."): store the hash of the password, never the password (see docs/security.md)`)
	}
	cost, err := bcrypt.Cost([]byte(h))
	if err != nil {
		return nil, fmt.Errorf("etcd_password_bcrypt is not a valid bcrypt hash: %v", err)
	}
	if cost > MaxEtcdBcryptCost {
		return nil, fmt.Errorf("etcd_password_bcrypt has cost %d: at most %d, since every login pays it (10 is etcd's default)", cost, MaxEtcdBcryptCost)
	}
	return []byte(h), nil
}

// EtcdAuthenticate checks an etcd user's password against the policy and
// returns a token for the "token" metadata of later calls, valid until
// now + EtcdTokenTTL. It takes as long whether or not the name exists.
func (p *Policy) EtcdAuthenticate(name, password string, now time.Time) (string, error) {
	hash, ok := p.etcdPasswords[name]
	if !ok {
		_ = bcrypt.CompareHashAndPassword(dummyHash(), []byte(password))
		return "", fmt.Errorf("%w: %q has no etcd password in the policy", ErrEtcdAuthFailed, name)
	}
	if err := bcrypt.CompareHashAndPassword(hash, []byte(password)); err != nil {
		return "", fmt.Errorf("%w: the password of %q does not match", ErrEtcdAuthFailed, name)
	}
	expires := now.Add(EtcdTokenTTL).Unix()
	return etcdTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(name)) + "." +
		strconv.FormatInt(expires, 10) + "." +
		base64.RawURLEncoding.EncodeToString(etcdMAC(hash, name, expires)), nil
}

// etcdMAC is the HMAC of an etcd token. The principal holds no control
// characters (checkPattern), so the NUL separators make it unambiguous.
func etcdMAC(key []byte, principal string, expires int64) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "tenure etcd token v1\x00%s\x00%d", principal, expires)
	return m.Sum(nil)
}

// IsEtcdToken reports whether token has the form of an etcd token (not
// whether it is valid).
func IsEtcdToken(token string) bool { return strings.HasPrefix(token, etcdTokenPrefix) }

// EtcdTokenPrincipal returns the principal an etcd token was issued to,
// if the token is still valid at now under this policy. Its errors match
// ErrInvalidToken and never repeat the token.
func (p *Policy) EtcdTokenPrincipal(token string, now time.Time) (string, error) {
	rest, ok := strings.CutPrefix(token, etcdTokenPrefix)
	parts := strings.Split(rest, ".")
	if !ok || len(parts) != 3 {
		return "", fmt.Errorf("%w: not an etcd token", ErrInvalidToken)
	}
	name, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	expires, err2 := strconv.ParseInt(parts[1], 10, 64)
	mac, err3 := base64.RawURLEncoding.DecodeString(parts[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return "", fmt.Errorf("%w: malformed etcd token", ErrInvalidToken)
	}
	principal := string(name)
	hash, ok := p.etcdPasswords[principal]
	if !ok || !hmac.Equal(mac, etcdMAC(hash, principal, expires)) {
		// One answer for both: a token of a removed principal and a
		// forged one look alike to the caller.
		return "", fmt.Errorf("%w: the etcd token is not one this policy issues (was the password of %q changed, or the principal removed?)", ErrInvalidToken, principal)
	}
	if at := time.Unix(expires, 0); !now.Before(at) {
		return "", fmt.Errorf("%w: the etcd token of %s expired at %s: authenticate again", ErrInvalidToken, principal, at.UTC().Format(time.RFC3339))
	}
	return principal, nil
}

// EtcdAuthenticate is Policy.EtcdAuthenticate under the policy in force,
// on the authenticator's clock.
func (a *Authenticator) EtcdAuthenticate(name, password string) (string, error) {
	return a.Policy.Policy().EtcdAuthenticate(name, password, a.now())
}
