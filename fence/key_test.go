package fence_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenurehq/tenure/fence"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want fence.LockKey
	}{
		{"mylock/694d7b3c2a1f0e05:9", fence.LockKey{Key: "mylock/694d7b3c2a1f0e05", Revision: 9}},
		{"  a:b/c:12 ", fence.LockKey{Key: "a:b/c", Revision: 12}},
		{"with%20space%25/%C3%A9:3", fence.LockKey{Key: "with space%/é", Revision: 3}},
	} {
		got, err := fence.ParseKey(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseKey(%q): got = %+v, %v, expected: %+v", tc.in, got, err, tc.want)
		}
		if back, err := fence.ParseKey(fence.FormatKey(got)); err != nil || back != got {
			t.Errorf("ParseKey(FormatKey(%+v)): got = %+v, %v, expected: the same key", got, back, err)
		}
	}
	for _, tc := range []struct{ in, why string }{
		{"", "no ':' before the revision"},
		{"mylock/1a", "no ':' before the revision"},
		{"mylock/1a:", `revision "" is not a decimal number`},
		{"mylock/1a:-5", `revision "-5" is not a decimal number`},
		{"mylock/1a:0", "revision must be positive, got 0"},
		{"mylock/1a:99999999999999999999", "larger than an int64"},
		{":5", "empty key"},
		{"bad%zz:5", "not percent-encoded properly"},
		{"%FF:5", "not UTF-8"},
	} {
		_, err := fence.ParseKey(tc.in)
		if !errors.Is(err, fence.ErrMalformed) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("ParseKey(%q): got = %v, expected: ErrMalformed saying %q", tc.in, err, tc.why)
		}
	}
}

func TestLockKeyLock(t *testing.T) {
	for key, want := range map[string]string{
		"mylock/694d7b3c2a1f0e05": "mylock",
		"a/b/7":                   "a/b",
		"solo":                    "solo",
	} {
		if got := (fence.LockKey{Key: key, Revision: 1}).Lock(); got != want {
			t.Errorf("LockKey{%q}.Lock(): got = %q, expected: %q", key, got, want)
		}
	}
}

// echoFence answers with the lock key or token Middleware accepted.
var echoFence = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if k, ok := fence.KeyFromContext(r.Context()); ok {
		fmt.Fprint(w, "key ", k)
		return
	}
	if t, ok := fence.FromContext(r.Context()); ok {
		fmt.Fprint(w, "token ", t)
		return
	}
	http.Error(w, "nothing in context", http.StatusInternalServerError)
})

