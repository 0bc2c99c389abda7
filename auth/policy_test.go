package auth_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tenurehq/tenure/auth"
)

// Tokens of the full policy. Tests hold them; the policy holds their
// hashes.
const (
	adminToken     = "tnr_admin-token-for-tests-only"
	schedulerToken = "tnr_scheduler-token-for-tests-only"
)

// tokenExpiry is when schedulerToken stops working.
var tokenExpiry = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// fullPolicy uses every part of a policy file: roles on namespaces and
// keys, principals by name and by pattern, identities, tokens with and
// without expiry, limits, defaults and metrics.
func fullPolicy() string {
	return fmt.Sprintf(`
metrics: admin
defaults:
  requests_per_second: 100
  sessions: 50
roles:
  ops:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
  team-a:
    - namespaces: [team-a, "team-a-*"]
      verbs: [read, lock]
    - keys: ["team-a/"]
      verbs: [read, write]
  checker:
    - namespaces: ["*"]
      verbs: [validate]
principals:
  - name: admin
    roles: [ops]
    tokens:
      - sha256: %q
  - name: scheduler
    roles: [team-a]
    identities: ["sched-*"]
    tokens:
      - sha256: %q
        expires: %s
    limits:
      requests_per_second: 10
      burst: 5
      sessions: 3
  - name: "team-a-*"
    roles: [team-a]
  - name: fence-checker
    roles: [checker]
`, auth.HashToken(adminToken), auth.HashToken(schedulerToken), tokenExpiry.Format(time.RFC3339))
}

