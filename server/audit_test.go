package server

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
)

var textField = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)

// auditLines are the audit lines in logs (slog's text form) that keep
// accepts, each as its fields.
func auditLines(t *testing.T, logs string, keep func(map[string]string) bool) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, " msg=audit ") {
			continue
		}
		fields := map[string]string{}
		for _, m := range textField.FindAllStringSubmatch(line, -1) {
			v := m[2]
			if strings.HasPrefix(v, `"`) {
				var err error
				if v, err = strconv.Unquote(v); err != nil {
					t.Fatalf("audit line %q: %v", line, err)
				}
			}
			fields[m[1]] = v
		}
		if keep(fields) {
			out = append(out, fields)
		}
	}
	return out
}

// TestRefusedPipelinedOpsAreFoldedWithPrincipalAndRemote: a flood of
// refused operations on one pipeline writes a bounded number of audit
// lines, each with the principal and the connection's address; the
// summaries account for every refusal, and the last line is one, written
// without any further request.
func TestRefusedPipelinedOpsAreFoldedWithPrincipalAndRemote(t *testing.T) {
	t.Parallel()
	as := startAuthServer(t)
	resp, pipe := upgradeTLS(t, as, "token:team-b")
	if pipe == nil {
		t.Fatalf("team-b's upgrade: got = %s, expected: 101", resp.Status)
	}
	const n = 20000
	start := time.Now()
	longKey := "team-a/" + strings.Repeat("x", 1000)
	done := make(chan error, 1)
	go func() {
		for i := range n {
			req := &tenurev1.PipelineRequest{Id: uint64(i + 1), Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: longKey, Value: "v"}}}
			if err := pipe.appendOnly(req); err != nil {
				done <- err
				return
			}
			if i%256 == 255 || i == n-1 {
				if err := pipe.w.Flush(); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	_ = pipe.conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	answered := make([]bool, n+1)
	for i := range n {
		resp, err := pipe.receive()
		if err != nil {
			t.Fatalf("answer %d of %d: %v", i+1, n, err)
		}
		if id := resp.GetId(); id == 0 || id > n || answered[id] {
			t.Fatalf("answer %d of %d: got = request ID %d, expected: each of 1..%d answered once", i+1, n, id, n)
		} else {
			answered[id] = true
		}
		if e := resp.GetError(); connect.Code(e.GetCode()) != connect.CodePermissionDenied {
			t.Fatalf("answer %d: got = %v, expected: permission_denied", i+1, resp)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pipe.conn.Close()

	put := func(l map[string]string) bool { return l["action"] == tenurev1connect.KVServicePutProcedure }
	var lines []map[string]string
	full, folded := 0, 0
	for deadline := time.Now().Add(20 * time.Second); ; {
		lines = auditLines(t, as.logs.String(), put)
		full, folded = 0, 0
		for _, l := range lines {
			if k, ok := l["folded"]; ok {
				f, _ := strconv.Atoi(k)
				folded += f
			} else {
				full++
			}
		}
		if full+folded == n {
			break
		}
		if time.Now().After(deadline) {
			// Say where the rest went: audit lines of other actions, and
			// every summary, whatever its action.
			others := map[string]int{}
			for _, l := range auditLines(t, as.logs.String(), func(l map[string]string) bool { return !put(l) || l["folded"] != "" }) {
				others[l["action"]+" folded="+l["folded"]+" principal="+l["principal"]]++
			}
			t.Fatalf("got = %d lines in full + %d folded, expected: %d refusals accounted for; other lines and every summary: %v", full, folded, n, others)
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	t.Logf("%d refusals in %v: %d audit lines, %d written in full, %d folded", n, elapsed.Round(time.Millisecond), len(lines), full, folded)
	// However fast they came: at most a window's worth in full and one
	// summary per window.
	if bound := (auth.DeniedPerWindow + 1) * (int(elapsed/auth.FoldWindow) + 2); len(lines) > bound || folded == 0 {
		t.Errorf("got = %d audit lines (%d folded) for %d refusals over %v, expected: at most %d, the rest folded", len(lines), folded, n, elapsed, bound)
	}
	for _, l := range lines {
		if l["principal"] != "team-b" || !strings.HasPrefix(l["remote"], "127.0.0.1") || l["outcome"] != "denied" {
			t.Fatalf("audit line got = %v, expected: denied, principal team-b, the connection's address", l)
		}
		if len(l["target"]) > auth.MaxTargetBytes+64 {
			t.Fatalf("target got = %d bytes, expected: cut to about %d", len(l["target"]), auth.MaxTargetBytes)
		}
	}
	// A window's summary says how many it folded. (The last line is a
	// summary only when the last window held more than its share: on a
	// slow machine the refusals spread over more windows.)
	summaries := 0
	for _, l := range lines {
		if l["folded"] == "" {
			continue
		}
		summaries++
		if !strings.HasPrefix(l["reason"], "folded ") || !strings.Contains(l["reason"], " denied entries from 127.0.0.1") {
			t.Errorf("summary line got = %v, expected: the summary saying how many were folded", l)
		}
	}
	if summaries == 0 {
		t.Errorf("got = no summary line among %d, expected: one per window that folded", len(lines))
	}
	if first := lines[0]; !strings.Contains(first["target"], "...(truncated, 1007 bytes)") {
		t.Errorf("first target got = %q, expected: cut, with the length it had", first["target"])
	}
}

// TestNDJSONRefusalIsAuditedWithTheCode: a refused NDJSON watch is
// audited with the code first, "permission_denied: ...", as the unary
// and stream paths write it and docs/security.md promises.
func TestNDJSONRefusalIsAuditedWithTheCode(t *testing.T) {
	as := startAuthServer(t)
	resp, err := as.http(t, "token:team-b").Get(as.url + "/v1/watch/leases?namespace=team-a")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("got = %s %q, expected: 403", resp.Status, body)
	}
	lines := auditLines(t, as.logs.String(), func(l map[string]string) bool { return l["action"] == "/v1/watch/leases" })
	if len(lines) != 1 {
		t.Fatalf("audit lines got = %d, expected: 1", len(lines))
	}
	if r := lines[0]["reason"]; !strings.HasPrefix(r, "permission_denied: team-b may not read in namespace team-a") {
		t.Errorf("reason got = %q, expected: \"permission_denied: team-b may not read in namespace team-a\"", r)
	}
}

// TestRateLimitedHeartbeatIsAudited: a heartbeat refused for its
// principal's rate is audited like any other refusal.
func TestRateLimitedHeartbeatIsAudited(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slow := as.clients(t, "token:slow")
	open, err := slow.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	stream := slow.sessions.KeepAlive(ctx)
	var once sync.Once
	defer once.Do(func() { _ = stream.CloseRequest() })
	var last error
	for range 10 {
		if last = stream.Send(&tenurev1.KeepAliveRequest{SessionId: open.Msg.Session.Id}); last != nil {
			break
		}
		if _, last = stream.Receive(); last != nil {
			break
		}
	}
	if last == nil {
		_, last = stream.Receive()
	}
	if connect.CodeOf(last) != connect.CodeResourceExhausted {
		t.Fatalf("heartbeats past the burst: got = %v, expected: resource_exhausted", last)
	}
	lines := auditLines(t, as.logs.String(), func(l map[string]string) bool {
		return l["action"] == tenurev1connect.SessionServiceKeepAliveProcedure
	})
	if len(lines) != 1 || lines[0]["principal"] != "slow" || !strings.HasPrefix(lines[0]["reason"], "resource_exhausted: ") || lines[0]["remote"] == "" {
		t.Errorf("audit lines got = %v, expected: one, denied for slow's rate, with its address", lines)
	}
}
