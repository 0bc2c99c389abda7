package fence_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tenurehq/tenure/fence"
)

// countingServer serves h over 127.0.0.1 and counts the requests that
// reach it.
func countingServer(t *testing.T, h http.Handler) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// closeRecorder is a request body that records being closed.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (b *closeRecorder) Close() error { b.closed = true; return nil }

func TestTransportFencesRequests(t *testing.T) {
	srv, _ := countingServer(t, fence.Middleware(fence.Monotonic(fence.NewMemoryStore()), echoToken))
	src := newSource(tok("default", "db-writer", 5), true)
	hc := &http.Client{Transport: fence.Transport(srv.Client().Transport, src)}
	defer hc.CloseIdleConnections()

	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/rows/1", strings.NewReader("v"))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "default/db-writer:5" {
		t.Fatalf("got = %d %q, expected: 200 default/db-writer:5", resp.StatusCode, body)
	}
	if v := req.Header.Get(fence.Header); v != "" {
		t.Fatalf("got = the caller's request changed (%s: %s), expected: left alone", fence.Header, v)
	}

	// A successor writes; the old token is now refused by the resource.
	succ := &http.Client{Transport: fence.Transport(srv.Client().Transport, newSource(tok("default", "db-writer", 6), true))}
	if got := post(t, succ, srv.URL); got != http.StatusOK {
		t.Fatalf("successor: got = %d, expected: 200", got)
	}
	if got := post(t, hc, srv.URL); got != http.StatusConflict {
		t.Fatalf("deposed holder: got = %d, expected: 409", got)
	}
}

func post(t *testing.T, hc *http.Client, url string) int {
	t.Helper()
	resp, err := hc.Post(url, "text/plain", strings.NewReader("v"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestTransportRefusesToSendWithoutAValidToken(t *testing.T) {
	tests := []struct {
		name string
		src  *source
		why  string
	}{
		{"a lost grant sends nothing", newSource(tok("default", "db-writer", 5), false), "fencing token default/db-writer:5 is no longer valid"},
		{"a lease never held sends nothing", newSource(tok("default", "db-writer", 0), false), "default/db-writer is not held"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, n := countingServer(t, echoToken)
			hc := &http.Client{Transport: fence.Transport(srv.Client().Transport, tt.src)}
			body := &closeRecorder{Reader: strings.NewReader("v")}
			req, _ := http.NewRequest(http.MethodPut, srv.URL+"/rows/1", body)
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			if !errors.Is(err, fence.ErrNotHolding) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("got = %v, expected: ErrNotHolding saying %q", err, tt.why)
			}
			if n.Load() != 0 {
				t.Fatalf("got = %d requests at the server, expected: none", n.Load())
			}
			if !body.closed {
				t.Fatal("got = body left open, expected: closed as a RoundTripper must")
			}
		})
	}
}

func TestTransportChecksEveryRequest(t *testing.T) {
	srv, n := countingServer(t, echoToken)
	src := newSource(tok("default", "db-writer", 5), true)
	hc := &http.Client{Transport: fence.Transport(srv.Client().Transport, src)}
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	src.set(tok("default", "db-writer", 5), false) // the grant is lost
	if _, err := hc.Get(srv.URL); !errors.Is(err, fence.ErrNotHolding) {
		t.Fatalf("got = %v, expected: ErrNotHolding", err)
	}
	if n.Load() != 1 {
		t.Fatalf("got = %d requests at the server, expected: 1", n.Load())
	}
}