func mustParse(t testing.TB, policy string) *auth.Policy {
	t.Helper()
	p, err := auth.Parse([]byte(policy))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

// A policy using every feature parses, and means what it says.
func TestParseFullPolicy(t *testing.T) {
	p := mustParse(t, fullPolicy())

	if got := p.Metrics(); got != auth.MetricsAdmin {
		t.Errorf("Metrics() got = %q, expected: %q", got, auth.MetricsAdmin)
	}
	if got, err := p.TokenPrincipal(adminToken, tokenExpiry); got != "admin" || err != nil {
		t.Errorf("TokenPrincipal(admin's token) got = %q, %v, expected: admin, nil", got, err)
	}
	if got, err := p.TokenPrincipal(schedulerToken, tokenExpiry.Add(-time.Hour)); got != "scheduler" || err != nil {
		t.Errorf("TokenPrincipal(scheduler's token) got = %q, %v, expected: scheduler, nil", got, err)
	}

	admin := p.For("admin")
	if !admin.ClusterAdmin() || !admin.Key(auth.Write, "any/key") {
		t.Errorf("admin: ClusterAdmin %v, Key(write) %v, expected: true, true", admin.ClusterAdmin(), admin.Key(auth.Write, "any/key"))
	}
	sched := p.For("scheduler")
	if got, want := sched.Limits, (auth.Limits{RequestsPerSecond: 10, Burst: 5, Sessions: 3}); got != want {
		t.Errorf("scheduler limits got = %+v, expected: %+v", got, want)
	}
	if !sched.Identity("sched-1") || sched.Identity("scheduler") {
		t.Errorf("scheduler: Identity(sched-1) %v, Identity(scheduler) %v, expected: true, false", sched.Identity("sched-1"), sched.Identity("scheduler"))
	}
	if !sched.Namespace(auth.Lock, "team-a-blue") || sched.Namespace(auth.Lock, "team-b") {
		t.Errorf("scheduler: lock team-a-blue %v, lock team-b %v, expected: true, false", sched.Namespace(auth.Lock, "team-a-blue"), sched.Namespace(auth.Lock, "team-b"))
	}
	pattern := p.For("team-a-ci")
	if !pattern.Known() || !pattern.Key(auth.Write, "team-a/ci") {
		t.Errorf("team-a-ci: Known %v, write team-a/ci %v, expected: true, true", pattern.Known(), pattern.Key(auth.Write, "team-a/ci"))
	}
	if got, want := pattern.Limits, (auth.Limits{RequestsPerSecond: 100, Burst: 200, Sessions: 50}); got != want {
		t.Errorf("team-a-ci limits (the defaults) got = %+v, expected: %+v", got, want)
	}
	checker := p.For("fence-checker")
	if !checker.Namespace(auth.Validate, "team-a") || checker.Namespace(auth.Read, "team-a") {
		t.Errorf("fence-checker: validate %v, read %v, expected: true, false", checker.Namespace(auth.Validate, "team-a"), checker.Namespace(auth.Read, "team-a"))
	}
}

// The metrics setting defaults to "authenticated".
func TestParseMetricsDefault(t *testing.T) {
	p := mustParse(t, "principals: [{name: a}]")
	if got := p.Metrics(); got != auth.MetricsAuthenticated {
		t.Errorf("Metrics() got = %q, expected: %q", got, auth.MetricsAuthenticated)
	}
}

// minimal wraps principals and roles into a policy that is valid but for
// what the test puts in them.
const okRoles = "roles: {r: [{namespaces: [team-a], verbs: [read]}]}\n"

// parseErrorTests are files Parse must refuse, each with the text its
// error must hold: where the mistake is, and what it is.
var parseErrorTests = []struct {
	name   string
	policy string
	want   []string
}{
	{
		name:   "A field the policy does not have is refused, by name.",
		policy: okRoles + "principals: [{name: a, roles: [r], role: x}]",
		want:   []string{`unknown field`, `role`},
	},
	{
		name:   "A misspelt top-level field is refused, by name.",
		policy: okRoles + "principals: [{name: a}]\ndefault: {sessions: 1}",
		want:   []string{`unknown field`, `default`},
	},
	{
		name:   "A role no roles entry defines is refused, naming the principal and the role.",
		policy: okRoles + "principals: [{name: a, roles: [r]}, {name: b, roles: [nope]}]",
		want:   []string{`principals[1] (b)`, `role "nope"`},
	},
	{
		name:   "A verb Tenure does not know is refused, naming the role and the rule.",
		policy: "roles: {r: [{namespaces: [team-a], verbs: [read]}, {namespaces: [x], verbs: [delete]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[1]`, `verb "delete"`},
	},
	{
		name:   "A policy with no principals is refused.",
		policy: okRoles,
		want:   []string{`principals: none`},
	},
	{
		name:   "A policy with an empty principals list is refused.",
		policy: okRoles + "principals: []",
		want:   []string{`principals: none`},
	},
	{
		name:   "A principal with no name is refused.",
		policy: okRoles + "principals: [{name: a}, {roles: [r]}]",
		want:   []string{`principals[1]: no name`},
	},
	{
		name:   "Tokens on a pattern name are refused: a token is one principal's.",
		policy: okRoles + fmt.Sprintf("principals: [{name: team-*, tokens: [{sha256: %q}]}]", auth.HashToken("tnr_x")),
		want:   []string{`principals[0] (team-*)`, `tokens need one principal`},
	},
	{
		name:   "A raw token stored as sha256 is refused, without repeating it.",
		policy: okRoles + "principals: [{name: a, tokens: [{sha256: tnr_secretsecretsecret}]}]",
		want:   []string{`principals[0] (a): tokens[0]`, `holds a token, not its hash`},
	},
	{
		name:   "A sha256 without the sha256: prefix is refused.",
		policy: okRoles + "principals: [{name: a, tokens: [{sha256: abcd}]}]",
		want:   []string{`principals[0] (a): tokens[0]`, `"sha256:" and 64 hex digits`},
	},
	{
		name:   "A sha256 with too few hex digits is refused.",
		policy: okRoles + "principals: [{name: a, tokens: [{sha256: 'sha256:abcd'}]}]",
		want:   []string{`principals[0] (a): tokens[0]`, `want 64 hex digits`, `got 4 characters`},
	},
	{
		name:   "A sha256 that is not hex is refused.",
		policy: okRoles + "principals: [{name: a, tokens: [{sha256: 'sha256:" + strings.Repeat("zz", 32) + "'}]}]",
		want:   []string{`principals[0] (a): tokens[0]`, `not hex`},
	},
	{
		name: "The same token given to two principals is refused, naming both, even with the hex cased differently.",
		policy: okRoles + fmt.Sprintf("principals: [{name: a, tokens: [{sha256: %q}]}, {name: b, tokens: [{sha256: %q}]}]",
			auth.HashToken("tnr_shared"), "sha256:"+strings.ToUpper(strings.TrimPrefix(auth.HashToken("tnr_shared"), "sha256:"))),
		want: []string{`principals[1] (b): tokens[0]`, `also a's`},
	},
	{
		name:   "A namespace that is not a DNS label is refused, naming it.",
		policy: "roles: {r: [{namespaces: [Team_A], verbs: [read]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `namespace "Team_A"`, `DNS label`},
	},
	{
		name:   "An empty namespace is refused.",
		policy: "roles: {r: [{namespaces: [''], verbs: [read]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `namespace ""`, `empty`},
	},
	{
		name:   "A '*' inside a key prefix is refused: it may only end one.",
		policy: "roles: {r: [{keys: ['team-*/config'], verbs: [read]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `key prefix "team-*/config"`, `may only end it`},
	},
	{
		name:   "An empty key prefix is refused: every key is written \"*\".",
		policy: "roles: {r: [{keys: [''], verbs: [read]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `key prefix ""`, `empty`},
	},
	{
		name:   "A negative request rate is refused, naming the principal.",
		policy: okRoles + "principals: [{name: a, limits: {requests_per_second: -1}}]",
		want:   []string{`principals[0] (a).limits`, `requests_per_second -1`},
	},
	{
		name:   "A negative burst is refused, naming the principal.",
		policy: okRoles + "principals: [{name: a, limits: {burst: -2}}]",
		want:   []string{`principals[0] (a).limits`, `burst -2`},
	},
	{
		name:   "A negative session limit is refused, naming the principal.",
		policy: okRoles + "principals: [{name: a, limits: {sessions: -3}}]",
		want:   []string{`principals[0] (a).limits`, `sessions -3`},
	},
	{
		name:   "A negative wait limit is refused, naming the principal.",
		policy: okRoles + "principals: [{name: a, limits: {waits: -1}}]",
		want:   []string{`principals[0] (a).limits`, `waits -1`, `0 (no limit) or more`},
	},
	{
		name:   "A negative watch limit is refused, naming the principal.",
		policy: okRoles + "principals: [{name: a, limits: {watches: -4}}]",
		want:   []string{`principals[0] (a).limits`, `watches -4`},
	},
	{
		name:   "A negative default watch limit is refused, naming the defaults.",
		policy: okRoles + "principals: [{name: a}]\ndefaults: {watches: -1}",
		want:   []string{`defaults`, `watches -1`},
	},
	{
		name:   "A negative default is refused, naming the defaults.",
		policy: okRoles + "principals: [{name: a}]\ndefaults: {sessions: -1}",
		want:   []string{`defaults`, `sessions -1`},
	},
	{
		name:   "Write on a rule that names only namespaces is refused: write is for keys.",
		policy: "roles: {r: [{namespaces: [team-a], verbs: [read, write]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `verb "write" applies to keys`},
	},
	{
		name:   "Lock on a rule that names only keys is refused: lock is for namespaces.",
		policy: "roles: {r: [{keys: [team-a/], verbs: [read, lock]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `verb "lock" applies to namespaces`},
	},
	{
		name:   "Validate on a rule that names only keys is refused.",
		policy: "roles: {r: [{keys: [team-a/], verbs: [validate]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `verb "validate" applies to namespaces`},
	},
	{
		name:   "A metrics value other than authenticated, open or admin is refused.",
		policy: okRoles + "principals: [{name: a}]\nmetrics: public",
		want:   []string{`metrics`, `"public"`},
	},
	{
		name:   "A role with no rules is refused.",
		policy: "roles: {r: []}\nprincipals: [{name: a}]",
		want:   []string{`roles.r: no rules`},
	},
	{
		name:   "A rule with no verbs is refused.",
		policy: "roles: {r: [{namespaces: [team-a]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `no verbs`},
	},
	{
		name:   "A rule with neither namespaces nor keys is refused.",
		policy: "roles: {r: [{verbs: [read]}]}\nprincipals: [{name: a}]",
		want:   []string{`roles.r[0]`, `neither namespaces nor keys`},
	},
	{
		name:   "An identity holding a control character is refused, naming the principal.",
		policy: okRoles + "principals: [{name: a, identities: [\"x\\ty\"]}]",
		want:   []string{`principals[0] (a): identity`, `control character`},
	},
	{
		name:   "A file that is not YAML is refused.",
		policy: "principals: [",
		want:   []string{`invalid policy`},
	},
}

// Parse refuses each kind of mistake with an error that says where it is
// and matches ErrPolicy.
func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := auth.Parse([]byte(tt.policy))
			if err == nil {
				t.Fatalf("Parse got = %v, nil, expected: an error holding %q", p, tt.want)
			}
			if !errors.Is(err, auth.ErrPolicy) {
				t.Errorf("errors.Is(%v, ErrPolicy) got = false, expected: true", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error got = %q, expected: it to hold %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "tnr_secret") {
				t.Errorf("error got = %q, expected: no token text in it", err)
			}
		})
	}
}

