package fence

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tenurehq/tenure/client"
)

// KeyHeader is the HTTP header (and Connect metadata key) that carries an
// etcd-style lock holder's fence instead of a Tenure token: its lock key
// and a revision at which it held the key, as <key>:<revision>, e.g.
//
//	Tenure-Fence-Key: mylock/694d7b3c2a1f0e05:9
//
// A holder of `etcdctl lock` sends $ETCD_LOCK_KEY:$ETCD_LOCK_REV; one of
// a clientv3/concurrency Mutex sends m.Key() and m.Header().Revision.
const KeyHeader = "Tenure-Fence-Key"

// LockKey is what a holder of a lock made through etcd's recipes (a
// clientv3/concurrency Mutex, etcdctl lock, the Lock service) knows: the
// key its lock made, and a KV revision at which it held the key — the
// key's create revision, or the later revision it acquired the lock at
// after waiting. Revisions of one lock's holders increase with each new
// holder, as Tenure tokens do.
type LockKey struct {
	Key      string
	Revision int64
}

// String returns k in the header form <key>:<revision> (FormatKey).
func (k LockKey) String() string { return FormatKey(k) }

// Lock is the lock that k's key belongs to, under which MonotonicKey
// compares revisions: the key up to its last '/'. etcd's recipes make one
// key per holder, <lock>/<lease ID in hex>, so all of one lock's holders
// share it. A key without '/' is a lock of its own. A lock kept on one
// fixed key shares the part before its last '/' with its siblings (the
// holders of locks/db and locks/cache both count under locks), which is
// safe but may refuse a sibling's holder: name such locks apart
// (locks/db/owner, locks/cache/owner).
func (k LockKey) Lock() string {
	if i := strings.LastIndexByte(k.Key, '/'); i >= 0 {
		return k.Key[:i]
	}
	return k.Key
}

// FormatKey returns k in the header form <key>:<revision>. Bytes of the
// key that a header cannot carry as they are — controls, space, non-ASCII
// — and '%' are percent-encoded, so the keys etcd's recipes make are sent
// as they are.
func FormatKey(k LockKey) string {
	var b strings.Builder
	for i := 0; i < len(k.Key); i++ {
		c := k.Key[i]
		if c <= ' ' || c >= 0x7f || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String() + ":" + strconv.FormatInt(k.Revision, 10)
}

// ParseKey reads a lock key in the header form <key>:<revision>. The
// revision is the decimal after the last ':', so a key may itself hold
// ':'; the key is percent-decoded (FormatKey). Surrounding white space is
// ignored. Errors match ErrMalformed and say what is wrong.
func ParseKey(s string) (LockKey, error) {
	v := strings.TrimSpace(s)
	colon := strings.LastIndexByte(v, ':')
	if colon < 0 {
		return LockKey{}, malformedKey(s, "no ':' before the revision")
	}
	digits := v[colon+1:]
	if digits == "" || strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return LockKey{}, malformedKey(s, fmt.Sprintf("revision %q is not a decimal number", digits))
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return LockKey{}, malformedKey(s, fmt.Sprintf("revision %s is larger than an int64", digits))
	}
	key, err := url.PathUnescape(v[:colon])
	if err != nil {
		return LockKey{}, malformedKey(s, fmt.Sprintf("the key is not percent-encoded properly: %v", err))
	}
	k := LockKey{Key: key, Revision: n}
	if why := invalidKey(k); why != "" {
		return LockKey{}, malformedKey(s, why)
	}
	return k, nil
}

// invalidKey says why k could not be a Tenure key's, or "" when it could.
func invalidKey(k LockKey) string {
	switch {
	case k.Key == "":
		return "empty key"
	case !utf8.ValidString(k.Key):
		return "the key is not UTF-8, as Tenure's keys are"
	case k.Revision <= 0:
		return fmt.Sprintf("revision must be positive, got %d", k.Revision)
	}
	return ""
}

func checkKey(k LockKey) error {
	if why := invalidKey(k); why != "" {
		return malformedKey(FormatKey(k), why)
	}
	return nil
}

func malformedKey(s, why string) error {
	return fmt.Errorf("%w %q: %s; want <key>:<revision>, e.g. mylock/694d7b3c2a1f0e05:9", ErrMalformed, s, why)
}

