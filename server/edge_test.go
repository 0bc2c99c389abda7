package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Regression tests for the edge defects of issue 7 item 6: NDJSON watch
// headers, request bodies, explicit zero TTLs and '/' in lease names.

func TestNDJSONWatchesSendHeadersBeforeAnyEvent(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "a", 5*time.Second)
	cases := []struct {
		name  string
		path  string
		event func() error
		want  string
	}{
		{"lease watch", "/v1/watch/leases?namespace=default", func() error {
			_, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id, Name: "after-headers"}))
			return err
		}, `"name":"after-headers"`},
		{"key watch", "/v1/watch/keys?key=jobs/&prefix=true", func() error {
			_, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "jobs/after-headers", Value: "v"}))
			return err
		}, `"key":"jobs/after-headers"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// No event is due: before the fix, Do waited for the first one.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				resp *http.Response
				err  error
			}
			got := make(chan result, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				got <- result{resp, err}
			}()
			var resp *http.Response
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatal(r.err)
				}
				resp = r.resp
			case <-time.After(5 * time.Second):
				cancel()
				if r := <-got; r.err == nil {
					r.resp.Body.Close()
				}
				t.Fatal("got = no response headers after 5s, expected: 200 as soon as the watch is registered")
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
				t.Fatalf("got = %d %q, expected: 200 application/x-ndjson", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			// The 200 means registered: an event written now is seen.
			if err := tc.event(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || !strings.Contains(line, tc.want) {
				t.Fatalf("got = %q, %v, expected: an event line with %s", line, err, tc.want)
			}
		})
	}
	t.Run("a bad request is still a 4xx", func(t *testing.T) {
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get(ts.URL + "/v1/watch/leases?start_revision=-1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "start_revision -1 is negative") {
			t.Fatalf("got = %d %q, expected: 400 naming start_revision", resp.StatusCode, body)
		}
	})
}

// rawHTTP writes request to the server on a fresh connection and returns
// the status line and the body, or fails if the server neither answers
// nor closes within 5s.
func rawHTTP(t *testing.T, ts *testServer, request string) (status, body string) {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("got = %v, expected: a response within 5s", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

func TestOversizedBodyIsRefusedFromItsContentLength(t *testing.T) {
	limits := testLimits()
	limits.MaxRequestBytes = 64 << 10
	ts := startServer(t, t.TempDir(), limits)
	// Headers only: before the fix the server waited to read the body.
	for _, length := range []int{1 << 30, 100 << 10} {
		t.Run(fmt.Sprintf("curl declaring %d bytes gets 413 without sending them", length), func(t *testing.T) {
			status, body := rawHTTP(t, ts, "POST /tenure.v1.KVService/Put HTTP/1.1\r\nHost: tenure\r\n"+
				fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", length))
			if !strings.HasPrefix(status, "413") {
				t.Fatalf("status got = %s, expected: 413", status)
			}
			want := fmt.Sprintf(`{"code":"resource_exhausted","message":"request body of %d bytes (Content-Length) is over the limit of 65536 bytes (--max-request-bytes)"}`, length)
			if body != want {
				t.Fatalf("body got = %s, expected: %s", body, want)
			}
		})
	}
	t.Run("a connect client gets resource_exhausted naming the limit", func(t *testing.T) {
		_, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: strings.Repeat("v", 100<<10)}))
		wantCode(t, err, connect.CodeResourceExhausted, "over the limit of 65536 bytes (--max-request-bytes)")
	})
	t.Run("a body within the limit is served", func(t *testing.T) {
		if code, out := postJSON(t, ts.URL, "tenure.v1.KVService/Put", `{"key":"k","value":"v"}`); code != http.StatusOK {
			t.Fatalf("got = %d %v, expected: 200", code, out)
		}
	})
}

func TestSlowRequestBodyTimesOut(t *testing.T) {
	limits := testLimits()
	limits.RequestReadTimeout = 200 * time.Millisecond
	ts := startServer(t, t.TempDir(), limits)
	start := time.Now()
	// Half a body, then nothing: before the fix the handler waited forever.
	status, body := rawHTTP(t, ts, "POST /tenure.v1.KVService/Put HTTP/1.1\r\nHost: tenure\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key\":")
	if elapsed := time.Since(start); elapsed < limits.RequestReadTimeout {
		t.Fatalf("answered after %v, expected: not before the %v read timeout", elapsed, limits.RequestReadTimeout)
	}
	if !strings.Contains(body, "request body not received within 200ms (--request-read-timeout)") {
		t.Fatalf("got = %s %q, expected: a message naming --request-read-timeout", status, body)
	}
}

// The read timeout bounds receiving a body, not a call: streams and calls
// that wait after reading their request outlive it.
func TestCallsAndStreamsOutliveTheRequestReadTimeout(t *testing.T) {
	limits := testLimits()
	limits.RequestReadTimeout = 200 * time.Millisecond
	ts := startServer(t, t.TempDir(), limits)
	ctx := ctxT(t)
	past := func() { time.Sleep(3 * limits.RequestReadTimeout) }

	t.Run("KeepAlive stream", func(t *testing.T) {
		s := openSession(t, ts, "ka", 5*time.Second)
		stream := ts.Sessions.KeepAlive(ctx)
		defer stream.CloseResponse()
		for i := range 2 {
			if i > 0 {
				past()
			}
			if err := stream.Send(&tenurev1.KeepAliveRequest{SessionId: s.Id}); err != nil {
				t.Fatalf("heartbeat %d: %v", i, err)
			}
			resp, err := stream.Receive()
			if err != nil || resp.Expired {
				t.Fatalf("heartbeat %d got = %v, %v, expected: renewed", i, resp, err)
			}
		}
		_ = stream.CloseRequest()
	})

	t.Run("waiting Acquire over HTTP/1.1", func(t *testing.T) {
		holder := openSession(t, ts, "holder", 5*time.Second)
		waiter := openSession(t, ts, "waiter", 5*time.Second)
		keepAlive(t, ts, holder.Id, time.Second)
		keepAlive(t, ts, waiter.Id, time.Second)
		token := acquire(t, ts, holder.Id, "slow", false).Token
		type result struct {
			code int
			out  map[string]any
		}
		got := make(chan result, 1)
		go func() {
			resp, err := http.Post(ts.URL+"/tenure.v1.LeaseService/Acquire", "application/json",
				strings.NewReader(fmt.Sprintf(`{"sessionId":"%d","name":"slow","wait":true}`, waiter.Id)))
			if err != nil {
				got <- result{0, map[string]any{"error": err.Error()}}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			got <- result{resp.StatusCode, map[string]any{"body": string(b)}}
		}()
		waitForWaiters(t, ts, "slow", 1)
		past()
		if _, err := ts.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: "slow", Token: token})); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.code != http.StatusOK || !strings.Contains(fmt.Sprint(r.out["body"]), `"acquired":true`) {
			t.Fatalf("got = %d %v, expected: 200 acquired after the wait", r.code, r.out)
		}
	})

	t.Run("NDJSON watch over HTTP/1.1", func(t *testing.T) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/v1/watch/keys?key=late", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		past()
		if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "late", Value: "v"})); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.Contains(line, `"key":"late"`) {
			t.Fatalf("got = %q, %v, expected: the event after the read timeout", line, err)
		}
	})
}

func TestExplicitZeroTTLIsRefusedNotDefaulted(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	cases := []struct {
		name, method, body string
		code               int
		contains           string
	}{
		{"a session with ttl 0s", "tenure.v1.SessionService/Open", `{"ttl":"0s"}`,
			400, "ttl 0s is outside 100ms..24h0m0s (--min-ttl, --max-ttl); leave ttl out for the default 1s (--default-ttl)"},
		{"a key with ttl 0s", "tenure.v1.KVService/Put", `{"key":"k","value":"v","ttl":"0s"}`,
			400, "ttl 0s is outside 100ms..24h0m0s (--min-ttl, --max-ttl); leave ttl out for no TTL"},
		{"a session without ttl gets the default", "tenure.v1.SessionService/Open", `{}`,
			200, `"ttl":"1s"`},
		{"a key without ttl has none", "tenure.v1.KVService/Put", `{"key":"k","value":"v"}`,
			200, `"revision"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(ts.URL+"/"+tc.method, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.contains) {
				t.Fatalf("got = %d %s, expected: %d containing %q", resp.StatusCode, body, tc.code, tc.contains)
			}
		})
	}
	t.Run("capacity 0 means 1, as documented", func(t *testing.T) {
		s := openSession(t, ts, "c", 5*time.Second)
		resp, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id, Name: "cap", Capacity: 0}))
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.Msg.GetLease().GetCapacity(); c != 1 {
			t.Fatalf("capacity got = %d, expected: 1", c)
		}
	})
}