// Match: '*' stands for any run of characters, even none; everything else
// for itself.
func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"alice", "alice", true},
		{"alice", "alic", false},
		{"alice", "alice2", false},
		{"", "", true},
		{"", "a", false},
		{"*", "", true},
		{"*", "anything/at all", true},
		{"team-*", "team-", true},
		{"team-*", "team-a", true},
		{"team-*", "team", false},
		{"*-prod", "db-prod", true},
		{"*-prod", "db-prod-2", false},
		{"a*z", "az", true},
		{"a*z", "abcz", true},
		{"a*z", "abczy", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a*a", "aba", true},
		{"*b*b", "b", false},
		{"*b*b", "bb", true},
		{"*b*b", "abab", true},
		{"*b*b", "abba", false},
		{"*a*", "", false},
		{"*a*", "bab", true},
		{"**", "", true},
		{"a**b", "ab", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "acb", false},
		{"a*b*c", "aXbYbZc", true},
		{"ab*ba", "aba", false},
		{"ab*ba", "abba", true},
		{"*ab", "aab", true},
		{"x/*/y", "x//y", true},
		{"x/*/y", "x/1/2/y", true},
	}
	for _, tt := range tests {
		if got := auth.Match(tt.pattern, tt.name); got != tt.want {
			t.Errorf("Match(%q, %q) got = %v, expected: %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

// matchRef is Match by its definition, one character at a time: '*'
// matches nothing or eats one character and stays.
func matchRef(pattern, name string) bool {
	switch {
	case pattern == "":
		return name == ""
	case pattern[0] == '*':
		return matchRef(pattern[1:], name) || name != "" && matchRef(pattern, name[1:])
	default:
		return name != "" && pattern[0] == name[0] && matchRef(pattern[1:], name[1:])
	}
}

// Match agrees with the definition on every pattern and name, drawn from
// a small alphabet so that near misses are common.
func TestMatchProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pattern := rapid.StringOfN(rapid.SampledFrom([]rune("ab*")), 0, 8, -1).Draw(t, "pattern")
		name := rapid.StringOfN(rapid.SampledFrom([]rune("ab*")), 0, 10, -1).Draw(t, "name")
		if got, want := auth.Match(pattern, name), matchRef(pattern, name); got != want {
			t.Fatalf("Match(%q, %q) got = %v, expected: %v", pattern, name, got, want)
		}
	})
}

