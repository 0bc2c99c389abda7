package auth_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tenurehq/tenure/auth"
)

// answers is what a principal's grants say to a fixed set of questions,
// for comparing two parses of one file.
type answers struct {
	known    bool
	limits   auth.Limits
	verdicts []bool
}

var (
	fuzzVerbs      = []auth.Verb{auth.Read, auth.Validate, auth.Lock, auth.Write, auth.Admin}
	fuzzNamespaces = []string{"default", "team-a", "team-b", "x"}
	fuzzKeys       = []string{"", "team-a/", "team-a/x", "x"}
	fuzzIdentities = []string{"", "a", "a/1", "x", "*"}
)

func ask(g *auth.Grants) answers {
	a := answers{known: g.Known(), limits: g.Limits}
	for _, v := range fuzzVerbs {
		a.verdicts = append(a.verdicts, g.AnyNamespace(v), g.AllNamespaces(v), g.AnyKey(v))
		for _, ns := range fuzzNamespaces {
			a.verdicts = append(a.verdicts, g.Namespace(v, ns))
		}
		for _, k := range fuzzKeys {
			a.verdicts = append(a.verdicts, g.Key(v, k), g.KeyPrefix(v, k))
		}
	}
	for _, id := range fuzzIdentities {
		a.verdicts = append(a.verdicts, g.Identity(id))
	}
	a.verdicts = append(a.verdicts, g.ClusterAdmin(), g.DefaultIdentity() == g.Principal)
	return a
}

// Parse never panics. It refuses a file with an ErrPolicy error, or
// accepts it and then: For answers for any name without panicking; every
// entry's name is a principal the policy knows; limits are never
// negative, and a rate comes with a burst of at least 1; and parsing the
// same bytes again gives the same verdict and the same answers.
func FuzzParsePolicy(f *testing.F) {
	for _, p := range []string{fullPolicy(), grantsPolicy, limitsPolicy, alicePolicy, bobPolicy, badPolicy} {
		f.Add([]byte(p))
	}
	for _, tt := range parseErrorTests {
		f.Add([]byte(tt.policy))
	}
	f.Add([]byte("principals: [{name: a, limits: {requests_per_second: 1e300}}]"))
	f.Add([]byte("principals: [{name: '*', identities: ['*'], limits: {burst: 9223372036854775807}}]"))

	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := auth.Parse(data)
		again, errAgain := auth.Parse(data)
		if (err == nil) != (errAgain == nil) {
			t.Fatalf("two parses of the same bytes got = %v and %v, expected: the same verdict", err, errAgain)
		}
		if err != nil {
			if !errors.Is(err, auth.ErrPolicy) {
				t.Fatalf("errors.Is(%v, ErrPolicy) got = false, expected: true", err)
			}
			return
		}
		switch m := p.Metrics(); m {
		case auth.MetricsAuthenticated, auth.MetricsOpen, auth.MetricsAdmin:
		default:
			t.Fatalf("Metrics() got = %q, expected: authenticated, open or admin", m)
		}

		var file auth.File
		if err := yaml.Unmarshal(data, &file); err != nil {
			t.Fatalf("Parse accepted the file but yaml.Unmarshal got = %v, expected: nil", err)
		}
		var entries []string
		for _, e := range file.Principals {
			entries = append(entries, e.Name)
		}
		names := append([]string{"", "a", "x", "a/b", "*", "team-a", "admin", "\x00"}, entries...)
		for _, name := range names {
			g := p.For(name)
			if g.Principal != name {
				t.Fatalf("For(%q).Principal got = %q, expected: %q", name, g.Principal, name)
			}
			if slices.Contains(entries, name) && !g.Known() {
				t.Fatalf("For(%q).Known() got = false, expected: true, as an entry names it", name)
			}
			if l := g.Limits; l.RequestsPerSecond < 0 || l.Burst < 0 || l.Sessions < 0 || l.Waits < 0 || l.Watches < 0 {
				t.Fatalf("For(%q).Limits got = %+v, expected: none negative", name, l)
			}
			if l := g.Limits; l.RequestsPerSecond > 0 && l.Burst < 1 {
				t.Fatalf("For(%q).Limits got = %+v, expected: a burst of at least 1 with a rate", name, l)
			}
			if got, want := ask(g), ask(again.For(name)); got.known != want.known || got.limits != want.limits || !slices.Equal(got.verdicts, want.verdicts) {
				t.Fatalf("For(%q) on two parses of the same bytes got = %+v and %+v, expected: the same", name, got, want)
			}
		}
	})
}

// bearerErrors are all the messages ParseBearer's errors may have: none
// holds any part of the header.
var bearerErrors = []string{
	auth.ErrNoCredentials.Error(),
	`the Authorization header is not "Bearer <token>"`,
	"the Authorization header's bearer token is empty",
	"the bearer token is longer than 512 bytes",
	"the bearer token holds a character outside printable ASCII",
}

// ParseBearer never panics. Its errors are fixed messages that hold no
// part of the header (a header of more than 8 characters never appears
// in one, unless it is a piece of the message's own words). A token it
// returns is a part of the header, of 1 to 512 printable ASCII characters
// without spaces, and is read back the same.
func FuzzParseBearer(f *testing.F) {
	for _, h := range []string{
		"", "Bearer", "Bearer ", "Bearer tnr_abc", "bearer  tnr_abc  ", "Basic dXNlcjpwYXNz",
		"Bearer tnr_a b", "Bearer tnr_\x00", "Bearer tnr_\x7f", "Bearer tnr_é", "Bearer\ttnr_abc",
		"Bearer " + strings.Repeat("x", 512), "Bearer " + strings.Repeat("x", 513), "header is not",
	} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, header string) {
		token, err := auth.ParseBearer(header)
		if err != nil {
			if token != "" {
				t.Fatalf("ParseBearer(%q) got = %q with error %v, expected: no token", header, token, err)
			}
			if !slices.Contains(bearerErrors, err.Error()) {
				t.Fatalf("ParseBearer(%q) error got = %q, expected: one of the fixed messages", header, err)
			}
			ownWords := strings.Contains(strings.Join(bearerErrors, "\n"), header)
			if len(header) > 8 && !ownWords && strings.Contains(err.Error(), header) {
				t.Fatalf("ParseBearer(%q) error got = %q, expected: the header not in it", header, err)
			}
			if errors.Is(err, auth.ErrNoCredentials) != (header == "") {
				t.Fatalf("ParseBearer(%q) errors.Is(err, ErrNoCredentials) got = %v, expected: only for no header", header, errors.Is(err, auth.ErrNoCredentials))
			}
			return
		}
		if len(token) == 0 || len(token) > 512 {
			t.Fatalf("ParseBearer(%q) token got = %d bytes, expected: 1 to 512", header, len(token))
		}
		for i := 0; i < len(token); i++ {
			if c := token[i]; c <= ' ' || c >= 0x7f {
				t.Fatalf("ParseBearer(%q) token got = %q, holding %q at %d, expected: printable ASCII without spaces", header, token, c, i)
			}
		}
		if !strings.Contains(header, token) {
			t.Fatalf("ParseBearer(%q) token got = %q, expected: a part of the header", header, token)
		}
		if again, err := auth.ParseBearer("Bearer " + token); again != token || err != nil {
			t.Fatalf("ParseBearer(Bearer %q) got = %q, %v, expected: the token, nil", token, again, err)
		}
	})
}
