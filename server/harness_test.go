package server

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
)

// testServer is a single node on 127.0.0.1 free ports with short raft
// timeouts and a 100ms minimum TTL, and clients for each service.
type testServer struct {
	*Server
	URL      string
	Sessions tenurev1connect.SessionServiceClient
	Leases   tenurev1connect.LeaseServiceClient
	KV       tenurev1connect.KVServiceClient
}

func testLimits() Limits {
	l := DefaultLimits()
	l.MinTTL = 100 * time.Millisecond
	l.DefaultTTL = time.Second
	return l
}

func startServer(t testing.TB, dir string, limits Limits, tweaks ...func(*raftnode.Config)) *testServer {
	t.Helper()
	ts := openServer(t, dir, limits, tweaks...)
	waitReady(t, ts.URL)
	return ts
}

// openServer starts a node on dir without waiting for it to be ready, as
// a client that calls the moment the port answers would find it.
func openServer(t testing.TB, dir string, limits Limits, tweaks ...func(*raftnode.Config)) *testServer {
	t.Helper()
	ln := testnet.Listen(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("TENURE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rc := raftnode.Config{
		NodeID:          "node1",
		DataDir:         dir,
		PeerAddr:        "127.0.0.1:0",
		Bootstrap:       true,
		ElectionTimeout: 100 * time.Millisecond,
		WALSegmentSize:  testWALSegmentSize,
	}
	for _, tweak := range tweaks {
		tweak(&rc)
	}
	srv, err := Open(Config{Listener: ln, Limits: limits, Logger: logger, Raft: rc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	url := "http://" + srv.Addr()
	hc := h2cClient(t)
	ts := &testServer{
		Server:   srv,
		URL:      url,
		Sessions: tenurev1connect.NewSessionServiceClient(hc, url),
		Leases:   tenurev1connect.NewLeaseServiceClient(hc, url),
		KV:       tenurev1connect.NewKVServiceClient(hc, url),
	}
	return ts
}

// h2cClient speaks cleartext HTTP/2, as a Go client of Tenure does, so
// bidirectional streams work.
func h2cClient(t testing.TB) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func waitReady(t testing.TB, url string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("server at %s not ready after 10s", url)
}

// oneNodeRaft is the raft configuration of a test's single node that
// bootstraps itself on loopback, with a fast election.
func oneNodeRaft(t testing.TB) raftnode.Config {
	return raftnode.Config{
		NodeID: "node1", DataDir: t.TempDir(), PeerAddr: "127.0.0.1:0", Bootstrap: true,
		ElectionTimeout: 100 * time.Millisecond, WALSegmentSize: testWALSegmentSize,
	}
}

// testWALSegmentSize is the WAL segment size of the tests' nodes, the
// smallest --wal-segment-size takes. raft-wal's default, 64 MiB, is read
// whole each time a node opens its log again, which under the race
// detector cost a second or more a restart.
const testWALSegmentSize = 1 << 20