// A pattern matches itself, as a policy entry's name matches the
// principal it names, '*' being a character like the others.
func TestMatchSelfProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := rapid.String().Draw(t, "pattern")
		if !auth.Match(p, p) {
			t.Fatalf("Match(%q, itself) got = false, expected: true", p)
		}
	})
}

// grantsPolicy gives principals overlapping entries, so that each
// question below has one rule that decides it.
const grantsPolicy = `
roles:
  reader:
    - namespaces: [team-a]
      verbs: [read]
  validator:
    - namespaces: [payments]
      verbs: [validate]
  locker:
    - namespaces: ["team-*"]
      verbs: [lock]
  team-keys:
    - keys: ["team-a/"]
      verbs: [read, write]
  star-keys:
    - keys: ["config/*"]
      verbs: [read]
  all-keys:
    - keys: ["*"]
      verbs: [read]
  root:
    - namespaces: ["*"]
      verbs: [admin, read]
  team-admin:
    - namespaces: ["team-a", "team-*"]
      verbs: [admin]
  watcher:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write]
principals:
  - name: alice
    roles: [reader]
  - name: alice
    roles: [validator]
  - name: "team-*"
    roles: [locker]
  - name: root
    roles: [root, all-keys]
  - name: lead
    roles: [team-admin, team-keys, star-keys]
  - name: bot
    roles: [reader]
    identities: ["worker-*", "batch"]
  - name: hybrid
    roles: [reader]
    identities: ["worker-*"]
  - name: "hy*"
    roles: []
  - name: nobody-roles
  - name: auditor
    roles: [watcher]
`

