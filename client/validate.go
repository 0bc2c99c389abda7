package client

import (
	"context"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// ValidateResult is the server's answer to Validate.
type ValidateResult struct {
	// Valid is true when the token is a current holder's.
	Valid bool
	// Holder is the current (first) holder's identity, "" when the lease
	// has no holder.
	Holder string
	// CurrentToken is the current (first) holder's token, 0 when the
	// lease has no holder. For a semaphore a valid token may be another
	// holder's than this one.
	CurrentToken int64
}

// Validate asks the server whether t is still a current holder's token:
// the check a resource makes before it accepts a holder's write (DESIGN.md
// safety rule 3; package fence wraps it for HTTP and Connect servers).
//
// The read is linearizable: once a successor has been granted the lease,
// no Validate of the old token answers yes. A lease that does not exist
// is not an error: it has no holder, so no token is valid. Validate is
// safe to repeat and is retried on other endpoints like any idempotent
// call; it fails with ErrUnavailable when no endpoint can answer and with
// ErrInvalidArgument for a malformed namespace, name or token.
func (c *Client) Validate(ctx context.Context, t Token) (ValidateResult, error) {
	var out ValidateResult
	err := c.do(ctx, "Validate", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Namespace: t.Namespace, Name: t.Name, Token: t.Token}))
		if err == nil {
			out = ValidateResult{
				Valid:        resp.Msg.GetValid(),
				Holder:       resp.Msg.GetHolderIdentity(),
				CurrentToken: resp.Msg.GetCurrentToken(),
			}
		}
		return err
	})
	return out, err
}

// KeyValidateResult is the server's answer to ValidateKey.
type KeyValidateResult struct {
	// Valid is true when the key still exists as the incarnation it was
	// at the revision asked about: its holder was not replaced.
	Valid bool
	// CreateRevision is the key's create revision now, 0 when it does not
	// exist. Above the revision asked about, a newer holder made the key.
	CreateRevision int64
	// KVRevision is the current KV revision, the keys' clock (etcd's
	// header revision).
	KVRevision int64
}

// ValidateKey is Validate for a lock held through etcd's recipes — a
// clientv3/concurrency Mutex, etcdctl lock, the etcd Lock service — whose
// holder knows its lock key and the key's create revision (or a later
// revision at which it held the key, as etcdctl lock's ETCD_LOCK_REV).
// It answers whether that key still exists as created then, so that the
// holder was not replaced; package fence wraps it as well.
//
// The read is linearizable: once the key was deleted (the holder unlocked
// or its lease ended), no ValidateKey answers yes, even if a newer holder
// made the same key again. A key that does not exist is not an error. It
// does not check that the key is first in its lock's queue: a Mutex hands
// its key out only once Lock has returned. ValidateKey is idempotent; it
// fails with ErrInvalidArgument for a malformed key or a revision that is
// not positive.
func (c *Client) ValidateKey(ctx context.Context, key string, revision int64) (KeyValidateResult, error) {
	var out KeyValidateResult
	err := c.do(ctx, "ValidateKey", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.ValidateKey(ctx, connect.NewRequest(&tenurev1.ValidateKeyRequest{Key: key, Revision: revision}))
		if err == nil {
			out = KeyValidateResult{
				Valid:          resp.Msg.GetValid(),
				CreateRevision: resp.Msg.GetCreateRevision(),
				KVRevision:     resp.Msg.GetKvRevision(),
			}
		}
		return err
	})
	return out, err
}
