// Package testserver starts a real single-node Tenure server for the
// tests and runnable examples of other packages: 127.0.0.1 free ports,
// short raft timeouts, and a temporary data directory. Node is one that a
// test can stop and start again, as the same raft node on the same
// address, to see what a client makes of a server restart.
package testserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// Limits are the server's defaults with a 100ms minimum TTL, so that
// loss and expiry tests run in a second.
func Limits() server.Limits {
	l := server.DefaultLimits()
	l.MinTTL = 100 * time.Millisecond
	return l
}

// Open starts a node keeping its data in a new temporary directory and
// returns once it is ready (/readyz). The caller must call stop, which
// closes the node and removes the directory.
func Open(limits server.Limits) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "tenure-test-")
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	srv, err := open(ln, dir, "127.0.0.1:0", limits)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() {
		srv.Close()
		os.RemoveAll(dir)
	}
	return srv.Addr(), stop, nil
}

// Start is Open for a test: it fails the test on error and stops the
// node when the test ends.
func Start(tb testing.TB, limits server.Limits) string {
	tb.Helper()
	addr, stop, err := Open(limits)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	return addr
}

// open starts a server on ln with its raft data in dir, and returns once
// it is ready. It closes ln when it fails.
func open(ln net.Listener, dir, peer string, limits server.Limits, authn ...*auth.Authenticator) (*server.Server, error) {
	cfg := server.Config{
		Listener: ln,
		Limits:   limits,
		Logger:   slog.New(slog.DiscardHandler),
		Raft: raftnode.Config{
			DataDir:         dir,
			PeerAddr:        peer,
			Bootstrap:       true,
			ElectionTimeout: 100 * time.Millisecond,
		},
	}
	if len(authn) > 0 {
		cfg.Auth = authn[0]
	}
	srv, err := server.Open(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	if err := waitReady(srv.Addr()); err != nil {
		srv.Close()
		return nil, err
	}
	return srv, nil
}

// Node is a single-node server that can be stopped and started again on
// the same data directory, API address and peer address: a restart of
// the same raft node, which keeps its sessions, grants and queues. Its
// methods are meant for one test goroutine; Addr is safe anywhere. The
// caller should call Close when finished.
type Node struct {
	limits          server.Limits
	dir, addr, peer string

	mu  sync.Mutex     // guards srv
	srv *server.Server // nil while stopped
}

// OpenNode starts a restartable node in a new temporary directory and
// returns once it is ready.
func OpenNode(limits server.Limits) (*Node, error) {
	dir, err := os.MkdirTemp("", "tenure-test-")
	if err != nil {
		return nil, err
	}
	// The peer address must not change across restarts: it is the
	// node's address in its own raft configuration. A port that was free
	// a moment ago will do on 127.0.0.1.
	peer, err := testnet.FreeAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n := &Node{limits: limits, dir: dir, addr: ln.Addr().String(), peer: peer}
	if n.srv, err = open(ln, dir, peer, limits); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return n, nil
}

// StartNode is OpenNode for a test: it fails the test on error and
// closes the node when the test ends.
func StartNode(tb testing.TB, limits server.Limits) *Node {
	tb.Helper()
	n, err := OpenNode(limits)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { n.Close() })
	return n
}

// Addr is the node's API endpoint, "127.0.0.1:port", the same across
// restarts.
func (n *Node) Addr() string { return n.addr }

// Stop shuts the server down as a clean exit would: it stops listening
// at once, gives calls under way up to the server's shutdown grace (2s)
// to finish, then cuts every connection. The data directory stays.
// Stopping a stopped node does nothing.
func (n *Node) Stop() error {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// Start starts a stopped node again on its data directory and address,
// and returns once it is ready (/readyz): elected, its log replayed, its
// lessor promoted.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return errors.New("testserver: node is running")
	}
	ln, err := net.Listen("tcp", n.addr)
	if err != nil {
		return fmt.Errorf("testserver: listen on %s again: %w", n.addr, err)
	}
	srv, err := open(ln, n.dir, n.peer, n.limits)
	if err != nil {
		return err
	}
	n.srv = srv
	return nil
}

// Close stops the node and removes its data directory.
func (n *Node) Close() error {
	err := n.Stop()
	os.RemoveAll(n.dir)
	return err
}

// waitReady polls /readyz: the node has elected itself and promoted its
// lessor, so sessions and reads work.
func waitReady(addr string) error {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server at %s not ready after 10s (last error: %v)", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