// For(principal) answers from the union of every entry that names the
// principal, and nothing else.
func TestGrants(t *testing.T) {
	p := mustParse(t, grantsPolicy)
	tests := []struct {
		name      string
		principal string
		ask       func(g *auth.Grants) bool
		want      bool
	}{
		{"A principal named by the policy is known.", "alice", (*auth.Grants).Known, true},
		{"A principal the policy never names is not known.", "mallory", (*auth.Grants).Known, false},
		{"A principal named only through a pattern is known.", "team-b", (*auth.Grants).Known, true},
		{"A principal with an entry but no roles is known.", "nobody-roles", (*auth.Grants).Known, true},
		{"A principal with an entry but no roles may do nothing.", "nobody-roles", func(g *auth.Grants) bool { return g.AnyNamespace(auth.Read) || g.AnyKey(auth.Read) }, false},
		{"An unknown principal may read nothing.", "mallory", func(g *auth.Grants) bool { return g.Namespace(auth.Read, "team-a") || g.AnyNamespace(auth.Validate) }, false},
		{"An unknown principal may read no key.", "mallory", func(g *auth.Grants) bool { return g.Key(auth.Read, "team-a/x") || g.AnyKey(auth.Read) }, false},
		{"An unknown principal may hold as no identity, not even its own name.", "mallory", func(g *auth.Grants) bool { return g.Identity("mallory") }, false},

		{"The first of a principal's entries grants its roles.", "alice", func(g *auth.Grants) bool { return g.Namespace(auth.Read, "team-a") }, true},
		{"The second of a principal's entries grants its roles too.", "alice", func(g *auth.Grants) bool { return g.Namespace(auth.Validate, "payments") }, true},
		{"A pattern entry adds its roles to a principal it matches.", "team-a", func(g *auth.Grants) bool { return g.Namespace(auth.Lock, "team-z") }, true},
		{"A verb no entry grants is not allowed.", "alice", func(g *auth.Grants) bool { return g.Namespace(auth.Lock, "team-a") }, false},

		{"Read includes validate.", "alice", func(g *auth.Grants) bool { return g.Namespace(auth.Validate, "team-a") }, true},
		{"Validate does not include read.", "alice", func(g *auth.Grants) bool { return g.Namespace(auth.Read, "payments") }, false},
		{"Read includes validate for AnyNamespace too.", "bot", func(g *auth.Grants) bool { return g.AnyNamespace(auth.Validate) }, true},

		{"A literal namespace allows only itself.", "alice", func(g *auth.Grants) bool { return g.Namespace(auth.Read, "team-ab") }, false},
		{"A namespace pattern allows what it matches.", "lead", func(g *auth.Grants) bool { return g.Namespace(auth.Admin, "team-q") }, true},
		{"A namespace pattern allows nothing it does not match.", "lead", func(g *auth.Grants) bool { return g.Namespace(auth.Admin, "payments") }, false},
		{"AnyNamespace is true with a rule on some namespace.", "team-b", func(g *auth.Grants) bool { return g.AnyNamespace(auth.Lock) }, true},
		{"AnyNamespace ignores rules that name only keys.", "lead", func(g *auth.Grants) bool { return g.AnyNamespace(auth.Read) }, false},

		{"AllNamespaces holds with \"*\".", "root", func(g *auth.Grants) bool { return g.AllNamespaces(auth.Read) }, true},
		{"AllNamespaces does not hold with a pattern that is not \"*\", however wide.", "lead", func(g *auth.Grants) bool { return g.AllNamespaces(auth.Admin) }, false},
		{"Admin on \"*\" is the cluster administrator.", "root", (*auth.Grants).ClusterAdmin, true},
		{"Admin on some namespaces is not the cluster administrator.", "lead", (*auth.Grants).ClusterAdmin, false},
		{"Every verb but admin on \"*\" is not the cluster administrator.", "auditor", (*auth.Grants).ClusterAdmin, false},
		{"AllNamespaces holds for each verb a \"*\" rule grants.", "auditor", func(g *auth.Grants) bool { return g.AllNamespaces(auth.Lock) && g.AllNamespaces(auth.Validate) }, true},

		{"A key prefix covers a key under it.", "lead", func(g *auth.Grants) bool { return g.Key(auth.Write, "team-a/x") }, true},
		{"A key prefix covers the prefix itself as a key.", "lead", func(g *auth.Grants) bool { return g.Key(auth.Write, "team-a/") }, true},
		{"A key prefix does not cover a key outside it.", "lead", func(g *auth.Grants) bool { return g.Key(auth.Write, "team-b/x") }, false},
		{"A key prefix does not cover a shorter key.", "lead", func(g *auth.Grants) bool { return g.Key(auth.Read, "team-a") }, false},
		{"A key prefix covers a longer prefix under it.", "lead", func(g *auth.Grants) bool { return g.KeyPrefix(auth.Read, "team-a/sub") }, true},
		{"A key prefix covers itself as a prefix.", "lead", func(g *auth.Grants) bool { return g.KeyPrefix(auth.Read, "team-a/") }, true},
		{"A key prefix does not cover a shorter prefix, which holds other teams' keys.", "lead", func(g *auth.Grants) bool { return g.KeyPrefix(auth.Read, "team-") }, false},
		{"A key prefix does not cover the empty prefix, which is every key.", "lead", func(g *auth.Grants) bool { return g.KeyPrefix(auth.Read, "") }, false},
		{"A trailing '*' on a key prefix is the same prefix.", "lead", func(g *auth.Grants) bool { return g.Key(auth.Read, "config/db") && !g.Key(auth.Read, "config") }, true},
		{"A key verb not granted is refused under a granted prefix.", "lead", func(g *auth.Grants) bool { return g.Key(auth.Write, "config/db") }, false},
		{"The \"*\" key prefix covers every key.", "root", func(g *auth.Grants) bool { return g.Key(auth.Read, "x") && g.Key(auth.Read, "") }, true},
		{"The \"*\" key prefix covers the empty prefix, which is every key.", "root", func(g *auth.Grants) bool { return g.KeyPrefix(auth.Read, "") }, true},
		{"AnyKey is true with a rule on some key.", "lead", func(g *auth.Grants) bool { return g.AnyKey(auth.Write) }, true},
		{"AnyKey ignores rules that name only namespaces.", "alice", func(g *auth.Grants) bool { return g.AnyKey(auth.Read) }, false},
		{"Namespace rules say nothing about keys of the same name.", "alice", func(g *auth.Grants) bool { return g.Key(auth.Read, "team-a") }, false},

		{"By default a principal may hold as its own name.", "alice", func(g *auth.Grants) bool { return g.Identity("alice") }, true},
		{"By default a principal may hold as its name followed by '/'.", "alice", func(g *auth.Grants) bool { return g.Identity("alice/pod-1") }, true},
		{"By default a principal may not hold as a name that merely starts with its own.", "alice", func(g *auth.Grants) bool { return g.Identity("alice2") }, false},
		{"By default a principal may not hold as another's name.", "alice", func(g *auth.Grants) bool { return g.Identity("bob") }, false},
		{"A principal matched by a pattern holds as its own name, not the pattern's.", "team-b", func(g *auth.Grants) bool { return g.Identity("team-b/x") && !g.Identity("team-*") }, true},
		{"Explicit identities are allowed.", "bot", func(g *auth.Grants) bool { return g.Identity("worker-7") && g.Identity("batch") }, true},
		{"Explicit identities replace the defaults: not the principal's name.", "bot", func(g *auth.Grants) bool { return g.Identity("bot") }, false},
		{"Explicit identities replace the defaults: not its name followed by '/'.", "bot", func(g *auth.Grants) bool { return g.Identity("bot/1") }, false},
		{"An entry without identities adds the defaults beside another entry's explicit ones.", "hybrid", func(g *auth.Grants) bool {
			return g.Identity("worker-1") && g.Identity("hybrid") && g.Identity("hybrid/1")
		}, true},
		{"The default identity is the principal's name.", "bot", func(g *auth.Grants) bool { return g.DefaultIdentity() == "bot" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ask(p.For(tt.principal)); got != tt.want {
				t.Errorf("%s: got = %v, expected: %v", tt.principal, got, tt.want)
			}
		})
	}
}

