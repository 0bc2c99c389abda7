package fence_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

// TestValidateKeyRefusesTheReplacedEtcdHolder: two holders of one lock
// taken as etcd's recipe takes it (a key <lock>/<lease> bound to the
// holder's lease, made here through the native API, on the same KV
// clock) write to a resource fenced with ValidateKey and MonotonicKey.
// Once the first holder's lease ended, its writes are refused — before
// its successor has written anything, which Monotonic alone could not do.
func TestValidateKeyRefusesTheReplacedEtcdHolder(t *testing.T) {
	c := newClient(t, startServer(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hold := func(s *client.Session, key string) fence.LockKey {
		t.Helper()
		if _, err := c.KV().Put(ctx, key, "", client.WithSession(s)); err != nil {
			t.Fatal(err)
		}
		kv, err := c.KV().Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return fence.LockKey{Key: key, Revision: kv.CreateRevision}
	}
	h := fence.Middleware(nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := fence.KeyFromContext(r.Context())
		fmt.Fprint(w, "written by ", k)
	}), fence.WithLockKeys(fence.ChainKey(fence.ValidateKey(c), fence.MonotonicKey(fence.NewMemoryStore()))))
	write := func(k fence.LockKey) (int, string) {
		req := httptest.NewRequest(http.MethodPut, "/rows/1", nil).WithContext(ctx)
		req.Header.Set(fence.KeyHeader, fence.FormatKey(k))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}

	a := newSession(t, c, "a")
	ka := hold(a, "mylock/a")
	if code, body := write(ka); code != http.StatusOK {
		t.Fatalf("the holder: got = %d %q, expected: 200", code, body)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	kb := hold(newSession(t, c, "b"), "mylock/b")
	if code, body := write(ka); code != http.StatusConflict || !strings.Contains(body, "the key does not exist") {
		t.Fatalf("the replaced holder: got = %d %q, expected: 409, its key gone", code, body)
	}
	if code, body := write(kb); code != http.StatusOK || body != "written by "+kb.String() {
		t.Fatalf("the successor: got = %d %q, expected: 200", code, body)
	}
	if kb.Revision <= ka.Revision {
		t.Fatalf("revisions: got = %d then %d, expected: the successor's above", ka.Revision, kb.Revision)
	}
}
