package fence_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

// A resource guarded by Monotonic: once a write with token 5 has been
// accepted, a write from the holder of token 3 — deposed, though it may
// not know yet — is refused.
func ExampleMiddleware() {
	rows := map[string]string{}
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := fence.FromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		rows[r.URL.Path] = string(body)
		fmt.Fprintf(w, "written with token %d\n", tok.Token)
	})
	h := fence.Middleware(fence.Monotonic(fence.NewMemoryStore()), write)

	for _, token := range []string{"default/db-writer:5", "default/db-writer:3"} {
		req := httptest.NewRequest(http.MethodPut, "/rows/1", strings.NewReader("from "+token))
		req.Header.Set(fence.Header, token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	fmt.Println(rows["/rows/1"])
	// Output:
	// 200 written with token 5
	// 409 stale fencing token default/db-writer:3: a request with token 5 was already accepted
	// from default/db-writer:5
}

// heldLock stands in for a *client.Mutex (or Semaphore, RWMutex,
// Election): in an owner, pass the lock itself to fence.Transport.
type heldLock struct {
	token client.Token
	valid bool
}

func (l *heldLock) Token() (client.Token, bool) { return l.token, l.valid }

// An owner's HTTP client that fences its calls: every request carries
// the lock's token, and nothing is sent once the lock is lost.
func ExampleTransport() {
	resource := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("resource got", r.Method, r.URL.Path, "with", r.Header.Get(fence.Header))
	}))
	defer resource.Close()

	lock := &heldLock{token: client.Token{Namespace: "default", Name: "db-writer", Token: 42}, valid: true}
	hc := &http.Client{Transport: fence.Transport(http.DefaultTransport, lock)}
	defer hc.CloseIdleConnections()

	resp, err := hc.Post(resource.URL+"/rows/1", "text/plain", strings.NewReader("v1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode)

	lock.valid = false // the session missed its heartbeats
	_, err = hc.Post(resource.URL+"/rows/1", "text/plain", strings.NewReader("v2"))
	fmt.Println(strings.ReplaceAll(err.Error(), resource.URL, "http://resource"))
	// Output:
	// resource got POST /rows/1 with default/db-writer:42
	// status 200
	// Post "http://resource/rows/1": not holding the lease: fencing token default/db-writer:42 is no longer valid; POST http://resource/rows/1 not sent
}