// For answers the same for the same principal, however often asked.
func TestGrantsStable(t *testing.T) {
	p := mustParse(t, grantsPolicy)
	a, b := p.For("alice"), p.For("alice")
	if a.Principal != "alice" || b.Principal != "alice" {
		t.Errorf("Principal got = %q, %q, expected: alice, alice", a.Principal, b.Principal)
	}
	if a.Namespace(auth.Read, "team-a") != b.Namespace(auth.Read, "team-a") || a.Limits != b.Limits {
		t.Errorf("two For(alice) answers differ, expected: the same")
	}
}

const limitsPolicy = `
defaults:
  requests_per_second: 100
  sessions: 10
  waits: 100
  watches: 20
roles: {r: [{namespaces: ["*"], verbs: [read]}]}
principals:
  - name: "svc-*"
    roles: [r]
    limits: {requests_per_second: 50, burst: 20, sessions: 8, waits: 30}
  - name: svc-batch
    roles: [r]
    limits: {requests_per_second: 5, sessions: 12, waits: 40, watches: 6}
  - name: plain
    roles: [r]
  - name: rate-only
    roles: [r]
    limits: {requests_per_second: 3}
  - name: slow
    roles: [r]
    limits: {requests_per_second: 0.2}
  - name: huge
    roles: [r]
    limits: {requests_per_second: 1000, burst: 9223372036854775807, sessions: 9223372036854775807}
  - name: huge
    roles: [r]
    limits: {requests_per_second: 2000, burst: 9223372036854775806, sessions: 9223372036854775806}
`

