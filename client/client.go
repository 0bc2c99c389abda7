package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// Client talks to a Tenure cluster through any of its endpoints. It is
// safe for concurrent use. The caller should call Close when finished;
// Close does not close sessions, which should be closed first.
type Client struct {
	opts      options
	transport splitTransport
	http      *http.Client

	mu        sync.Mutex // guards endpoints, current, closed, conns and ttls
	endpoints []*endpoint
	current   int
	closed    bool
	conns     map[net.Conn]struct{} // open connections, closed by Close
	ttls      map[time.Duration]int // how many heartbeating sessions have each TTL

	// closing is closed by Close: the sessions' heartbeat loops end on
	// it, rather than at their next heartbeat.
	closing   chan struct{}
	closeOnce sync.Once
}

type endpoint struct {
	c   *Client
	url string
	// failedAt is when a call last failed over from this endpoint (unix
	// ns), guarded by Client.mu: a node's word that this is the leader is
	// not followed for a moment after, since a follower can name a leader
	// that just went away until it hears of the next.
	failedAt int64
	sessions tenurev1connect.SessionServiceClient
	// unarySessions never takes the pipeline: heartbeats to a follower,
	// which forwards them.
	unarySessions tenurev1connect.SessionServiceClient
	leases        tenurev1connect.LeaseServiceClient
	kv            tenurev1connect.KVServiceClient
	cluster       tenurev1connect.ClusterServiceClient

	// pipeLock (a one-slot semaphore, taken by lockPipe) guards pipe and
	// noPipe, and is held while connecting: a caller can stop waiting for
	// another's connection to a node that does not answer.
	pipeLock chan struct{}
	pipe     *pipe
	noPipe   bool // the server has no pipeline: unary calls only
}

// lockPipe takes ep.pipeLock, unless ctx ends first.
func (ep *endpoint) lockPipe(ctx context.Context) error {
	select {
	case ep.pipeLock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ep *endpoint) unlockPipe() { <-ep.pipeLock }

// pipeless reports whether ep's server has no pipeline at all, as
// opposed to one it refused because it does not lead.
func (ep *endpoint) pipeless() bool {
	_ = ep.lockPipe(context.Background())
	defer ep.unlockPipe()
	return ep.noPipe
}

type options struct {
	dialTimeout    time.Duration
	requestTimeout time.Duration
	maxAttempts    int
	backoff        time.Duration
	maxBackoff     time.Duration
	logger         *slog.Logger
	// pingEvery and pingTimeout bound a silent pipeline (see the
	// constants); tests shorten them.
	pingEvery, pingTimeout time.Duration
	tls                    *tls.Config
	token                  string
}

// credentials reports whether the client authenticates: with a token or
// a client certificate.
func (o *options) credentials() bool {
	return o.token != "" || o.tls != nil && (len(o.tls.Certificates) > 0 || o.tls.GetClientCertificate != nil)
}

// Option configures a Client.
type Option func(*options)

// WithDialTimeout bounds connecting to one endpoint (default 2s).
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// WithRequestTimeout bounds each attempt of a call that does not wait by
// design (default 5s). Blocking calls — Lock, Campaign, watches — are
// bounded only by their context.
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// WithRetry sets how many times a call is tried in all (default 6) and
// the first pause between tries, doubled each time up to 1s (default
// 50ms). Only calls that are safe to repeat are retried after they were
// sent; others only when the server provably did not take them. Calls
// that wait — Lock, Acquire, Campaign — are not counted: they retry
// until their context ends, so a wait rides out a server restart.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(o *options) { o.maxAttempts, o.backoff = max(attempts, 1), backoff }
}

