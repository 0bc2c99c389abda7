package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenurehq/tenure/client"
)

// Policy decides whether a resource accepts a request fenced with t.
// Middleware and Interceptor call Check once per request, on the
// request's goroutine, concurrently with other requests; ctx is the
// request's. Check returns nil to accept, an error matching ErrStale
// (a *StaleError) for a token that is no longer the holder's,
// ErrMalformed for a token Tenure could not have granted, and
// ErrUnavailable when it cannot decide. Any error refuses the request.
type Policy interface {
	Check(ctx context.Context, t client.Token) error
}

// PolicyFunc lets an ordinary function be a Policy.
type PolicyFunc func(ctx context.Context, t client.Token) error

// Check calls f(ctx, t).
func (f PolicyFunc) Check(ctx context.Context, t client.Token) error { return f(ctx, t) }

// Chain returns a Policy that accepts a token only when every policy
// does, checking them in order and returning the first error. Put
// Validate before Monotonic (see the package documentation), so that
// only tokens the server vouched for are remembered.
func Chain(policies ...Policy) Policy {
	return PolicyFunc(func(ctx context.Context, t client.Token) error {
		for _, p := range policies {
			if err := p.Check(ctx, t); err != nil {
				return err
			}
		}
		return nil
	})
}

// Validate returns a Policy that asks the Tenure server, through c,
// whether t is still a current holder's token (client.Client.Validate, a
// linearizable read). It accepts exactly the current holders' tokens —
// for a semaphore, any current holder's — at the moment of the check. It
// costs one round trip per request and refuses every request, with an
// error matching ErrUnavailable, while no Tenure endpoint answers.
func Validate(c *client.Client) Policy { return validatePolicy{c} }

type validatePolicy struct{ c *client.Client }

func (p validatePolicy) Check(ctx context.Context, t client.Token) error {
	if err := check(t); err != nil {
		return err
	}
	r, err := p.c.Validate(ctx, t)
	switch {
	case errors.Is(err, client.ErrInvalidArgument):
		return fmt.Errorf("%w %s: the server refused it: %w", ErrMalformed, t, err)
	case err != nil:
		return fmt.Errorf("%w: validating %s with Tenure: %w", ErrUnavailable, t, err)
	case !r.Valid:
		return &StaleError{Token: t, Current: r.CurrentToken, Holder: r.Holder}
	}
	return nil
}

// Monotonic returns a Policy that remembers, in store, the highest token
// accepted per lease and rejects lower ones with a *StaleError. Tokens
// equal to the highest are accepted — the holder sends many requests —
// and higher ones become the new highest. It never calls Tenure, so it
// keeps working when the server is unreachable; an error from the store
// refuses the request with ErrUnavailable.
//
// Monotonic rejects a stale holder only once its successor has reached
// this resource: until then the old token is the highest seen and is
// accepted. It also trusts the tokens it is shown: a client that presents
// a made-up high token locks the lease's real holders out. Use it behind
// authentication, or after Validate (see Chain).
func Monotonic(store Store) Policy { return monotonicPolicy{store} }

type monotonicPolicy struct{ store Store }

func (p monotonicPolicy) Check(ctx context.Context, t client.Token) error {
	if err := check(t); err != nil {
		return err
	}
	highest, err := p.store.Observe(t.Lease().String(), t.Token)
	if err != nil {
		return fmt.Errorf("%w: recording %s: %w", ErrUnavailable, t, err)
	}
	if highest > t.Token {
		return &StaleError{Token: t, Current: highest, Seen: true}
	}
	return nil
}