// A principal's limits are the tightest each entry that names it sets,
// field by field; the defaults when no entry sets any; and the burst,
// when none is set, twice the rate and at least 1.
func TestGrantsLimits(t *testing.T) {
	p := mustParse(t, limitsPolicy)
	tests := []struct {
		name      string
		principal string
		want      auth.Limits
	}{
		{"One entry's limits are the principal's.", "svc-web", auth.Limits{RequestsPerSecond: 50, Burst: 20, Sessions: 8, Waits: 30}},
		{"Of two entries, the lower value of each field wins; a 0 (no limit) loses to any limit.", "svc-batch",
			auth.Limits{RequestsPerSecond: 5, Burst: 20, Sessions: 8, Waits: 30, Watches: 6}},
		{"With no entry setting limits, the defaults apply, the burst twice their rate.", "plain", auth.Limits{RequestsPerSecond: 100, Burst: 200, Sessions: 10, Waits: 100, Watches: 20}},
		{"An entry that sets limits replaces the defaults: a field it leaves out is no limit.", "rate-only", auth.Limits{RequestsPerSecond: 3, Burst: 6, Sessions: 0}},
		{"A burst below 1 is raised to 1.", "slow", auth.Limits{RequestsPerSecond: 0.2, Burst: 1, Sessions: 0}},
		{"Limits too large for a float64 to hold exactly stay as written, and positive.", "huge",
			auth.Limits{RequestsPerSecond: 1000, Burst: math.MaxInt64 - 1, Sessions: math.MaxInt64 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.For(tt.principal).Limits; got != tt.want {
				t.Errorf("%s: got = %+v, expected: %+v", tt.principal, got, tt.want)
			}
		})
	}
}