func serveFenced(h http.Handler, headers map[string]string) (int, string) {
	req := httptest.NewRequest(http.MethodPut, "/rows/1", nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// TestMiddlewareRefusesTheStaleEtcdHolder: two holders of one etcd lock,
// made by etcd's recipe (<lock>/<lease ID>) at revisions 5 and 9, write to
// a resource that remembers the highest revision per lock. Once the
// newer one wrote, the older one is refused; Tenure tokens keep working
// beside them.
func TestMiddlewareRefusesTheStaleEtcdHolder(t *testing.T) {
	h := fence.Middleware(fence.Monotonic(fence.NewMemoryStore()), echoFence,
		fence.WithLockKeys(fence.MonotonicKey(fence.NewMemoryStore())))
	key := func(v string) map[string]string { return map[string]string{fence.KeyHeader: v} }
	for _, step := range []struct {
		name    string
		headers map[string]string
		code    int
		body    string
	}{
		{"the first holder writes", key("mylock/1a:5"), http.StatusOK, "key mylock/1a:5"},
		{"the newer holder writes", key("mylock/2b:9"), http.StatusOK, "key mylock/2b:9"},
		{"the first holder, back from a pause, is refused", key("mylock/1a:5"), http.StatusConflict,
			`stale lock key mylock/1a:5: a request with revision 9 for lock "mylock" was already accepted`},
		{"the newer holder writes again", key("mylock/2b:9"), http.StatusOK, "key mylock/2b:9"},
		{"another lock's holder is apart", key("otherlock/1a:5"), http.StatusOK, "key otherlock/1a:5"},
		{"a Tenure token still works", map[string]string{fence.Header: "default/db-writer:3"}, http.StatusOK, "token default/db-writer:3"},
		{"both headers are refused", map[string]string{fence.Header: "default/db-writer:3", fence.KeyHeader: "mylock/2b:9"}, http.StatusBadRequest,
			"both Tenure-Fence and Tenure-Fence-Key headers"},
		{"a malformed key is refused", key("mylock/2b"), http.StatusBadRequest, "no ':' before the revision"},
		{"neither header is refused, naming both", nil, http.StatusPreconditionRequired,
			"the Tenure-Fence header (<namespace>/<name>:<token>) or the Tenure-Fence-Key header (<key>:<revision>) is required"},
	} {
		code, body := serveFenced(h, step.headers)
		if code != step.code || !strings.Contains(body, step.body) {
			t.Errorf("%s: got = %d %q, expected: %d %q", step.name, code, body, step.code, step.body)
		}
	}
}

func TestMiddlewareWithoutLockKeysIgnoresTheKeyHeader(t *testing.T) {
	h := fence.Middleware(fence.Monotonic(fence.NewMemoryStore()), echoFence)
	code, body := serveFenced(h, map[string]string{fence.KeyHeader: "mylock/1a:5"})
	if code != http.StatusPreconditionRequired || !strings.Contains(body, "the Tenure-Fence header is required") {
		t.Fatalf("got = %d %q, expected: 428 asking for the Tenure-Fence header", code, body)
	}
	keysOnly := fence.Middleware(nil, echoFence, fence.WithLockKeys(fence.MonotonicKey(fence.NewMemoryStore())))
	code, body = serveFenced(keysOnly, map[string]string{fence.Header: "default/db-writer:3"})
	if code != http.StatusPreconditionRequired || !strings.Contains(body, "the Tenure-Fence-Key header is required") {
		t.Fatalf("keys only: got = %d %q, expected: 428 asking for the Tenure-Fence-Key header", code, body)
	}
}

func TestMonotonicKeyRefusesWhenTheStoreFails(t *testing.T) {
	broken := errors.New("disk full")
	p := fence.MonotonicKey(storeFunc(func(string, int64) (int64, error) { return 0, broken }))
	err := p.CheckKey(context.Background(), fence.LockKey{Key: "mylock/1a", Revision: 5})
	if !errors.Is(err, fence.ErrUnavailable) || !errors.Is(err, broken) {
		t.Fatalf("got = %v, expected: ErrUnavailable wrapping the store's error", err)
	}
	var lock string
	p = fence.MonotonicKey(storeFunc(func(l string, n int64) (int64, error) { lock = l; return n, nil }))
	if err := p.CheckKey(context.Background(), fence.LockKey{Key: "mylock/1a", Revision: 5}); err != nil || lock != "etcd:mylock" {
		t.Fatalf("got = %v in entry %q, expected: accepted in entry %q", err, lock, "etcd:mylock")
	}
}

func TestStaleKeyErrorSaysWhy(t *testing.T) {
	k := fence.LockKey{Key: "mylock/1a", Revision: 5}
	for _, tc := range []struct {
		err  *fence.StaleKeyError
		want string
	}{
		{&fence.StaleKeyError{Key: k, KVRevision: 12}, "stale lock key mylock/1a:5: the key does not exist (the lock was released or its lease ended)"},
		{&fence.StaleKeyError{Key: k, Current: 9, KVRevision: 12}, "stale lock key mylock/1a:5: a newer holder made the key at revision 9"},
		{&fence.StaleKeyError{Key: k, Current: 4, KVRevision: 3}, "stale lock key mylock/1a:5: revision 5 is later than the keys' current revision 3"},
	} {
		if got := tc.err.Error(); got != tc.want || !errors.Is(tc.err, fence.ErrStale) {
			t.Errorf("got = %q, expected: %q matching ErrStale", got, tc.want)
		}
	}
}

// TestInterceptorRefusesTheStaleEtcdHolder is the same over Connect.
func TestInterceptorRefusesTheStaleEtcdHolder(t *testing.T) {
	fenced := connect.WithInterceptors(fence.Interceptor(nil, fence.WithLockKeys(fence.MonotonicKey(fence.NewMemoryStore()))))
	mux := http.NewServeMux()
	mux.Handle(writeProc, connect.NewUnaryHandler(writeProc, func(ctx context.Context, _ *connect.Request[msg]) (*connect.Response[msg], error) {
		k, _ := fence.KeyFromContext(ctx)
		return connect.NewResponse(wrapperspb.String(k.String())), nil
	}, fenced))
	srv, n := countingServer(t, mux)
	write := connect.NewClient[msg, msg](srv.Client(), srv.URL+writeProc)
	call := func(k string) (string, error) {
		req := connect.NewRequest(wrapperspb.String("v"))
		req.Header().Set(fence.KeyHeader, k)
		resp, err := write.CallUnary(context.Background(), req)
		if err != nil {
			return "", err
		}
		return resp.Msg.GetValue(), nil
	}
	for _, k := range []string{"mylock/1a:5", "mylock/2b:9"} {
		if got, err := call(k); err != nil || got != k {
			t.Fatalf("%s: got = %q, %v, expected: accepted", k, got, err)
		}
	}
	_, err := call("mylock/1a:5")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "stale lock key mylock/1a:5") {
		t.Fatalf("stale holder: got = %v, expected: failed_precondition naming the stale key", err)
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("requests reaching the server: got = %d, expected: 3", got)
	}
}

// A resource guarded by etcd-style locks: the holder of mylock at
// revision 9 wrote, so the holder from revision 5 — replaced, though it
// may not know yet — is refused.
func ExampleWithLockKeys() {
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := fence.KeyFromContext(r.Context())
		fmt.Fprintf(w, "written by %s at revision %d\n", k.Key, k.Revision)
	})
	h := fence.Middleware(nil, write, fence.WithLockKeys(fence.MonotonicKey(fence.NewMemoryStore())))

	for _, k := range []string{"mylock/694d7b3c2a1f0e05:9", "mylock/694d7b3c2a1f0dff:5"} {
		req := httptest.NewRequest(http.MethodPut, "/rows/1", nil)
		req.Header.Set(fence.KeyHeader, k) // from etcdctl lock: $ETCD_LOCK_KEY:$ETCD_LOCK_REV
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	// Output:
	// 200 written by mylock/694d7b3c2a1f0e05 at revision 9
	// 409 stale lock key mylock/694d7b3c2a1f0dff:5: a request with revision 9 for lock "mylock" was already accepted
}
