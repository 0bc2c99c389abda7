package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// tokenPrefix marks Tenure tokens, so that one found in a repository or a
// log is recognised for what it is (as GitHub's "ghp_").
const tokenPrefix = "tnr_"

// NewToken returns a fresh random token: 32 bytes from crypto/rand.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand's contract since Go 1.24)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashToken is what a policy file stores for token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// parseHash checks a stored hash and returns it in canonical form.
func parseHash(h string) (string, error) {
	hexPart, ok := strings.CutPrefix(h, "sha256:")
	if !ok {
		if strings.HasPrefix(h, tokenPrefix) {
			return "", errors.New(`sha256 holds a token, not its hash: store what "tenure auth token" prints as sha256 and give the token only to its holder`)
		}
		return "", fmt.Errorf(`sha256 %q: want "sha256:" and 64 hex digits`, h)
	}
	if len(hexPart) != 64 {
		return "", fmt.Errorf("sha256: want 64 hex digits after \"sha256:\", got %d characters", len(hexPart))
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", errors.New("sha256: not hex after \"sha256:\"")
	}
	return "sha256:" + strings.ToLower(hexPart), nil
}

// ErrNoCredentials is returned by ParseBearer for a request without an
// Authorization header.
var ErrNoCredentials = errors.New("no credentials")

// maxTokenBytes bounds a bearer token: ours are 47 bytes.
const maxTokenBytes = 512

// ParseBearer reads an Authorization header's bearer token. Its errors
// never repeat the header, which may be a secret.
func ParseBearer(header string) (string, error) {
	if header == "" {
		return "", ErrNoCredentials
	}
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New(`the Authorization header is not "Bearer <token>"`)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", errors.New("the Authorization header's bearer token is empty")
	}
	if err := checkToken(token); err != nil {
		return "", err
	}
	return token, nil
}

// checkToken refuses a token no issuer of ours makes: too long, or
// holding what is not printable ASCII. Its errors never repeat the
// token.
func checkToken(token string) error {
	if len(token) > maxTokenBytes {
		return fmt.Errorf("the bearer token is longer than %d bytes", maxTokenBytes)
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c >= 0x7f {
			return errors.New("the bearer token holds a character outside printable ASCII")
		}
	}
	return nil
}
