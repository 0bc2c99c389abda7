package raftnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// tlsStream is the peer transport's listener over TLS: it completes
// each handshake before handing the connection on (so a peer without a
// certificate from the peer CA is dropped before a byte of it is read);
// dialTLS is the dialer's side, which presents this node's certificate
// and checks the other's. Handshakes run on their own goroutines, so a
// connection that stalls in one holds up no other.
type tlsStream struct {
	ln        net.Listener
	advertise net.Addr
	cfg       *tls.Config
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex            // guards shaking
	shaking map[net.Conn]struct{} // handshakes under way, cut by Close
}

func listenTLS(bind string, advertise net.Addr, cfg *tls.Config) (*tlsStream, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if advertise == nil {
		advertise = ln.Addr()
	}
	if tcp, ok := advertise.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		ln.Close()
		return nil, errors.New("local bind address is not advertisable")
	}
	server := cfg.Clone()
	server.ClientAuth = tls.RequireAndVerifyClientCert
	s := &tlsStream{ln: ln, advertise: advertise, cfg: server, conns: make(chan net.Conn), done: make(chan struct{}), shaking: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// handshakeTimeout bounds a TLS handshake on the raft port.
const handshakeTimeout = 10 * time.Second

func (s *tlsStream) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			time.Sleep(10 * time.Millisecond) // a transient accept error
			continue
		}
		s.wg.Add(1)
		go s.handshake(c)
	}
}

func (s *tlsStream) handshake(c net.Conn) {
	defer s.wg.Done()
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		c.Close()
		return
	default:
	}
	s.shaking[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.shaking, c)
		s.mu.Unlock()
	}()
	tc := tls.Server(c, s.cfg)
	_ = tc.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := tc.Handshake(); err != nil {
		c.Close() // not a member
		return
	}
	_ = tc.SetDeadline(time.Time{})
	select {
	case s.conns <- tc:
	case <-s.done:
		tc.Close()
	}
}

func (s *tlsStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

func (s *tlsStream) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		close(s.done)
		for c := range s.shaking {
			c.Close()
		}
		s.mu.Unlock()
		err = s.ln.Close()
		s.wg.Wait()
	})
	return err
}

func (s *tlsStream) Addr() net.Addr { return s.advertise }

func dialTLS(cfg *tls.Config, address string) *tls.Config {
	c := cfg.Clone()
	c.ClientAuth = tls.NoClientCert
	if host, _, err := net.SplitHostPort(address); err == nil {
		c.ServerName = host
	}
	return c
}

// ErrPeerNotTrusted is returned by CheckPeer for an address whose raft
// port does not present a certificate from the peer CA.
var ErrPeerNotTrusted = errors.New("peer not trusted")

// CheckPeer makes sure a node about to be added to the cluster at addr
// holds a certificate from the peer CA, by completing a TLS handshake
// with its raft port: a node that could never exchange raft traffic is
// refused at the door instead of sitting in the configuration. Without
// peer TLS there is nothing to check.
func (n *Node) CheckPeer(ctx context.Context, addr string) error {
	if n.peerTLS == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	d := &tls.Dialer{Config: dialTLS(n.peerTLS, addr)}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: the raft port at %s did not show a certificate from the peer CA: %w", ErrPeerNotTrusted, addr, err)
	}
	return c.Close()
}
