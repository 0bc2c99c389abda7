package auth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tenurehq/tenure/api"
)

// Verb is what a rule allows on its namespaces or keys.
type Verb string

const (
	// Read allows getting, listing and watching leases or keys, and
	// validating tokens.
	Read Verb = "read"
	// Validate allows only Validate: for a resource service that checks
	// fencing tokens and should see nothing else. Read includes it.
	Validate Verb = "validate"
	// Lock allows opening sessions, acquiring, releasing and setting a
	// held lease's value.
	Lock Verb = "lock"
	// Write allows key puts, deletes and compare-and-swaps.
	Write Verb = "write"
	// Admin allows revoking leases; on every namespace ("*") it is the
	// cluster administrator's: member changes, snapshots, leadership
	// transfer, and closing anybody's session.
	Admin Verb = "admin"
)

var verbs = []Verb{Read, Validate, Lock, Write, Admin}

// MetricsAccess says who may read /metrics.
type MetricsAccess string

const (
	// MetricsAuthenticated lets any authenticated principal scrape (the
	// default).
	MetricsAuthenticated MetricsAccess = "authenticated"
	// MetricsOpen lets anybody scrape, for Prometheus without credentials.
	MetricsOpen MetricsAccess = "open"
	// MetricsAdmin lets only cluster administrators scrape.
	MetricsAdmin MetricsAccess = "admin"
)

// File is a policy file as written: see the package example and
// docs/security.md.
type File struct {
	Principals []PrincipalEntry  `json:"principals"`
	Roles      map[string][]Rule `json:"roles"`
	// Defaults are the limits of a principal whose entries set none.
	Defaults *Limits       `json:"defaults,omitempty"`
	Metrics  MetricsAccess `json:"metrics,omitempty"`
}

// PrincipalEntry grants roles to the principals its name matches.
type PrincipalEntry struct {
	// Name is a principal's name, or a pattern where '*' matches any
	// run of characters ("team-a-*"). An entry with tokens names one
	// principal exactly.
	Name  string   `json:"name"`
	Roles []string `json:"roles"`
	// Identities are the holder identities the principal may open
	// sessions as (patterns too). Default: the principal's name, and
	// the name followed by "/" and anything ("scheduler/pod-1").
	Identities []string `json:"identities,omitempty"`
	Tokens     []Token  `json:"tokens,omitempty"`
	Limits     *Limits  `json:"limits,omitempty"`
	// EtcdPasswordBcrypt makes the principal an etcd user of its name:
	// the bcrypt hash of the password etcd clients log in with
	// (Auth.Authenticate), as etcd stores it. See etcd.go.
	EtcdPasswordBcrypt string `json:"etcd_password_bcrypt,omitempty"`
}

// Token is a bearer token issued to a principal, by its hash.
type Token struct {
	// SHA256 is "sha256:" and the hex SHA-256 of the token, as
	// `tenure auth token` prints it.
	SHA256 string `json:"sha256"`
	// Expires, when set, is when the token stops working (RFC 3339).
	Expires *time.Time `json:"expires,omitempty"`
}

// Limits bound one principal's use of a node.
type Limits struct {
	// RequestsPerSecond is the sustained request rate per node; 0 is
	// no limit. Heartbeats count.
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	// Burst is how many requests may come at once (default twice the
	// rate, at least 1).
	Burst int `json:"burst,omitempty"`
	// Sessions is how many sessions the principal may have open at
	// once, over all its identities; 0 is no limit.
	Sessions int `json:"sessions,omitempty"`
	// Waits is how many waits the principal may have parked at once on
	// a node: Acquires waiting in a queue and holders' grant watches;
	// 0 is no limit of its own (the node's --max-waits still holds).
	Waits int `json:"waits,omitempty"`
	// Watches is how many lease and key watches the principal may have
	// open at once on a node; 0 is no limit of its own (the node's
	// --max-watches still holds).
	Watches int `json:"watches,omitempty"`
}

// Rule allows verbs on namespaces or keys.
type Rule struct {
	// Namespaces are lease namespaces or patterns ("team-a", "team-*",
	// "*" for all).
	Namespaces []string `json:"namespaces,omitempty"`
	// Keys are key prefixes; a trailing '*' may be written and "*"
	// alone is every key.
	Keys  []string `json:"keys,omitempty"`
	Verbs []Verb   `json:"verbs"`

	// ranges are an etcd role's permissions, [key, end) each: never in
	// a file, whose keys are prefixes.
	ranges []keyRange
}