// StaleKeyError is the error a KeyPolicy returns for a lock key whose
// holder was replaced. It matches ErrStale with errors.Is.
type StaleKeyError struct {
	// Key is the lock key the request presented.
	Key LockKey
	// Current is the key's create revision now (ValidateKey; 0 when the
	// key does not exist), or the highest revision already accepted for
	// the key's lock (MonotonicKey, Seen true).
	Current int64
	// KVRevision is the keys' current revision when the server answered.
	KVRevision int64
	// Seen is true when Current is the highest revision already accepted
	// by a MonotonicKey policy rather than the server's word.
	Seen bool
}

func (e *StaleKeyError) Error() string {
	msg := "stale lock key " + e.Key.String() + ": "
	switch {
	case e.Seen:
		return msg + fmt.Sprintf("a request with revision %d for lock %q was already accepted", e.Current, e.Key.Lock())
	case e.Current == 0:
		return msg + "the key does not exist (the lock was released or its lease ended)"
	case e.Current > e.Key.Revision:
		return msg + fmt.Sprintf("a newer holder made the key at revision %d", e.Current)
	default:
		return msg + fmt.Sprintf("revision %d is later than the keys' current revision %d", e.Key.Revision, e.KVRevision)
	}
}

// Unwrap makes errors.Is(err, ErrStale) work.
func (e *StaleKeyError) Unwrap() error { return ErrStale }

// KeyPolicy decides whether a resource accepts a request fenced with an
// etcd-style lock key, as Policy does for Tenure tokens: Middleware and
// Interceptor given WithLockKeys call CheckKey once per request, on the
// request's goroutine, concurrently with other requests. It returns nil
// to accept, an error matching ErrStale (a *StaleKeyError) for a holder
// that was replaced, ErrMalformed for a key Tenure could not hold, and
// ErrUnavailable when it cannot decide.
type KeyPolicy interface {
	CheckKey(ctx context.Context, k LockKey) error
}

// KeyPolicyFunc lets an ordinary function be a KeyPolicy.
type KeyPolicyFunc func(ctx context.Context, k LockKey) error

// CheckKey calls f(ctx, k).
func (f KeyPolicyFunc) CheckKey(ctx context.Context, k LockKey) error { return f(ctx, k) }

// ChainKey is Chain for lock keys: it accepts a key only when every
// policy does, in order. Put ValidateKey before MonotonicKey.
func ChainKey(policies ...KeyPolicy) KeyPolicy {
	return KeyPolicyFunc(func(ctx context.Context, k LockKey) error {
		for _, p := range policies {
			if err := p.CheckKey(ctx, k); err != nil {
				return err
			}
		}
		return nil
	})
}

// ValidateKey is Validate for lock keys: it asks the Tenure server,
// through c, whether the key still exists as it was at the holder's
// revision (client.Client.ValidateKey, a linearizable read), so that a
// holder whose key was deleted — it unlocked, or its lease ended — is
// refused even if a newer holder has not written here yet, and even if
// the newer holder made the same key again. It costs a round trip per
// request and refuses every request, with ErrUnavailable, while no
// Tenure endpoint answers.
func ValidateKey(c *client.Client) KeyPolicy { return validatePolicy{c} }

func (p validatePolicy) CheckKey(ctx context.Context, k LockKey) error {
	if err := checkKey(k); err != nil {
		return err
	}
	r, err := p.c.ValidateKey(ctx, k.Key, k.Revision)
	switch {
	case errors.Is(err, client.ErrInvalidArgument):
		return fmt.Errorf("%w %s: the server refused it: %w", ErrMalformed, k, err)
	case err != nil:
		return fmt.Errorf("%w: validating lock key %s with Tenure: %w", ErrUnavailable, k, err)
	case !r.Valid:
		return &StaleKeyError{Key: k, Current: r.CreateRevision, KVRevision: r.KVRevision}
	}
	return nil
}

// MonotonicKey is Monotonic for lock keys: it remembers, in store, the
// highest revision accepted per lock (LockKey.Lock) and refuses lower
// ones with a *StaleKeyError. It shares Monotonic's limits: a stale
// holder is refused only once its successor has reached this resource,
// and a made-up high revision is believed. Its entries in store are
// named "etcd:" and the lock, apart from Monotonic's leases.
func MonotonicKey(store Store) KeyPolicy { return monotonicPolicy{store} }

func (p monotonicPolicy) CheckKey(ctx context.Context, k LockKey) error {
	if err := checkKey(k); err != nil {
		return err
	}
	highest, err := p.store.Observe("etcd:"+k.Lock(), k.Revision)
	if err != nil {
		return fmt.Errorf("%w: recording lock key %s: %w", ErrUnavailable, k, err)
	}
	if highest > k.Revision {
		return &StaleKeyError{Key: k, Current: highest, Seen: true}
	}
	return nil
}