// A policy without defaults leaves a principal whose entries set no
// limits unlimited.
func TestGrantsNoLimits(t *testing.T) {
	p := mustParse(t, "principals: [{name: a}]")
	if got := p.For("a").Limits; got != (auth.Limits{}) {
		t.Errorf("got = %+v, expected: no limits", got)
	}
}

// The rate limiter holds a bucket of Burst requests per principal that
// refills at RequestsPerSecond; it refuses a request over the limit with
// an error naming the principal and the limit, and makes a new bucket
// when the limits change.
func TestRateLimiter(t *testing.T) {
	var l auth.RateLimiter
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	g := &auth.Grants{Principal: "scheduler", Limits: auth.Limits{RequestsPerSecond: 1, Burst: 2}}

	for i := range 2 {
		if err := l.Allow(g, now); err != nil {
			t.Fatalf("request %d of a burst of 2: got = %v, expected: nil", i+1, err)
		}
	}
	err := l.Allow(g, now)
	if err == nil {
		t.Fatalf("third request at once: got = nil, expected: an error")
	}
	for _, w := range []string{"scheduler", "1 requests per second", "burst 2"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error got = %q, expected: it to hold %q", err, w)
		}
	}
	other := &auth.Grants{Principal: "billing", Limits: g.Limits}
	if err := l.Allow(other, now); err != nil {
		t.Errorf("another principal at the same instant: got = %v, expected: nil (its own bucket)", err)
	}

	later := now.Add(time.Second)
	if err := l.Allow(g, later); err != nil {
		t.Errorf("one second later: got = %v, expected: nil", err)
	}
	if err := l.Allow(g, later); err == nil {
		t.Errorf("a second request one second later: got = nil, expected: an error (one request refilled)")
	}

	raised := &auth.Grants{Principal: "scheduler", Limits: auth.Limits{RequestsPerSecond: 1, Burst: 5}}
	for i := range 5 {
		if err := l.Allow(raised, later); err != nil {
			t.Fatalf("request %d after the burst was raised to 5: got = %v, expected: nil (a new, full bucket)", i+1, err)
		}
	}
	if err := l.Allow(raised, later); err == nil {
		t.Errorf("sixth request after the burst was raised to 5: got = nil, expected: an error")
	}

	unlimited := &auth.Grants{Principal: "scheduler"}
	for i := range 100 {
		if err := l.Allow(unlimited, later); err != nil {
			t.Fatalf("request %d with no rate limit: got = %v, expected: nil", i+1, err)
		}
	}
}

// The limits For computes feed the limiter as they are: a rate of 1 with
// no burst set allows 2 at once.
func TestRateLimiterFromPolicy(t *testing.T) {
	p := mustParse(t, "principals: [{name: a, limits: {requests_per_second: 1}}]")
	var l auth.RateLimiter
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	g := p.For("a")
	for i := range 2 {
		if err := l.Allow(g, now); err != nil {
			t.Fatalf("request %d: got = %v, expected: nil", i+1, err)
		}
	}
	if err := l.Allow(g, now); err == nil {
		t.Errorf("request 3: got = nil, expected: an error")
	}
}