// WithTLS makes the client talk TLS with cfg (its RootCAs check the
// servers; its Certificates, if any, are the client's certificate).
// Endpoints given without a scheme become https://.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithToken authenticates every call with a bearer token (`tenure auth
// token` makes one; the server's policy names its principal). Without
// TLS the token crosses the network in the clear: use it with WithTLS
// anywhere but loopback.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithLogger sets where the client logs reconnects and losses (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// New returns a client for the given endpoints ("host:port" or URLs). It
// does not connect until the first call; ctx bounds nothing yet and is
// taken for symmetry with calls that will check the cluster.
func New(ctx context.Context, endpoints []string, opts ...Option) (*Client, error) {
	o := options{
		dialTimeout:    2 * time.Second,
		requestTimeout: 5 * time.Second,
		maxAttempts:    6,
		backoff:        50 * time.Millisecond,
		maxBackoff:     time.Second,
		logger:         slog.Default(),
		pingEvery:      pingEvery,
		pingTimeout:    pingTimeout,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if len(endpoints) == 0 {
		return nil, &Error{Op: "New", Kind: ErrInvalidArgument, Cause: errors.New("no endpoints")}
	}
	var protocols, http1 http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP2(true)
	// Only HTTP/1.1 on the pooled transport, over TLS too: ALPN must not
	// talk it into HTTP/2, which costs twice the CPU per call and cannot
	// be upgraded to a pipeline.
	http1.SetHTTP1(true)
	dialer := &net.Dialer{Timeout: o.dialTimeout, KeepAlive: 15 * time.Second}
	c := &Client{opts: o, conns: map[net.Conn]struct{}{}, ttls: map[time.Duration]int{}, closing: make(chan struct{})}
	c.transport = splitTransport{
		// Unary calls and watches use HTTP/1.1 connections from a pool:
		// on Go's HTTP/2 each call costs about twice the CPU (see
		// docs/benchmarks.md). A blocked call holds its own connection.
		http1: &http.Transport{
			Protocols:           &http1,
			TLSClientConfig:     o.tls,
			DialContext:         c.dialer(dialer),
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		},
		// Heartbeats need a bidirectional stream: cleartext HTTP/2,
		// whose pings also find a dead connection.
		http2: &http.Transport{
			Protocols:       &protocols,
			TLSClientConfig: o.tls,
			DialContext:     c.dialer(dialer),
			HTTP2:           &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 5 * time.Second},
		},
	}
	var rt http.RoundTripper = c.transport
	if o.token != "" {
		rt = bearer{rt, "Bearer " + o.token}
	}
	c.http = &http.Client{Transport: leaderFollower{rt, c}}
	for _, e := range endpoints {
		url := strings.TrimSpace(e)
		if url == "" {
			continue
		}
		if !strings.Contains(url, "://") {
			url = "http://" + url
			if o.tls != nil {
				url = "https://" + strings.TrimPrefix(url, "http://")
			}
		}
		c.endpoints = append(c.endpoints, c.newEndpoint(strings.TrimSuffix(url, "/")))
	}
	if len(c.endpoints) == 0 {
		return nil, &Error{Op: "New", Kind: ErrInvalidArgument, Cause: fmt.Errorf("no endpoints in %q", endpoints)}
	}
	return c, nil
}

// Close releases the client's connections, also those still carrying a
// call or a stream, which then fail. Sessions opened through it stop
// heartbeating; close them first to release what they hold at once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = nil
	endpoints := c.endpoints
	c.mu.Unlock()
	for _, ep := range endpoints {
		_ = ep.lockPipe(context.Background())
		if ep.pipe != nil {
			ep.pipe.close()
		}
		ep.unlockPipe()
	}
	// Closing only idle connections would leave one whose last stream
	// was still ending open for good, with its read loop.
	c.transport.http1.CloseIdleConnections()
	c.transport.http2.CloseIdleConnections()
	for conn := range conns {
		conn.Close()
	}
	return nil
}

// dialer wraps d so that Close can find every connection.
func (c *Client) dialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			conn.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Err: ErrClosed}
		}
		tc := &trackedConn{Conn: conn, c: c}
		c.conns[tc] = struct{}{}
		return tc, nil
	}
}

// trackedConn leaves the client's set of connections when closed.
type trackedConn struct {
	net.Conn
	c *Client
}

func (tc *trackedConn) Close() error {
	tc.c.mu.Lock()
	delete(tc.c.conns, tc)
	tc.c.mu.Unlock()
	return tc.Conn.Close()
}

func (c *Client) newEndpoint(url string) *endpoint {
	ep := &endpoint{c: c, url: url, cluster: tenurev1connect.NewClusterServiceClient(c.http, url), pipeLock: make(chan struct{}, 1)}
	ep.unarySessions = tenurev1connect.NewSessionServiceClient(c.http, url)
	ep.sessions = pipedSessions{ep.unarySessions, ep}
	ep.leases = pipedLeases{tenurev1connect.NewLeaseServiceClient(c.http, url), ep}
	ep.kv = pipedKV{tenurev1connect.NewKVServiceClient(c.http, url), ep}
	return ep
}

// bearer adds the Authorization header to every request.
type bearer struct {
	next  http.RoundTripper
	value string
}

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the caller's request.
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", b.value)
	return b.next.RoundTrip(req)
}

// leaderHeader is set by a node that does not lead on every response,
// naming the leader's API address (server.LeaderHeader).
const leaderHeader = "Tenure-Leader"

// leaderFollower sends the calls after a response that named the leader
// to the leader: a follower would forward them there anyway, at the cost
// of a hop, and streams (heartbeats) only the leader serves.
type leaderFollower struct {
	next http.RoundTripper
	c    *Client
}

func (f leaderFollower) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(req)
	if err == nil {
		if leader := resp.Header.Get(leaderHeader); leader != "" {
			f.c.follow(req.URL.Scheme, leader)
		}
	}
	return resp, err
}

// follow makes the endpoint at addr current, adding it when it is not one
// of the endpoints given to New: a cluster may have grown since. An
// endpoint that cannot be reached is left again by failover, as any
// other.
func (c *Client) follow(scheme, addr string) {
	url := scheme + "://" + addr
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.endpoints[c.current].url == url {
		return
	}
	i := slices.IndexFunc(c.endpoints, func(e *endpoint) bool { return e.url == url })
	if i >= 0 && time.Since(time.Unix(0, c.endpoints[i].failedAt)) < distrustFailed {
		return
	}
	if i < 0 {
		c.endpoints = append(c.endpoints, c.newEndpoint(url))
		i = len(c.endpoints) - 1
	}
	c.opts.logger.Debug("tenure: following the leader", "from", c.endpoints[c.current].url, "to", url)
	c.current = i
}

// carryTTL counts a session of the given TTL in (n = 1) when its
// heartbeats start, or out (n = -1) when they end.
func (c *Client) carryTTL(ttl time.Duration, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ttls[ttl] += n; c.ttls[ttl] <= 0 {
		delete(c.ttls, ttl)
	}
}

// pingBounds are the pipelines' liveness bounds (see pipe.watchdog):
// how long a busy pipeline may stay silent before it is pinged, and how
// much longer before it is given up. Every session of the client shares
// its pipelines, so both follow the shortest TTL among them: an eighth
// each, so that a frozen or cut-off node is left within about 5/16 of
// the TTL of silence (a quarter, plus the watchdog's tick), well inside
// the validity window (3/4), and a session's next heartbeat goes
// elsewhere in time. A pong costs the server one small frame, answered
// by its reader without touching raft, so pinging that often is cheap.
func (c *Client) pingBounds() (every, timeout time.Duration) {
	every, timeout = c.opts.pingEvery, c.opts.pingTimeout
	c.mu.Lock()
	defer c.mu.Unlock()
	for ttl := range c.ttls {
		every, timeout = min(every, ttl/8), min(timeout, ttl/8)
	}
	return every, timeout
}

// Endpoints lists the endpoint URLs, the one in use first: those given to
// New and the leaders learnt since.
func (c *Client) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.endpoints))
	for i := range c.endpoints {
		out = append(out, c.endpoints[(c.current+i)%len(c.endpoints)].url)
	}
	return out
}

func (c *Client) endpoint() (*endpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	return c.endpoints[c.current], nil
}

// distrustFailed is how long a failed endpoint is not followed to on
// another node's word.
const distrustFailed = time.Second

