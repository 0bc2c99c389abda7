// Package testserver starts a real single-node Tenure server for the
// tests and runnable examples of other packages: 127.0.0.1 free ports,
// short raft timeouts, and a temporary data directory.
package testserver

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

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
	srv, err := server.Open(server.Config{
		Listener: ln,
		Limits:   limits,
		Logger:   slog.New(slog.DiscardHandler),
		Raft: raftnode.Config{
			DataDir:            dir,
			PeerAddr:           "127.0.0.1:0",
			Bootstrap:          true,
			HeartbeatTimeout:   100 * time.Millisecond,
			ElectionTimeout:    100 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond,
		},
	})
	if err != nil {
		ln.Close()
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() {
		srv.Close()
		os.RemoveAll(dir)
	}
	if err := waitReady(srv.Addr()); err != nil {
		stop()
		return "", nil, err
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