func TestSlashInLeaseNamesIsRefused(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	ctx := ctxT(t)
	s := openSession(t, ts, "a", 5*time.Second)
	const want = `name "prod/scheduler" has a '/' at byte 4`
	calls := []struct {
		name string
		call func() error
	}{
		{"Acquire", func() error {
			_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id, Name: "prod/scheduler"}))
			return err
		}},
		{"Release", func() error {
			_, err := ts.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: "prod/scheduler", Token: 1}))
			return err
		}},
		{"Get", func() error {
			_, err := ts.Leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Name: "prod/scheduler"}))
			return err
		}},
		{"Validate", func() error {
			_, err := ts.Leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Name: "prod/scheduler", Token: 1}))
			return err
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(), connect.CodeInvalidArgument, want)
		})
	}
	t.Run("NDJSON lease watch", func(t *testing.T) {
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get(ts.URL + "/v1/watch/leases?name=prod/scheduler")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), want) {
			t.Fatalf("got = %d %q, expected: 400 containing %q", resp.StatusCode, body, want)
		}
	})
	t.Run("keys may still hold '/'", func(t *testing.T) {
		if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "jobs/a/b", Value: "v", Ttl: durationpb.New(time.Second)})); err != nil {
			t.Fatal(err)
		}
	})
}