// Policy is a parsed, validated policy file. It is immutable.
type Policy struct {
	file    File
	tokens  map[string]tokenEntry // by hash
	metrics MetricsAccess
	// etcdPasswords are the etcd users' bcrypt hashes, by principal:
	// the file's, and the etcd store's while it is enabled.
	etcdPasswords map[string][]byte
	// hasFile is set for a policy read from a file; etcdUsers are the
	// etcd store's users the file does not name, with their rules, and
	// etcdEnabled says the store is enabled (etcdstore.go).
	hasFile     bool
	etcdUsers   map[string][]Rule
	etcdEnabled bool

	mu       sync.Mutex
	resolved map[string]*Grants
}

type tokenEntry struct {
	principal string
	expires   *time.Time
}

// ErrPolicy is matched by every error Parse returns.
var ErrPolicy = errors.New("invalid policy")

// Parse reads a policy file and validates all of it: unknown fields,
// unknown roles and verbs, bad patterns and token hashes are errors that
// name where they are.
func Parse(data []byte) (*Policy, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPolicy, err)
	}
	p := &Policy{file: f, hasFile: true, tokens: map[string]tokenEntry{}, metrics: f.Metrics, etcdPasswords: map[string][]byte{}, resolved: map[string]*Grants{}}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPolicy, err)
	}
	if p.metrics == "" {
		p.metrics = MetricsAuthenticated
	}
	return p, nil
}

func (p *Policy) validate() error {
	f := &p.file
	switch f.Metrics {
	case "", MetricsAuthenticated, MetricsOpen, MetricsAdmin:
	default:
		return fmt.Errorf("metrics: %q is not one of authenticated, open, admin", f.Metrics)
	}
	if err := f.Defaults.validate("defaults"); err != nil {
		return err
	}
	for name, rules := range f.Roles {
		if name == "" {
			return errors.New("roles: a role has an empty name")
		}
		if len(rules) == 0 {
			return fmt.Errorf("roles.%s: no rules", name)
		}
		for i, r := range rules {
			if err := r.validate(); err != nil {
				return fmt.Errorf("roles.%s[%d]: %v", name, i, err)
			}
		}
	}
	if len(f.Principals) == 0 {
		return errors.New("principals: none, so nobody could do anything")
	}
	for i, e := range f.Principals {
		where := fmt.Sprintf("principals[%d] (%s)", i, e.Name)
		if e.Name == "" {
			return fmt.Errorf("principals[%d]: no name", i)
		}
		if err := checkPattern(e.Name); err != nil {
			return fmt.Errorf("%s: name: %v", where, err)
		}
		for _, r := range e.Roles {
			if _, ok := f.Roles[r]; !ok {
				return fmt.Errorf("%s: role %q is not defined under roles", where, r)
			}
		}
		for _, id := range e.Identities {
			if err := checkPattern(id); err != nil {
				return fmt.Errorf("%s: identity %q: %v", where, id, err)
			}
		}
		if len(e.Tokens) > 0 && strings.Contains(e.Name, "*") {
			return fmt.Errorf("%s: tokens need one principal, not a pattern", where)
		}
		for j, t := range e.Tokens {
			h, err := parseHash(t.SHA256)
			if err != nil {
				return fmt.Errorf("%s: tokens[%d]: %v", where, j, err)
			}
			if prev, dup := p.tokens[h]; dup {
				return fmt.Errorf("%s: tokens[%d]: the same token is also %s's", where, j, prev.principal)
			}
			p.tokens[h] = tokenEntry{principal: e.Name, expires: t.Expires}
		}
		if e.EtcdPasswordBcrypt != "" {
			if strings.Contains(e.Name, "*") {
				return fmt.Errorf("%s: etcd_password_bcrypt needs one principal, not a pattern", where)
			}
			h, err := parseBcrypt(e.EtcdPasswordBcrypt)
			if err != nil {
				return fmt.Errorf("%s: %v", where, err)
			}
			if _, dup := p.etcdPasswords[e.Name]; dup {
				return fmt.Errorf("%s: a second etcd_password_bcrypt for %s: give a principal one", where, e.Name)
			}
			p.etcdPasswords[e.Name] = h
		}
		if err := e.Limits.validate(where + ".limits"); err != nil {
			return err
		}
	}
	return nil
}

