package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// etcdListener serves gRPC and HTTP/1.1 on the etcd port, as etcd's
// client port does, telling them apart on each connection by its first
// bytes: HTTP/2's client preface goes to the gRPC server, anything else
// to the HTTP server. etcd does the same in cleartext (cmux's HTTP2()
// and HTTP1() matchers, go.etcd.io/etcd/server/v3/embed/serve.go). gRPC
// keeps its own server and transport, so its calls cost what they did
// before the port spoke HTTP; grpc.Server.ServeHTTP, which etcd uses
// over TLS, would run gRPC on net/http's HTTP/2 server instead, slower
// and without gRPC's keep-alive enforcement.
//
// Over TLS the listener makes the handshake, with the etcd API's
// configuration and gRPC's defaults for it (h2's cipher suites, TLS 1.2
// at least), and then looks at the first bytes in the clear. ALPN
// agrees "http/1.1" with a client that offers it (curl, browsers,
// Python's requests), so it speaks HTTP/1.1 to the gateway, and "h2"
// with a client that offers only that (gRPC's). The gRPC server, given
// connections already secured, reads their state through
// handshakenCreds, so a client certificate names the caller as before.
//
// A connection waits at most sniffTimeout for its handshake and first
// bytes; any client sends them at once.
type etcdListener struct {
	ln   net.Listener
	tls  *tls.Config // nil: cleartext
	grpc *connQueue
	http *connQueue

	mu      sync.Mutex // guards pending and closed
	pending map[net.Conn]struct{}
	closed  bool
	stopC   chan struct{}  // closed by close: a sniffed connection is dropped
	wg      sync.WaitGroup // each connection's sniff
}

const sniffTimeout = 30 * time.Second

// http2Preface is what an HTTP/2 client sends first.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// newEtcdListener splits ln; tlsConfig nil serves cleartext. The
// caller starts it with serve and ends it with close.
func newEtcdListener(ln net.Listener, tlsConfig *tls.Config) *etcdListener {
	l := &etcdListener{
		ln:      ln,
		grpc:    newConnQueue(ln.Addr()),
		http:    newConnQueue(ln.Addr()),
		pending: map[net.Conn]struct{}{},
		stopC:   make(chan struct{}),
	}
	if tlsConfig != nil {
		l.tls = etcdServerTLS(tlsConfig)
	}
	return l
}

// serve accepts connections until ln is closed, and returns the error
// that ended it; nil when close ended it.
func (l *etcdListener) serve() error {
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if closed {
				return nil
			}
			return err
		}
		delay = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return nil
		}
		l.pending[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.route(c)
	}
}

// route makes c's handshake, reads its first bytes and hands it to the
// gRPC or the HTTP server.
func (l *etcdListener) route(raw net.Conn) {
	defer l.wg.Done()
	c, grpc, err := l.sniff(raw)
	l.mu.Lock()
	delete(l.pending, raw)
	closed := l.closed
	l.mu.Unlock()
	if err != nil || closed {
		raw.Close()
		return
	}
	q := l.http
	if grpc {
		q = l.grpc
	}
	select {
	case q.c <- c:
	case <-q.done:
		c.Close()
	case <-l.stopC:
		c.Close()
	}
}

func (l *etcdListener) sniff(raw net.Conn) (net.Conn, bool, error) {
	if err := raw.SetDeadline(time.Now().Add(sniffTimeout)); err != nil {
		return nil, false, err
	}
	conn := raw
	if l.tls != nil {
		tc := tls.Server(raw, l.tls)
		if err := tc.HandshakeContext(context.Background()); err != nil {
			return nil, false, err
		}
		conn = tc
	}
	r := bufio.NewReaderSize(conn, connReadBuffer)
	h2 := true
	for n := 1; n <= len(http2Preface); n++ {
		b, err := r.Peek(n)
		if err != nil {
			return nil, false, err
		}
		if b[n-1] != http2Preface[n-1] {
			h2 = false
			break
		}
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, false, err
	}
	return &bufferedConn{Conn: conn, r: r}, h2, nil
}

