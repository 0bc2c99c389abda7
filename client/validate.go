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
