package auth

import (
	"slices"
	"strings"

	"github.com/tenurehq/tenure/internal/glob"
)

// Grants are what one principal may do under one policy.
type Grants struct {
	Principal string
	Limits    Limits

	known      bool
	rules      []Rule
	identities []string
}

// Known reports whether any policy entry names the principal. An unknown
// principal (a certificate from the client CA that the policy does not
// mention) may do nothing.
func (g *Grants) Known() bool { return g.known }

// allows reports whether rule r's verbs include v (read includes
// validate).
func (r Rule) allows(v Verb) bool {
	return slices.Contains(r.Verbs, v) || v == Validate && slices.Contains(r.Verbs, Read)
}

// Namespace reports whether v is allowed on the lease namespace ns.
func (g *Grants) Namespace(v Verb, ns string) bool {
	for _, r := range g.rules {
		if r.allows(v) && slices.ContainsFunc(r.Namespaces, func(p string) bool { return Match(p, ns) }) {
			return true
		}
	}
	return false
}

// AnyNamespace reports whether v is allowed on at least one namespace:
// enough to open a session, which belongs to no namespace.
func (g *Grants) AnyNamespace(v Verb) bool {
	for _, r := range g.rules {
		if r.allows(v) && len(r.Namespaces) > 0 {
			return true
		}
	}
	return false
}

// AllNamespaces reports whether v is allowed on every namespace.
func (g *Grants) AllNamespaces(v Verb) bool {
	for _, r := range g.rules {
		if r.allows(v) && slices.Contains(r.Namespaces, "*") {
			return true
		}
	}
	return false
}

// ClusterAdmin is admin on every namespace: member changes, snapshots,
// leadership transfer, any session.
func (g *Grants) ClusterAdmin() bool { return g.AllNamespaces(Admin) }

// Key reports whether v is allowed on key.
func (g *Grants) Key(v Verb, key string) bool {
	for _, r := range g.rules {
		if r.allows(v) && (slices.ContainsFunc(r.Keys, func(p string) bool { return strings.HasPrefix(key, keyPrefix(p)) }) ||
			slices.ContainsFunc(r.ranges, func(kr keyRange) bool { return kr.contains(key) })) {
			return true
		}
	}
	return false
}

// KeyPrefix reports whether v is allowed on every key under prefix, as a
// range, a prefix delete or a prefix watch needs: one rule must cover
// the whole prefix.
func (g *Grants) KeyPrefix(v Verb, prefix string) bool {
	// As a range: [prefix, its successor), from "\x00" (the least key)
	// for the whole keyspace.
	start, end := prefix, "\x00"
	if s, bounded := successor(prefix); bounded {
		end = s
	}
	if start == "" {
		start = "\x00"
	}
	for _, r := range g.rules {
		if r.allows(v) && (slices.ContainsFunc(r.Keys, func(p string) bool { return strings.HasPrefix(prefix, keyPrefix(p)) }) ||
			slices.ContainsFunc(r.ranges, func(kr keyRange) bool { return kr.covers(start, end) })) {
			return true
		}
	}
	return false
}

// KeyRange reports whether v is allowed on every key in [key, end), as
// the etcd API names key ranges: end "" is key alone; "\x00" is every
// key from key on (key "\x00" too: the whole keyspace); otherwise the
// keys from key up to end, excluded. One rule must cover the whole
// range: a prefix P covers exactly the keys in [P, successor of P), so
// the range is allowed when key starts with P and end is at most P's
// successor (a prefix range of P or of a longer prefix; the whole
// keyspace only under "*"). A range that only several rules cover
// together, or an empty or inverted one (end <= key), is refused: the
// check is conservative, as etcd refuses an invalid permission range.
func (g *Grants) KeyRange(v Verb, key, end string) bool {
	if end == "" {
		return g.Key(v, key)
	}
	if end != "\x00" && end <= key {
		return false
	}
	for _, r := range g.rules {
		if r.allows(v) && (slices.ContainsFunc(r.Keys, func(p string) bool { return coversRange(keyPrefix(p), key, end) }) ||
			slices.ContainsFunc(r.ranges, func(kr keyRange) bool { return kr.covers(key, end) })) {
			return true
		}
	}
	return false
}

// coversRange reports whether every key in [key, end) starts with
// prefix; end "\x00" is no end.
func coversRange(prefix, key, end string) bool {
	if !strings.HasPrefix(key, prefix) {
		return false
	}
	succ, bounded := successor(prefix)
	if !bounded {
		return true // every key from a key starting with prefix on starts with it
	}
	return end != "\x00" && end <= succ
}

// successor is the least key above every key that starts with prefix,
// as clientv3.GetPrefixRangeEnd computes it; bounded is false when there
// is none (prefix is empty or all 0xff bytes).
func successor(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// AnyKey reports whether v is allowed on at least one key.
func (g *Grants) AnyKey(v Verb) bool {
	for _, r := range g.rules {
		if r.allows(v) && (len(r.Keys) > 0 || len(r.ranges) > 0) {
			return true
		}
	}
	return false
}

// Identity reports whether the principal may act as holder identity id.
func (g *Grants) Identity(id string) bool {
	return slices.ContainsFunc(g.identities, func(p string) bool { return Match(p, id) })
}

// Identities are the identity patterns the principal may act as, for a
// command to carry into the log: the state machine checks them again
// when it applies the command.
func (g *Grants) Identities() []string { return slices.Clone(g.identities) }

// DefaultIdentity is the identity a session opened without one gets: the
// principal's name.
func (g *Grants) DefaultIdentity() string { return g.Principal }

func keyPrefix(p string) string { return strings.TrimSuffix(p, "*") }

// Match reports whether name matches pattern, where '*' stands for any
// run of characters, even none, and everything else for itself.
func Match(pattern, name string) bool { return glob.Match(pattern, name) }