// close stops accepting, drops the connections not yet handed over and
// waits for their sniffs to end. The servers close the queues they were
// given; serve returns.
func (l *etcdListener) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.stopC)
	for c := range l.pending {
		c.Close()
	}
	l.mu.Unlock()
	_ = l.ln.Close()
	l.wg.Wait()
}

// tlsState is the TLS state of a connection the listener secured.
func tlsState(c net.Conn) (tls.ConnectionState, bool) {
	if bc, ok := c.(*bufferedConn); ok {
		c = bc.Conn
	}
	if tc, ok := c.(*tls.Conn); ok {
		return tc.ConnectionState(), true
	}
	return tls.ConnectionState{}, false
}

// etcdServerTLS is cfg with gRPC's defaults (credentials.NewTLS) and
// ALPN chosen by the client's offer: "http/1.1" when it offers it, else
// "h2".
func etcdServerTLS(cfg *tls.Config) *tls.Config {
	withDefaults := func(c *tls.Config, proto string) *tls.Config {
		c = c.Clone()
		c.NextProtos = []string{proto}
		if c.MinVersion == 0 && (c.MaxVersion == 0 || c.MaxVersion >= tls.VersionTLS12) {
			c.MinVersion = tls.VersionTLS12
		}
		if c.CipherSuites == nil {
			// The secure suites HTTP/2 allows (RFC 7540 appendix A
			// forbids the rest): ephemeral key exchange and AEAD.
			for _, cs := range tls.CipherSuites() {
				if strings.HasPrefix(cs.Name, "TLS_ECDHE_") && (strings.Contains(cs.Name, "_GCM_") || strings.Contains(cs.Name, "CHACHA20")) {
					c.CipherSuites = append(c.CipherSuites, cs.ID)
				}
			}
		}
		c.GetConfigForClient = nil
		return c
	}
	h2, h1 := withDefaults(cfg, "h2"), withDefaults(cfg, "http/1.1")
	orig := cfg.GetConfigForClient
	out := h2.Clone()
	out.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		proto := "h2"
		if slices.Contains(hello.SupportedProtos, "http/1.1") {
			proto = "http/1.1"
		}
		if orig != nil {
			c, err := orig(hello)
			if err != nil || c != nil {
				if c != nil {
					c = withDefaults(c, proto)
				}
				return c, err
			}
		}
		if proto == "h2" {
			return h2, nil
		}
		return h1, nil
	}
	return out
}

// handshakenCreds are the gRPC server's transport credentials when the
// etcd listener made the TLS handshake: they check nothing more and
// give the caller's TLS state, as gRPC's TLS credentials would. The
// gateway's in-process connection is the only one without TLS.
type handshakenCreds struct{}

func (handshakenCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, ok := c.(gatewayConn); ok {
		return c, nil, nil
	}
	st, ok := tlsState(c)
	if !ok {
		return nil, nil, errors.New("etcd API: a connection without TLS")
	}
	if st.NegotiatedProtocol == "" {
		// As gRPC's own credentials refuse it (GRPC_ENFORCE_ALPN_ENABLED).
		return nil, nil, errors.New("etcd API: a gRPC client that did not negotiate h2 with ALPN")
	}
	return c, credentials.TLSInfo{State: st, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (handshakenCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("etcd API: server credentials only")
}

func (handshakenCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (handshakenCreds) Clone() credentials.TransportCredentials { return handshakenCreds{} }

func (handshakenCreds) OverrideServerName(string) error { return nil }

// connQueue is a net.Listener whose connections another goroutine
// pushes. Close is safe to call twice.
type connQueue struct {
	addr net.Addr
	c    chan net.Conn
	once sync.Once
	done chan struct{}
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, c: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.c:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }
