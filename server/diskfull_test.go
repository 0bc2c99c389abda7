package server

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/raftnode"
)

func healthz(t *testing.T, url string) (int, string) { return getStatus(t, url+"/healthz") }

func readyz(t *testing.T, url string) (int, string) { return getStatus(t, url+"/readyz") }

// getStatus returns a GET's status and body.
func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// When the data directory's file system runs below the reserve, writes
// that add state fail with resource_exhausted naming the disk, reads and
// releases keep working, /healthz says why, and writes resume by
// themselves once space is back.
func TestLowDiskRefusesGrowingWritesAndRecoversByItself(t *testing.T) {
	var free atomic.Uint64
	free.Store(1 << 30)
	ts := startServer(t, t.TempDir(), testLimits(), func(c *raftnode.Config) {
		c.MinFreeBytes = 100 << 20
		c.DiskCheckInterval = 10 * time.Millisecond
		c.FreeSpace = func(string) (uint64, error) { return free.Load(), nil }
	})
	s := openSession(t, ts, "holder", time.Minute)
	keepAlive(t, ts, s.Id, 200*time.Millisecond)
	held := acquire(t, ts, s.Id, "job", false)
	if _, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "before"})); err != nil {
		t.Fatalf("put with room: %v", err)
	}

	free.Store(10 << 20)
	waitFor(t, "healthz to report the full disk", func() bool { code, _ := healthz(t, ts.URL); return code == http.StatusServiceUnavailable })
	if code, _ := getStatus(t, ts.URL+"/livez"); code != http.StatusOK {
		t.Errorf("/livez with a full disk: got = %d, expected: 200 (a restart would not free space)", code)
	}
	if _, body := healthz(t, ts.URL); !strings.Contains(body, "disk full") || !strings.Contains(body, "10.0 MiB free") {
		t.Fatalf("got = healthz %q, expected: the disk and its free space named", body)
	}

	_, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "during"}))
	wantCode(t, err, connect.CodeResourceExhausted, "disk full")
	var ce *connect.Error
	if !asConnect(err, &ce) || ce.Meta().Get(api.ErrorHeader) != "disk-full" {
		t.Fatalf("got = %v, expected: Tenure-Error disk-full", err)
	}
	_, err = ts.Sessions.Open(ctxT(t), connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "new"}))
	wantCode(t, err, connect.CodeResourceExhausted, "disk full")

	got, err := ts.KV.Get(ctxT(t), connect.NewRequest(&tenurev1.GetRequest{Key: "k"}))
	if err != nil || got.Msg.GetKv().GetValue() != "before" {
		t.Fatalf("read on a full disk: got = %v, %v, expected: the value written before", got, err)
	}
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: held.Token})); err != nil {
		t.Fatalf("release on a full disk: got = %v, expected: released (it frees state)", err)
	}
	if code, _ := readyz(t, ts.URL); code != http.StatusOK {
		t.Fatalf("got = readyz %d on a full disk, expected: 200 (reads are served)", code)
	}

	free.Store(1 << 30)
	waitFor(t, "healthz to recover", func() bool { code, _ := healthz(t, ts.URL); return code == http.StatusOK })
	if _, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "after"})); err != nil {
		t.Fatalf("put after space is back: %v", err)
	}
}

func asConnect(err error, target **connect.Error) bool { return errors.As(err, target) }

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
