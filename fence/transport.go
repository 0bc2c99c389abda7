package fence

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/client"
)

// Source hands out the fencing token to attach to a request, and whether
// it is still valid. client.Mutex, Semaphore, RWMutex and Election are
// Sources; their validity is pessimistic (see client.Session.Valid).
// Token is called once per request, from the goroutine sending it.
type Source interface {
	Token() (client.Token, bool)
}

// ContextSource is the Source of a grant's context: the context a Mutex
// or Election hands out with Context(), or the one RunElection passes to
// OnStartedLeading. Its token is client.TokenFromContext(ctx), valid
// until ctx is cancelled — which happens the instant the grant may be
// lost.
func ContextSource(ctx context.Context) Source { return contextSource{ctx} }

type contextSource struct{ ctx context.Context }

func (s contextSource) Token() (client.Token, bool) {
	t, ok := client.TokenFromContext(s.ctx)
	return t, ok && s.ctx.Err() == nil
}

// token returns src's token, or an ErrNotHolding error when it is not
// valid. what names the request for the message.
func token(src Source, what string) (client.Token, error) {
	t, ok := src.Token()
	if ok && t.Token > 0 {
		return t, nil
	}
	if t.Token > 0 {
		return client.Token{}, fmt.Errorf("%w: fencing token %s is no longer valid; %s not sent", ErrNotHolding, t, what)
	}
	return client.Token{}, fmt.Errorf("%w: %s is not held; %s not sent", ErrNotHolding, t.Lease(), what)
}

// Transport returns a RoundTripper that sends each request through base
// (http.DefaultTransport when nil) with src's token in the Tenure-Fence
// header. When src's token is not valid, the request is not sent: the
// RoundTripper closes its body and returns an error wrapping
// ErrNotHolding, which http.Client returns wrapped in a *url.Error.
//
// The check is made when the request is sent. A request sent while the
// grant was valid can still arrive after it was lost — which is why the
// resource must check the token too (Middleware, Interceptor).
func Transport(base http.RoundTripper, src Source) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base, src: src}
}

type transport struct {
	base http.RoundTripper
	src  Source
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	tok, err := token(t.src, r.Method+" "+r.URL.Redacted())
	if err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, err
	}
	r = r.Clone(r.Context()) // a RoundTripper must not modify its request
	r.Header.Set(Header, Format(tok))
	return t.base.RoundTrip(r)
}

// CloseIdleConnections closes base's idle connections, so that
// http.Client.CloseIdleConnections reaches them.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// ClientInterceptor returns a Connect client interceptor that puts src's
// token in the Tenure-Fence header of every unary and streaming call.
// When the token is not valid, the call is not sent and fails with
// CodeFailedPrecondition wrapping ErrNotHolding. On a stream, each Send
// checks again and refuses once the token is no longer valid or has
// changed: the stream's header still names the old one.
func ClientInterceptor(src Source) connect.Interceptor { return clientInterceptor{src} }

type clientInterceptor struct{ src Source }

func (i clientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		tok, err := token(i.src, req.Spec().Procedure)
		if err != nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		req.Header().Set(Header, Format(tok))
		return next(ctx, req)
	}
}

func (i clientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		tok, err := token(i.src, spec.Procedure)
		if err != nil {
			return refuse(spec, connect.NewError(connect.CodeFailedPrecondition, err))
		}
		return &fencedConn{StreamingClientConn: next(ctx, spec), src: i.src, tok: tok}
	}
}

func (i clientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// fencedConn sets the header just before the first Send, after the
// caller's own headers are merged in, and refuses any Send once the
// token it named is no longer the Source's valid one.
type fencedConn struct {
	connect.StreamingClientConn
	src  Source
	tok  client.Token
	sent bool // guarded by the write side's contract: Send is not called concurrently
}

func (c *fencedConn) Send(msg any) error {
	tok, err := token(c.src, c.Spec().Procedure)
	if err == nil && tok != c.tok {
		err = fmt.Errorf("%w: the stream was opened with %s and the token is now %s; message on %s not sent", ErrNotHolding, c.tok, tok, c.Spec().Procedure)
	}
	if err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	if !c.sent {
		c.RequestHeader().Set(Header, Format(c.tok))
		c.sent = true
	}
	return c.StreamingClientConn.Send(msg)
}

// refusedConn is a stream that was never opened: every call fails with
// err and nothing reaches the network.
type refusedConn struct {
	spec connect.Spec
	err  error

	req, res, trailer http.Header
}

func refuse(spec connect.Spec, err error) *refusedConn {
	return &refusedConn{spec: spec, err: err, req: http.Header{}, res: http.Header{}, trailer: http.Header{}}
}

func (c *refusedConn) Spec() connect.Spec           { return c.spec }
func (c *refusedConn) Peer() connect.Peer           { return connect.Peer{} }
func (c *refusedConn) Send(any) error               { return c.err }
func (c *refusedConn) RequestHeader() http.Header   { return c.req }
func (c *refusedConn) CloseRequest() error          { return nil }
func (c *refusedConn) Receive(any) error            { return c.err }
func (c *refusedConn) ResponseHeader() http.Header  { return c.res }
func (c *refusedConn) ResponseTrailer() http.Header { return c.trailer }
func (c *refusedConn) CloseResponse() error         { return nil }
