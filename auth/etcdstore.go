package auth

import (
	"maps"
	"slices"
)

// etcd's users and roles, managed with etcdctl (user, role, auth
// enable) and kept in the replicated state, join the policy file's
// principals here. How the two combine:
//
//   - The store counts only while enabled (etcdctl auth enable). Until
//     then its users cannot log in, as in etcd.
//   - The policy file wins. A name one of its entries matches is the
//     file's principal, with the file's grants only; a store user of
//     that name is ignored (and the server refuses to add one).
//   - A store user's grants are its roles': READ, WRITE or READWRITE on
//     key ranges, exactly as etcd checks them; the role "root" is admin
//     of everything (every namespace, every key), as etcd's root is.
//     etcd's roles name no lease namespaces, so a store user without
//     root uses keys only; the file grants namespaces.
//   - A store user logs in as a file principal with etcd_password_bcrypt
//     does: its token is keyed by its password hash, so a changed
//     password or a deleted user ends its tokens at once, and a role
//     change applies to the next call.
//   - A policy is in force when there is a file or the store is enabled:
//     a node without a file is open only until etcdctl auth enable.

// EtcdStore is etcd's users and roles, as the replicated state holds
// them.
type EtcdStore struct {
	Enabled bool
	Users   []EtcdUser
	Roles   map[string][]EtcdPerm
}

// EtcdUser is a store user: its bcrypt hash ("" for a user that logs in
// by certificate only) and its roles.
type EtcdUser struct {
	Name           string
	PasswordBcrypt string
	Roles          []string
}

// EtcdPerm grants read, write or both on [Key, End): End "" is Key
// alone, "\x00" every key from Key on.
type EtcdPerm struct {
	Read, Write bool
	Key, End    string
}

// EtcdRootRole is etcd's root role: everything.
const EtcdRootRole = "root"

// keyRange is a rule's [key, end) from an etcd permission.
type keyRange struct{ key, end string }

// contains reports whether k is in the range.
func (r keyRange) contains(k string) bool {
	if r.end == "" {
		return k == r.key
	}
	return k >= r.key && (r.end == "\x00" || k < r.end)
}

// covers reports whether every key in [key, end) is in the range.
func (r keyRange) covers(key, end string) bool {
	switch {
	case end == "":
		return r.contains(key)
	case r.end == "":
		return false // one key covers no range wider than itself
	case key < r.key:
		return false
	case r.end == "\x00":
		return true
	}
	return end != "\x00" && end <= r.end
}

// WithEtcd is p with the store's users as principals, while the store
// is enabled; p itself otherwise. p nil is no policy file.
func (p *Policy) WithEtcd(st EtcdStore) *Policy {
	if p == nil {
		p = noFile()
	}
	if !st.Enabled {
		return p
	}
	out := &Policy{
		file:          p.file,
		hasFile:       p.hasFile,
		tokens:        p.tokens,
		metrics:       p.metrics,
		etcdPasswords: maps.Clone(p.etcdPasswords),
		etcdUsers:     map[string][]Rule{},
		etcdEnabled:   true,
		resolved:      map[string]*Grants{},
	}
	for _, u := range st.Users {
		if p.fileNames(u.Name) {
			continue // the file's principal
		}
		var rules []Rule
		for _, role := range u.Roles {
			if role == EtcdRootRole {
				rules = append(rules, Rule{Namespaces: []string{"*"}, Keys: []string{"*"}, Verbs: slices.Clone(verbs)})
				continue
			}
			for _, perm := range st.Roles[role] {
				r := Rule{ranges: []keyRange{{perm.Key, perm.End}}}
				if perm.Read {
					r.Verbs = append(r.Verbs, Read)
				}
				if perm.Write {
					r.Verbs = append(r.Verbs, Write)
				}
				rules = append(rules, r)
			}
		}
		out.etcdUsers[u.Name] = rules
		if u.PasswordBcrypt != "" {
			out.etcdPasswords[u.Name] = []byte(u.PasswordBcrypt)
		}
	}
	return out
}

// fileNames reports whether one of the file's entries matches name.
func (p *Policy) fileNames(name string) bool {
	return slices.ContainsFunc(p.file.Principals, func(e PrincipalEntry) bool { return Match(e.Name, name) })
}

// FileNames reports whether the policy file defines principal name,
// which etcd's store then may not.
func (p *Policy) FileNames(name string) bool { return p.fileNames(name) }

// InForce reports whether the policy governs callers: there is a policy
// file, or etcd's auth is enabled. A node with neither lets every
// caller do everything.
func (p *Policy) InForce() bool { return p.hasFile || p.etcdEnabled }

// EtcdEnabled reports whether etcd's store is enabled in the policy.
func (p *Policy) EtcdEnabled() bool { return p.etcdEnabled }

// noFile is the policy of a node without a policy file: no principals;
// /metrics open, as on a node without a policy.
func noFile() *Policy {
	return &Policy{tokens: map[string]tokenEntry{}, metrics: MetricsOpen, etcdPasswords: map[string][]byte{}, resolved: map[string]*Grants{}}
}
