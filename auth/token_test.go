package auth_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/auth"
)

// NewToken returns a different token each time: "tnr_" and 32 random
// bytes in unpadded base64url, which ParseBearer accepts as they are.
func TestNewToken(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := auth.NewToken()
		if seen[tok] {
			t.Fatalf("NewToken got = %q twice, expected: a new token each time", tok)
		}
		seen[tok] = true
		body, ok := strings.CutPrefix(tok, "tnr_")
		if !ok {
			t.Fatalf("NewToken got = %q, expected: the tnr_ prefix", tok)
		}
		if b, err := base64.RawURLEncoding.DecodeString(body); err != nil || len(b) != 32 {
			t.Fatalf("NewToken body got = %d bytes, %v, expected: 32 bytes of base64url", len(b), err)
		}
		if got, err := auth.ParseBearer("Bearer " + tok); got != tok || err != nil {
			t.Fatalf("ParseBearer(Bearer <new token>) got = %q, %v, expected: the token, nil", got, err)
		}
	}
}

// HashToken is "sha256:" and the token's SHA-256 in lowercase hex.
func TestHashToken(t *testing.T) {
	const tok = "tnr_example"
	sum := sha256.Sum256([]byte(tok))
	want := "sha256:" + hex.EncodeToString(sum[:])
	if got := auth.HashToken(tok); got != want {
		t.Errorf("HashToken got = %q, expected: %q", got, want)
	}
	if got := auth.HashToken(tok); strings.ToLower(got) != got || len(got) != len("sha256:")+64 {
		t.Errorf("HashToken got = %q, expected: sha256: and 64 lowercase hex digits", got)
	}
	if auth.HashToken("tnr_a") == auth.HashToken("tnr_b") {
		t.Errorf("HashToken of two tokens got = equal, expected: different")
	}
}

// TokenPrincipal names the principal a token was issued to until the
// token expires; an unknown or expired token is refused with an error
// that never holds the token.
func TestTokenPrincipal(t *testing.T) {
	p := mustParse(t, fullPolicy())
	tests := []struct {
		name    string
		token   string
		now     time.Time
		want    string
		wantErr string
	}{
		{"A token without expiry works at any time.", adminToken, time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), "admin", ""},
		{"A token works until just before it expires.", schedulerToken, tokenExpiry.Add(-time.Nanosecond), "scheduler", ""},
		{"A token no longer works at its expiry, and the error says so and whose it was.", schedulerToken, tokenExpiry, "", "expired at 2030-01-01T00:00:00Z"},
		{"A token no longer works after its expiry.", schedulerToken, tokenExpiry.Add(time.Hour), "", "scheduler expired"},
		{"A token the policy does not know is refused.", "tnr_guessed-token-guessed-token", tokenExpiry, "", "not one the policy knows"},
		{"A token's hash is not a token.", auth.HashToken(adminToken), tokenExpiry, "", "not one the policy knows"},
		{"The empty token is refused.", "", tokenExpiry, "", "not one the policy knows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.TokenPrincipal(tt.token, tt.now)
			if got != tt.want {
				t.Errorf("principal got = %q, expected: %q", got, tt.want)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("err got = %v, expected: nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("err got = %v, expected: an error holding %q", err, tt.wantErr)
			case err != nil && tt.token != "" && strings.Contains(err.Error(), tt.token):
				t.Errorf("err got = %q, expected: no token text in it", err)
			}
		})
	}
}

// A token hash written with uppercase hex matches the token all the same.
func TestTokenHashCase(t *testing.T) {
	upper := "sha256:" + strings.ToUpper(strings.TrimPrefix(auth.HashToken("tnr_upper"), "sha256:"))
	p := mustParse(t, fmt.Sprintf("principals: [{name: a, tokens: [{sha256: %q}]}]", upper))
	if got, err := p.TokenPrincipal("tnr_upper", time.Now()); got != "a" || err != nil {
		t.Errorf("got = %q, %v, expected: a, nil", got, err)
	}
}

// ParseBearer reads "Bearer <token>": the scheme in any case, the token
// printable ASCII of at most 512 bytes. No credentials is
// ErrNoCredentials; any other failure is an error that never repeats the
// header.
func TestParseBearer(t *testing.T) {
	long := "tnr_" + strings.Repeat("x", 509)
	tests := []struct {
		name    string
		header  string
		want    string
		wantErr string
		noCreds bool
	}{
		{name: "A bearer token is read.", header: "Bearer tnr_abc-DEF_123", want: "tnr_abc-DEF_123"},
		{name: "The scheme is read in any case.", header: "bEARER tnr_abc", want: "tnr_abc"},
		{name: "Spaces around the token are dropped.", header: "Bearer   tnr_abc  ", want: "tnr_abc"},
		{name: "A token of 512 bytes is read.", header: "Bearer " + long[:512], want: long[:512]},
		{name: "No header is no credentials.", header: "", noCreds: true, wantErr: "no credentials"},
		{name: "Another scheme is refused.", header: "Basic dXNlcjpwYXNzd29yZA==", wantErr: `not "Bearer <token>"`},
		{name: "A token without a scheme is refused.", header: "tnr_secret-without-scheme", wantErr: `not "Bearer <token>"`},
		{name: "A scheme and a tab is refused.", header: "Bearer\ttnr_secret-after-tab", wantErr: `not "Bearer <token>"`},
		{name: "The scheme alone is refused.", header: "Bearer", wantErr: `not "Bearer <token>"`},
		{name: "An empty token is refused.", header: "Bearer ", wantErr: "empty"},
		{name: "A blank token is refused.", header: "Bearer    ", wantErr: "empty"},
		{name: "A token over 512 bytes is refused.", header: "Bearer " + long, wantErr: "longer than 512 bytes"},
		{name: "A token holding a space is refused.", header: "Bearer tnr_secret part2", wantErr: "outside printable ASCII"},
		{name: "A token holding a control character is refused.", header: "Bearer tnr_secret\x00part2", wantErr: "outside printable ASCII"},
		{name: "A token holding DEL is refused.", header: "Bearer tnr_secret\x7fpart2", wantErr: "outside printable ASCII"},
		{name: "A token holding a newline is refused.", header: "Bearer tnr_secret\r\nX-Injected: 1", wantErr: "outside printable ASCII"},
		{name: "A token holding non-ASCII is refused.", header: "Bearer tnr_sécret", wantErr: "outside printable ASCII"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := auth.ParseBearer(tt.header)
			if got != tt.want {
				t.Errorf("token got = %q, expected: %q", got, tt.want)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("err got = %v, expected: nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err got = %v, expected: an error holding %q", err, tt.wantErr)
			}
			if got := errors.Is(err, auth.ErrNoCredentials); got != tt.noCreds {
				t.Errorf("errors.Is(err, ErrNoCredentials) got = %v, expected: %v", got, tt.noCreds)
			}
			if rest := strings.TrimPrefix(tt.header, "Bearer "); len(rest) > 8 && strings.Contains(err.Error(), rest) {
				t.Errorf("err got = %q, expected: no part of the header in it", err)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("err got = %q, expected: no part of the token in it", err)
			}
		})
	}
}
