package fence_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

// byToken is a Policy whose answer depends on the token: 1 is stale,
// 2 undecidable, 3 a custom policy's unknown error, others accepted.
var byToken = fence.PolicyFunc(func(_ context.Context, t client.Token) error {
	switch t.Token {
	case 1:
		return &fence.StaleError{Token: t, Current: 9}
	case 2:
		return fmt.Errorf("%w: tenure is down", fence.ErrUnavailable)
	case 3:
		return errors.New("policy bug")
	}
	return nil
})

// echoToken answers with the token Middleware accepted.
var echoToken = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	t, ok := fence.FromContext(r.Context())
	if !ok {
		http.Error(w, "no token in context", http.StatusInternalServerError)
		return
	}
	fmt.Fprint(w, fence.Format(t))
})

func TestMiddleware(t *testing.T) {
	tests := []struct {
		name   string
		header []string
		status int
		body   string
	}{
		{"a request without the header needs one", nil, http.StatusPreconditionRequired, "the Tenure-Fence header is required"},
		{"a malformed token is a bad request", []string{"db-writer:5"}, http.StatusBadRequest, `malformed fencing token "db-writer:5"`},
		{"two tokens are a bad request", []string{"default/db-writer:5", "default/db-writer:6"}, http.StatusBadRequest, "2 Tenure-Fence headers"},
		{"a stale token is a conflict naming both tokens", []string{"default/db-writer:1"}, http.StatusConflict, "stale fencing token default/db-writer:1: the current holder's token is 9"},
		{"an undecidable token is refused for now", []string{"default/db-writer:2"}, http.StatusServiceUnavailable, "tenure is down"},
		{"an unknown policy error refuses the request", []string{"default/db-writer:3"}, http.StatusInternalServerError, "policy bug"},
		{"a good token reaches the handler with the token", []string{"default/db-writer:5"}, http.StatusOK, "default/db-writer:5"},
	}
	h := fence.Middleware(byToken, echoToken)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPut, "/rows/1", strings.NewReader("v"))
			for _, v := range tt.header {
				req.Header.Add(fence.Header, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.status || !strings.Contains(rec.Body.String(), tt.body) {
				t.Fatalf("got = %d %q, expected: %d with %q", rec.Code, rec.Body.String(), tt.status, tt.body)
			}
		})
	}
}

func TestMiddlewareWithMonotonic(t *testing.T) {
	h := fence.Middleware(fence.Monotonic(fence.NewMemoryStore()), echoToken)
	for _, step := range []struct {
		token  string
		status int
	}{
		{"default/db-writer:5", http.StatusOK},
		{"default/db-writer:5", http.StatusOK}, // the same holder again
		{"default/db-writer:8", http.StatusOK}, // a successor
		{"default/db-writer:5", http.StatusConflict},
		{"default/other:1", http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Header.Set(fence.Header, step.token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != step.status {
			t.Fatalf("%s: got = %d %q, expected: %d", step.token, rec.Code, rec.Body.String(), step.status)
		}
	}
}

func TestFromContextWithoutMiddleware(t *testing.T) {
	if tok, ok := fence.FromContext(context.Background()); ok {
		t.Fatalf("got = %v, expected: no token", tok)
	}
}