// failover moves off ep unless another caller already did.
//
// A call that was cancelled says nothing about the endpoint: callers
// whose own context ended must not fail over (every unlock would move
// the client off the leader when its grant monitor's watch stops).
//
// It moves to the next endpoint that has not failed within
// distrustFailed, if there is one. A follower that answered "not
// leader" is alive and did not fail: moving on from it must not lead
// back to a leader that went silent a moment ago (frozen, its
// connections still accepted) while the followers have not yet elected
// the next, which would cost a call its whole patience again.
func (c *Client) failover(ep *endpoint, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if reasonOf(err) != api.ReasonNotLeader {
		ep.failedAt = now.UnixNano()
	}
	if c.endpoints[c.current] != ep || len(c.endpoints) == 1 {
		return
	}
	// The next endpoint in turn that has not failed lately, else the one
	// that failed longest ago.
	next := -1
	for i := range len(c.endpoints) - 1 {
		j := (c.current + 1 + i) % len(c.endpoints)
		if now.Sub(time.Unix(0, c.endpoints[j].failedAt)) >= distrustFailed {
			next = j
			break
		}
		if next < 0 || c.endpoints[j].failedAt < c.endpoints[next].failedAt {
			next = j
		}
	}
	c.current = next
	c.opts.logger.Debug("tenure: switching endpoint", "from", ep.url, "to", c.endpoints[c.current].url, "err", err)
}

// callKind says how a call may be retried.
type callKind int

const (
	// idempotent calls may be repeated after any transient failure.
	idempotent callKind = iota
	// once calls are repeated only when the server provably did not take
	// them; otherwise they fail with ErrUnknownOutcome.
	once
	// blocking calls are idempotent and wait by design: no request
	// timeout, and no count of attempts. They ride out a restart or a
	// change of leader, retrying until ctx ends or the server gives an
	// answer that is not "try again".
	blocking
)

// do runs op against the current endpoint, failing over to the others.
func (c *Client) do(ctx context.Context, name string, kind callKind, op func(ctx context.Context, ep *endpoint) error) error {
	pause := c.opts.backoff
	var last error
	counted := 0 // failed attempts that count against maxAttempts
	for {
		ep, err := c.endpoint()
		if err != nil {
			return &Error{Op: name, Kind: ErrClosed, Cause: err}
		}
		callCtx, cancel := ctx, context.CancelFunc(func() {})
		if kind != blocking && c.opts.requestTimeout > 0 {
			callCtx, cancel = context.WithTimeout(ctx, c.opts.requestTimeout)
		}
		err = op(callCtx, ep)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil {
			return wrap(name, ctx.Err())
		}
		// A server that ran out of time may have applied the call.
		uncertain := transient(err) || connect.CodeOf(err) == connect.CodeDeadlineExceeded
		retry := notSent(err) || (kind != once && uncertain)
		if !retry {
			if kind == once && uncertain {
				return &Error{Op: name, Kind: ErrUnknownOutcome, Cause: err}
			}
			return wrap(name, err)
		}
		// A wait outlasts any number of attempts while no server could
		// answer it: only ctx bounds it. Errors the server itself
		// reported as unexpected are still counted, so that a wait does
		// not repeat a broken request forever.
		if kind != blocking || answered(err) {
			if counted++; counted >= c.opts.maxAttempts {
				break
			}
		}
		c.failover(ep, err)
		select {
		case <-ctx.Done():
			return wrap(name, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(pause*2, c.opts.maxBackoff)
	}
	if kind == once && !notSent(last) {
		return &Error{Op: name, Kind: ErrUnknownOutcome, Cause: last}
	}
	return &Error{Op: name, Kind: ErrUnavailable, Cause: last}
}

// splitTransport sends the KeepAlive bidirectional stream over HTTP/2 and
// everything else over HTTP/1.1.
type splitTransport struct {
	http1, http2 *http.Transport
}

func (t splitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, tenurev1connect.SessionServiceKeepAliveProcedure) {
		return t.http2.RoundTrip(req)
	}
	return t.http1.RoundTrip(req)
}
