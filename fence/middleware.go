package fence

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/client"
)

// codes maps the package's errors to the answers of Middleware and
// Interceptor. An error matching none of them (a custom Policy's) is
// answered 500 / CodeInternal: the request is refused either way.
var codes = []struct {
	err    error
	status int
	code   connect.Code
}{
	{ErrMissing, http.StatusPreconditionRequired, connect.CodeInvalidArgument},
	{ErrMalformed, http.StatusBadRequest, connect.CodeInvalidArgument},
	{ErrStale, http.StatusConflict, connect.CodeFailedPrecondition},
	{ErrUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable},
}

func statusOf(err error) (int, connect.Code) {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.status, c.code
		}
	}
	return http.StatusInternalServerError, connect.CodeInternal
}

type contextKey struct{}

type keyContextKey struct{}

// FromContext returns the fencing token that Middleware or Interceptor
// accepted for the request whose context is ctx. Pass it on to the
// resource's storage when it can compare tokens in the same transaction
// as the write: the strongest fence (see the package documentation).
func FromContext(ctx context.Context) (client.Token, bool) {
	t, ok := ctx.Value(contextKey{}).(client.Token)
	return t, ok
}

// KeyFromContext is FromContext for a request fenced with a lock key
// (WithLockKeys).
func KeyFromContext(ctx context.Context) (LockKey, bool) {
	k, ok := ctx.Value(keyContextKey{}).(LockKey)
	return k, ok
}

// Option configures Middleware and Interceptor.
type Option func(*options)

type options struct{ keys KeyPolicy }

// WithLockKeys makes Middleware and Interceptor also accept requests
// fenced with an etcd-style lock key in the Tenure-Fence-Key header
// instead of a Tenure token, checked with p (ValidateKey, MonotonicKey,
// or both with ChainKey). Without it that header is ignored. With it, the
// Policy given to Middleware or Interceptor may be nil, and then only lock
// keys are accepted.
func WithLockKeys(p KeyPolicy) Option { return func(o *options) { o.keys = p } }

func newOptions(p Policy, opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if p == nil && o.keys == nil {
		panic("fence: a nil Policy needs WithLockKeys")
	}
	return o
}

// admit reads the token (or, with a KeyPolicy, the lock key) from h and
// checks it with p (or kp), returning the context to serve the request
// with.
func admit(ctx context.Context, p Policy, kp KeyPolicy, h http.Header) (context.Context, error) {
	values, keys := h.Values(Header), h.Values(KeyHeader)
	if kp != nil && len(keys) > 0 {
		if len(values) > 0 {
			return nil, fmt.Errorf("%w: both %s and %s headers; send one", ErrMalformed, Header, KeyHeader)
		}
		if len(keys) > 1 {
			return nil, fmt.Errorf("%w: %d %s headers; send exactly one", ErrMalformed, len(keys), KeyHeader)
		}
		k, err := ParseKey(keys[0])
		if err != nil {
			return nil, err
		}
		if err := kp.CheckKey(ctx, k); err != nil {
			return nil, err
		}
		return context.WithValue(ctx, keyContextKey{}, k), nil
	}
	switch {
	case p == nil:
		return nil, fmt.Errorf("%w: the %s header is required: send the etcd lock key and a revision it was held at as <key>:<revision>", ErrMissing, KeyHeader)
	case len(values) == 0 && kp != nil:
		return nil, fmt.Errorf("%w: the %s header (<namespace>/<name>:<token>) or the %s header (<key>:<revision>) is required", ErrMissing, Header, KeyHeader)
	case len(values) == 0:
		return nil, fmt.Errorf("%w: the %s header is required: send the holder's fencing token as <namespace>/<name>:<token>", ErrMissing, Header)
	case len(values) > 1:
		return nil, fmt.Errorf("%w: %d %s headers; send exactly one", ErrMalformed, len(values), Header)
	}
	t, err := Parse(values[0])
	if err != nil {
		return nil, err
	}
	if err := p.Check(ctx, t); err != nil {
		return nil, err
	}
	return context.WithValue(ctx, contextKey{}, t), nil
}

// Middleware returns a handler that serves a request with next only when
// its Tenure-Fence header holds a token that p accepts, and otherwise
// answers with the reason in plain text:
//
//	428 Precondition Required  no Tenure-Fence header
//	400 Bad Request            not <namespace>/<name>:<token>, or several headers
//	409 Conflict               stale: names the token and the current (or highest seen) one
//	503 Service Unavailable    p cannot decide (Tenure unreachable, store failing)
//
// next finds the accepted token with FromContext. WithLockKeys also
// accepts a Tenure-Fence-Key header (KeyFromContext), answered alike.
func Middleware(p Policy, next http.Handler, opts ...Option) http.Handler {
	o := newOptions(p, opts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, err := admit(r.Context(), p, o.keys, r.Header)
		if err != nil {
			status, _ := statusOf(err)
			http.Error(w, err.Error(), status)
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// Interceptor returns a Connect handler interceptor that serves unary
// and streaming calls only when their Tenure-Fence header holds a token
// that p accepts, and otherwise fails them without calling the handler:
// a missing or malformed token with CodeInvalidArgument, a stale one
// with CodeFailedPrecondition, and CodeUnavailable when p cannot decide.
// A stream is checked once, when it opens. Handlers find the accepted
// token with FromContext. WithLockKeys also accepts a Tenure-Fence-Key
// header (KeyFromContext). On a client, the interceptor does nothing.
func Interceptor(p Policy, opts ...Option) connect.Interceptor {
	return serverInterceptor{p, newOptions(p, opts).keys}
}

type serverInterceptor struct {
	p  Policy
	kp KeyPolicy
}

func connectError(err error) error {
	_, code := statusOf(err)
	return connect.NewError(code, err)
}

func (i serverInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := admit(ctx, i.p, i.kp, req.Header())
		if err != nil {
			return nil, connectError(err)
		}
		return next(ctx, req)
	}
}

func (i serverInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i serverInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := admit(ctx, i.p, i.kp, conn.RequestHeader())
		if err != nil {
			return connectError(err)
		}
		return next(ctx, conn)
	}
}
