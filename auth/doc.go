// Package auth decides who a caller is and what it may do.
//
// A caller is a principal: the name in its client certificate (the
// subject's CN, else its first URI, DNS or email SAN) when that
// certificate comes from the client CA, or the principal a bearer token
// was issued to. A node of the cluster proves it is one with a
// certificate from the peer CA; it may speak for the principal whose call
// it forwards, and nobody else may.
//
// A Policy, read from a YAML file, gives principals roles and roles
// rules: a set of namespaces (for leases) or key prefixes (for keys) and
// the verbs allowed on them — read, validate, lock, write and admin. It
// also ties a principal to the holder identities it may use, so that no
// principal can hold, release or list as somebody else, and sets
// per-principal limits. Policies are immutable; a Source swaps in a new
// one when the file changes, and keeps the old one when the new file is
// not valid, so that a typo never locks everybody out.
//
// Tokens are stored only as their SHA-256 ("sha256:<hex>"): a token is
// 32 random bytes, too many to guess, so a fast hash is enough. The one
// secret a policy file may hold is an etcd user's bcrypt password hash,
// since the tokens of the etcd API are signed with it (etcd.go).
//
// With no policy (the single-node loopback default) nothing here runs:
// every caller may do everything, as before.
package auth
