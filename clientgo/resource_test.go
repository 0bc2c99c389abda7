package clientgo_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tenurehq/tenure/fence"
)

// Headers the electors send with each write besides the fencing token.
const (
	headerIdentity = "Elector-Identity"
	// headerLate marks the write an elector sends from OnStoppedLeading
	// with the token it led with: a request delayed past the end of its
	// sender's leadership, which the resource must refuse.
	headerLate = "Elector-Late"
)

// write is one request the fenced resource received.
type write struct {
	Identity string
	Token    int64 // 0 when the header held none
	Late     bool
	Accepted bool
	Refusal  string // why it was refused
}

func (w write) String() string {
	verdict := "accepted"
	if !w.Accepted {
		verdict = "refused (" + w.Refusal + ")"
	}
	late := ""
	if w.Late {
		late = " late"
	}
	return fmt.Sprintf("%s token %d%s: %s", w.Identity, w.Token, late, verdict)
}

// resource stands for what a leader writes to: it accepts a write only
// when the Tenure server says its token is the lease's current one
// (fence.Middleware with the policy, fence.Validate in the tests), and
// records every write in the order the checks were made.
type resource struct {
	policy fence.Policy
	mu     sync.Mutex // held across each request's check and record; guards writes
	writes []write
}

var _ http.Handler = (*resource)(nil)

// ServeHTTP checks and records one write. Holding mu across both makes
// the record's order the order of the checks, so a token that was
// current when checked is recorded before any later leader's write.
func (r *resource) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	wr := write{Identity: req.Header.Get(headerIdentity), Late: req.Header.Get(headerLate) != ""}
	if t, err := fence.Parse(req.Header.Get(fence.Header)); err == nil {
		wr.Token = t.Token
	}
	accept := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		wr.Accepted = true
		w.WriteHeader(http.StatusNoContent)
	})
	rec := &refusal{ResponseWriter: w}
	fence.Middleware(r.policy, accept).ServeHTTP(rec, req)
	wr.Refusal = rec.body
	r.writes = append(r.writes, wr)
}

// refusal keeps the body of a refusal, which says why.
type refusal struct {
	http.ResponseWriter
	body string
}

func (r *refusal) Write(b []byte) (int, error) {
	r.body += string(b)
	return r.ResponseWriter.Write(b)
}

// history returns a copy of the writes so far.
func (r *resource) history() []write {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes)
}

// await waits for the first write that match accepts and returns it.
func (r *resource) await(t *testing.T, what string, match func(write) bool) write {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		if i := slices.IndexFunc(r.history(), match); i >= 0 {
			return r.history()[i]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no write within %v: %s", waitLimit, what)
	return write{}
}

// checkHistory returns how the writes a resource accepted break the rule
// of one leader at a time, or nil when they keep it: tokens of accepted
// writes never decrease, so no leader's write is accepted after a later
// leader's; each token is one identity's, so writes of two identities
// never interleave; and no late write is accepted.
func checkHistory(ws []write) []string {
	var problems []string
	owner := map[int64]string{}
	var highest int64
	for i, w := range ws {
		if !w.Accepted {
			continue
		}
		if w.Late {
			problems = append(problems, fmt.Sprintf("write %d (%v): a write sent after its elector stopped leading was accepted", i, w))
		}
		if w.Token < highest {
			problems = append(problems, fmt.Sprintf("write %d (%v): accepted after a write with token %d: two leaders at once", i, w, highest))
		}
		if o, ok := owner[w.Token]; ok && o != w.Identity {
			problems = append(problems, fmt.Sprintf("write %d (%v): token %d was already %s's", i, w, w.Token, o))
		} else if !ok {
			owner[w.Token] = w.Identity
		}
		highest = max(highest, w.Token)
	}
	return problems
}

// TestCheckHistory shows that the process test's check can fail: each
// history that breaks the rule is caught.
func TestCheckHistory(t *testing.T) {
	ok := func(id string, tok int64) write { return write{Identity: id, Token: tok, Accepted: true} }
	refused := func(id string, tok int64) write { return write{Identity: id, Token: tok} }
	tests := []struct {
		name     string
		history  []write
		problems int
	}{
		{"one leader after another keeps the rule", []write{ok("a", 3), ok("a", 3), refused("a", 3), ok("b", 5), ok("a", 9)}, 0},
		{"refused writes of an old leader keep the rule", []write{ok("a", 3), ok("b", 5), refused("a", 3), ok("b", 5)}, 0},
		{"two leaders' writes interleaving break it", []write{ok("a", 3), ok("b", 5), ok("a", 3), ok("b", 5)}, 1},
		{"one token written by two identities breaks it", []write{ok("a", 3), ok("b", 3)}, 1},
		{"an accepted late write breaks it", []write{ok("a", 3), {Identity: "a", Token: 3, Late: true, Accepted: true}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkHistory(tt.history); len(got) != tt.problems {
				t.Fatalf("checkHistory = %q, expected: %d problems", got, tt.problems)
			}
		})
	}
}
