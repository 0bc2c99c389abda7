package fence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want client.Token
	}{
		{"a plain token parses", "default/db-writer:42", tok("default", "db-writer", 42)},
		{"surrounding white space is ignored", "  prod/jobs:7 \t", tok("prod", "jobs", 7)},
		{"a name may hold ':'", "ns-1/a:b:9", tok("ns-1", "a:b", 9)},
		{"a name may be unicode", "default/écrivain:1", tok("default", "écrivain", 1)},
		{"the largest int64 is a token", "default/x:9223372036854775807", tok("default", "x", 9223372036854775807)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fence.Parse(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("got = %v, %v, expected: %v", got, err, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		why  string
	}{
		{"an empty value is refused", "", "empty value"},
		{"a value without a namespace is refused", "db-writer:42", "no '/' between namespace and name"},
		{"a value without a token is refused", "default/db-writer", "no ':' before the token"},
		{"a ':' only in the namespace does not count", "a:b/name", "no ':' before the token"},
		{"an empty token is refused", "default/db-writer:", "no token after ':'"},
		{"a signed token is refused", "default/db-writer:+5", `token "+5" is not a decimal number`},
		{"a negative token is refused", "default/db-writer:-5", `token "-5" is not a decimal number`},
		{"a hex token is refused", "default/db-writer:0x10", `token "0x10" is not a decimal number`},
		{"a token beyond int64 is refused", "default/x:9223372036854775808", "larger than an int64"},
		{"token zero is refused", "default/db-writer:0", "token must be positive, got 0"},
		{"an empty namespace is refused", "/db-writer:1", "namespace is empty"},
		{"an upper-case namespace is refused", "Default/db:1", "must be a DNS label"},
		{"an empty name is refused", "default/:1", "name is empty"},
		{"a control character in the name is refused", "default/a\x01b:1", "control character at byte 1"},
		{"invalid UTF-8 in the name is refused", "default/a\xffb:1", "not valid UTF-8"},
		{"a '/' in the name is refused, as the server does", "ns-1/a/b:9", `name "a/b" has a '/' at byte 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fence.Parse(tt.in)
			if !errors.Is(err, fence.ErrMalformed) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("got = %v, expected: ErrMalformed saying %q", err, tt.why)
			}
			if !strings.Contains(err.Error(), "want <namespace>/<name>:<token>") {
				t.Fatalf("got = %v, expected: the error to show the form", err)
			}
		})
	}
}

func TestFormatRoundTrips(t *testing.T) {
	for _, want := range []client.Token{
		tok("default", "db-writer", 42),
		tok("a", "x:z", 1),
		tok("team-7", "nightly report", 9223372036854775807),
	} {
		s := fence.Format(want)
		if s != want.String() {
			t.Fatalf("got = %q, expected: %q (client.Token.String)", s, want.String())
		}
		got, err := fence.Parse(s)
		if err != nil || got != want {
			t.Fatalf("Parse(Format(%v)): got = %v, %v, expected: %v", want, got, err, want)
		}
	}
	if got := fence.Format(tok("default", "db-writer", 7)); got != "default/db-writer:7" {
		t.Fatalf("got = %q, expected: default/db-writer:7", got)
	}
}