func (r Rule) validate() error {
	if len(r.Verbs) == 0 {
		return errors.New("no verbs")
	}
	if len(r.Namespaces) == 0 && len(r.Keys) == 0 {
		return errors.New("neither namespaces nor keys: the rule allows nothing")
	}
	for _, v := range r.Verbs {
		if !slices.Contains(verbs, v) {
			return fmt.Errorf("verb %q is not one of read, validate, lock, write, admin", v)
		}
	}
	for _, ns := range r.Namespaces {
		if err := checkPattern(ns); err != nil {
			return fmt.Errorf("namespace %q: %v", ns, err)
		}
		if !strings.Contains(ns, "*") {
			if err := api.NewLeaseName(ns, "x").Validate(); err != nil {
				return fmt.Errorf("namespace %q: %v", ns, err)
			}
		}
	}
	for _, k := range r.Keys {
		if err := checkPattern(k); err != nil {
			return fmt.Errorf("key prefix %q: %v (\"*\" is every key)", k, err)
		}
		if i := strings.IndexByte(k, '*'); i >= 0 && i != len(k)-1 {
			return fmt.Errorf("key prefix %q: '*' may only end it", k)
		}
	}
	for _, v := range r.Verbs {
		if len(r.Keys) > 0 && len(r.Namespaces) == 0 && (v == Lock || v == Validate || v == Admin) {
			return fmt.Errorf("verb %q applies to namespaces, and the rule names only keys", v)
		}
		if len(r.Namespaces) > 0 && len(r.Keys) == 0 && v == Write {
			return errors.New(`verb "write" applies to keys, and the rule names only namespaces`)
		}
	}
	return nil
}

func (l *Limits) validate(where string) error {
	switch {
	case l == nil:
		return nil
	case l.RequestsPerSecond < 0:
		return fmt.Errorf("%s: requests_per_second %v: must be 0 (no limit) or more", where, l.RequestsPerSecond)
	case l.Burst < 0:
		return fmt.Errorf("%s: burst %d: must be 0 (the default) or more", where, l.Burst)
	case l.Sessions < 0:
		return fmt.Errorf("%s: sessions %d: must be 0 (no limit) or more", where, l.Sessions)
	case l.Waits < 0:
		return fmt.Errorf("%s: waits %d: must be 0 (no limit) or more", where, l.Waits)
	case l.Watches < 0:
		return fmt.Errorf("%s: watches %d: must be 0 (no limit) or more", where, l.Watches)
	}
	return nil
}

// checkPattern refuses the empty pattern and control characters.
func checkPattern(p string) error {
	if p == "" {
		return errors.New("empty")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return errors.New("holds a control character")
		}
	}
	return nil
}

// Metrics is who may read /metrics.
func (p *Policy) Metrics() MetricsAccess { return p.metrics }

// TokenPrincipal returns the principal the token was issued to, or an
// error that does not repeat the token.
func (p *Policy) TokenPrincipal(token string, now time.Time) (string, error) {
	return p.hashPrincipal(HashToken(token), now)
}

// hashPrincipal is TokenPrincipal for the token's hash.
func (p *Policy) hashPrincipal(hash string, now time.Time) (string, error) {
	e, ok := p.tokens[hash]
	if !ok {
		return "", errors.New("the bearer token is not one the policy knows")
	}
	if e.expires != nil && !now.Before(*e.expires) {
		return "", fmt.Errorf("the bearer token of %s expired at %s", e.principal, e.expires.UTC().Format(time.RFC3339))
	}
	return e.principal, nil
}

// For returns what principal may do: the union of every matching
// entry's roles, identities and the tightest of their limits.
func (p *Policy) For(principal string) *Grants {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g, ok := p.resolved[principal]; ok {
		return g
	}
	g := &Grants{Principal: principal}
	for _, e := range p.file.Principals {
		if !Match(e.Name, principal) {
			continue
		}
		g.known = true
		for _, r := range e.Roles {
			g.rules = append(g.rules, p.file.Roles[r]...)
		}
		if len(e.Identities) == 0 {
			g.identities = append(g.identities, principal, principal+"/*")
		}
		g.identities = append(g.identities, e.Identities...)
		if e.Limits != nil {
			g.Limits = tighter(g.Limits, *e.Limits)
		}
	}
	if rules, ok := p.etcdUsers[principal]; ok && !g.known {
		g.known = true
		g.rules = rules
		g.identities = append(g.identities, principal, principal+"/*")
	}
	if g.Limits == (Limits{}) && p.file.Defaults != nil {
		g.Limits = *p.file.Defaults
	}
	if g.Limits.RequestsPerSecond > 0 && g.Limits.Burst == 0 {
		g.Limits.Burst = max(1, int(2*g.Limits.RequestsPerSecond))
	}
	if len(p.resolved) < 4096 { // names come from callers: bound the cache
		p.resolved[principal] = g
	}
	return g
}

func tighter(a, b Limits) Limits {
	return Limits{
		RequestsPerSecond: pick(a.RequestsPerSecond, b.RequestsPerSecond),
		Burst:             pick(a.Burst, b.Burst),
		Sessions:          pick(a.Sessions, b.Sessions),
		Waits:             pick(a.Waits, b.Waits),
		Watches:           pick(a.Watches, b.Watches),
	}
}

// pick is the tighter of two limits, where 0 is none. It keeps ints as
// ints: through a float64, a large one would come back negative.
func pick[T int | float64](x, y T) T {
	if x == 0 || (y != 0 && y < x) {
		return y
	}
	return x
}
