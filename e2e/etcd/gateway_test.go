//go:build linux

package etcd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// gatewayStep is one request to etcd's JSON gateway, as curl sends it.
// A body may name an earlier answer's field as {{step.path}} (a lease
// ID the server chose); a stream's answer is its first line.
type gatewayStep struct {
	name, method, path, body string
	stream                   bool // read the first line of a stream, then hang up
}

// gatewaySteps run in order on a fresh server: every path the issue
// names, good input and bad.
var gatewaySteps = []gatewayStep{
	{name: "health", method: "GET", path: "/health"},
	{name: "put", method: "POST", path: "/v3/kv/put", body: `{"key":"Zm9v","value":"YmFy"}`},
	{name: "put bytes", method: "POST", path: "/v3/kv/put", body: `{"key":"L2Iv/w==","value":"AP4=","prev_kv":true}`},
	{name: "put again", method: "POST", path: "/v3/kv/put", body: `{"key":"L2Iv/w==","value":"AQ==","prev_kv":true}`},
	{name: "range", method: "POST", path: "/v3/kv/range", body: `{"key":"Zm9v"}`},
	{name: "range prefix", method: "POST", path: "/v3/kv/range", body: `{"key":"L2Iv","range_end":"L2Iw","sort_order":"DESCEND"}`},
	{name: "range count", method: "POST", path: "/v3/kv/range", body: `{"key":"AA==","range_end":"AA==","count_only":true}`},
	{name: "range keys only, limit", method: "POST", path: "/v3/kv/range", body: `{"key":"AA==","range_end":"AA==","keys_only":true,"limit":1}`},
	{name: "range missing", method: "POST", path: "/v3/kv/range", body: `{"key":"bm9uZQ=="}`},
	{name: "v3beta range", method: "POST", path: "/v3beta/kv/range", body: `{"key":"Zm9v"}`},
	{name: "txn true", method: "POST", path: "/v3/kv/txn", body: `{"compare":[{"target":"VALUE","key":"Zm9v","value":"YmFy"}],"success":[{"request_put":{"key":"YQ==","value":"Yg=="}},{"request_range":{"key":"Zm9v"}}],"failure":[{"request_range":{"key":"Zm9v"}}]}`},
	{name: "txn false", method: "POST", path: "/v3/kv/txn", body: `{"compare":[{"target":"CREATE","key":"YQ==","result":"EQUAL","create_revision":"0"}],"success":[{"request_put":{"key":"YQ==","value":"Yw=="}}],"failure":[{"request_range":{"key":"YQ=="}}]}`},
	{name: "deleterange", method: "POST", path: "/v3/kv/deleterange", body: `{"key":"YQ==","prev_kv":true}`},
	{name: "compaction", method: "POST", path: "/v3/kv/compaction", body: `{"revision":"3"}`},
	{name: "range compacted", method: "POST", path: "/v3/kv/range", body: `{"key":"Zm9v","revision":"2"}`},
	{name: "lease grant", method: "POST", path: "/v3/lease/grant", body: `{"TTL":60}`},
	{name: "put with lease", method: "POST", path: "/v3/kv/put", body: `{"key":"bGVhc2Vk","value":"eA==","lease":"{{lease grant.ID}}"}`},
	{name: "lease keepalive", method: "POST", path: "/v3/lease/keepalive", body: `{"ID":"{{lease grant.ID}}"}`, stream: true},
	{name: "lease timetolive", method: "POST", path: "/v3/lease/timetolive", body: `{"ID":"{{lease grant.ID}}","keys":true}`},
	{name: "lease leases", method: "POST", path: "/v3/lease/leases", body: `{}`},
	{name: "lease revoke", method: "POST", path: "/v3/lease/revoke", body: `{"ID":"{{lease grant.ID}}"}`},
	{name: "lease timetolive gone", method: "POST", path: "/v3/lease/timetolive", body: `{"ID":"{{lease grant.ID}}"}`},
	{name: "lease revoke gone", method: "POST", path: "/v3/lease/revoke", body: `{"ID":"{{lease grant.ID}}"}`},
	{name: "watch from a revision", method: "POST", path: "/v3/watch", body: `{"create_request":{"key":"Zm9v","start_revision":"3"}}`, stream: true},
	{name: "maintenance status", method: "POST", path: "/v3/maintenance/status", body: `{}`},
	{name: "member list", method: "POST", path: "/v3/cluster/member/list", body: `{}`},
	{name: "authenticate without auth", method: "POST", path: "/v3/auth/authenticate", body: `{"name":"root","password":"x"}`},
	{name: "bad JSON", method: "POST", path: "/v3/kv/put", body: `{"key":"Zm9v`},
	{name: "bad base64", method: "POST", path: "/v3/kv/put", body: `{"key":"!!!","value":"eA=="}`},
	{name: "no key", method: "POST", path: "/v3/kv/range", body: `{}`},
	{name: "range after bad input", method: "POST", path: "/v3/kv/range", body: `{"key":"Zm9v"}`},
	{name: "GET of a POST path", method: "GET", path: "/v3/kv/range"},
	{name: "unknown path", method: "POST", path: "/v3/kv/nothing", body: `{}`},
	{name: "health by POST", method: "POST", path: "/health"},
}

// gatewayAnswer is what one step got.
type gatewayAnswer struct {
	status int
	json   map[string]any // nil when the body is not a JSON object
	text   string
}

// runGateway runs gatewaySteps against tg and returns each answer.
func runGateway(t *testing.T, tg target) []gatewayAnswer {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	var out []gatewayAnswer
	byName := map[string]map[string]any{}
	for _, s := range gatewaySteps {
		body := s.body
		for name, m := range byName {
			for _, f := range []string{"ID"} {
				if v, ok := m[f].(string); ok {
					body = strings.ReplaceAll(body, "{{"+name+"."+f+"}}", v)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, s.method, "http://"+tg.addr+s.path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: %s: %v", tg.name, s.name, err)
		}
		var raw []byte
		if s.stream {
			line, err := bufio.NewReader(resp.Body).ReadBytes('\n')
			if err != nil && err != io.EOF {
				t.Errorf("%s: %s: %v", tg.name, s.name, err)
			}
			raw = line
		} else {
			raw, _ = io.ReadAll(resp.Body)
		}
		resp.Body.Close()
		cancel()
		a := gatewayAnswer{status: resp.StatusCode, text: string(raw)}
		if json.Unmarshal(raw, &a.json) == nil {
			byName[s.name] = a.json
			if r, ok := a.json["result"].(map[string]any); ok {
				byName[s.name] = r
			}
		}
		out = append(out, a)
	}
	return out
}

// TestEtcdGatewayAnswersAsEtcds sends the same curl-style requests to a
// real etcd's gateway and Tenure's and compares the answers field by
// field. What names a server may differ: the header's cluster_id,
// member_id and raft_term, lease IDs a server picks, member IDs, names
// and URLs, and the status's sizes, indexes and version; a field that
// one answers and the other leaves out is a difference, except where
// etcd 3.4 (Debian's) and 3.5, which Tenure follows, answer differently:
// /health's reason, which 3.5 adds, and the status of FailedPrecondition.
func TestEtcdGatewayAnswersAsEtcds(t *testing.T) {
	t.Parallel()
	ref, sut, ok := pair(t)
	want := runGateway(t, ref)
	if !ok {
		return
	}
	got := runGateway(t, sut)
	for i, s := range gatewaySteps {
		w, g := want[i], got[i]
		// grpc-gateway v1.9 (etcd 3.4's) answers FailedPrecondition
		// with 412, v1.16 (etcd 3.5's, and Tenure's) with 400.
		if w.status == http.StatusPreconditionFailed && g.status == http.StatusBadRequest && w.json["code"] == 9.0 {
			w.status = g.status
		}
		if w.status != g.status {
			t.Errorf("%s: status: got = %d, expected: %d\n  etcd:   %s\n  tenure: %s", s.name, g.status, w.status, w.text, g.text)
			continue
		}
		if w.json == nil || g.json == nil {
			if w.text != g.text {
				t.Errorf("%s: body: got = %q, expected: %q", s.name, g.text, w.text)
			}
			continue
		}
		wn, gn := normaliseGateway(s.name, w.json), normaliseGateway(s.name, g.json)
		if !reflect.DeepEqual(wn, gn) {
			t.Errorf("%s: answer differs:\n  etcd:   %s\n  tenure: %s\n  (normalised etcd:   %v)\n  (normalised tenure: %v)", s.name, w.text, g.text, wn, gn)
		}
	}
}

// normaliseGateway drops from an answer what names a server.
func normaliseGateway(step string, m map[string]any) map[string]any {
	var walk func(path string, v any) any
	walk = func(path string, v any) any {
		switch v := v.(type) {
		case map[string]any:
			out := map[string]any{}
			for k, x := range v {
				p := k
				if path != "" {
					p = path + "." + k
				}
				switch {
				case k == "cluster_id", k == "member_id", k == "raft_term":
					continue
				case k == "ID" && (strings.HasPrefix(step, "lease") || strings.HasPrefix(step, "member")):
					out[k] = "ID"
					continue
				case k == "lease" && step == "put with lease":
					continue
				case strings.HasPrefix(step, "member") && (k == "name" || k == "peerURLs" || k == "clientURLs"):
					out[k] = k
					continue
				case step == "maintenance status" && k != "header":
					out[k] = k // present; the values are the server's own
					continue
				case strings.HasPrefix(step, "health") && k == "reason":
					continue // 3.5 adds it, empty; 3.4 does not
				}
				out[k] = walk(p, x)
			}
			return out
		case []any:
			out := make([]any, len(v))
			for i, x := range v {
				out[i] = walk(path, x)
			}
			return out
		}
		return v
	}
	n := walk("", m).(map[string]any)
	if step == "maintenance status" {
		// etcd 3.4 answers raftAppliedIndex and dbSizeInUse, Tenure
		// too; a field only one answers shows as a difference.
		keys := make([]string, 0, len(n))
		for k := range n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		n["keys"] = fmt.Sprint(keys)
	}
	return n
}

// TestEtcdGatewayClients runs etcd3gw (Debian's python3-etcd3gw, what
// OpenStack uses) against etcd's gateway and Tenure's, over keys and
// values of any bytes, create and replace, a prefix delete, a lease
// with keys, the lock recipe and a prefix watch, and requires the same
// output from both. .ci/run installs it.
func TestEtcdGatewayClients(t *testing.T) {
	t.Parallel()
	if exec.Command("/usr/bin/python3", "-c", "import etcd3gw").Run() != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("Debian's python3-etcd3gw is not installed (apt-get install python3-etcd3gw)")
		}
		t.Skip("Debian's python3-etcd3gw is not installed (apt-get install python3-etcd3gw)")
	}
	script, err := filepath.Abs("testdata/clients/etcd3gw_client.py")
	if err != nil {
		t.Fatal(err)
	}
	ref, sut, ok := pair(t)
	run := func(tg target) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "/usr/bin/python3", script, tg.addr).CombinedOutput()
		if err != nil {
			t.Errorf("etcd3gw against %s: %v\n%s", tg.name, err, out)
		}
		return string(out)
	}
	want := run(ref)
	if !ok {
		t.Logf("etcd's transcript:\n%s", want)
		return
	}
	compareTranscripts(t, want, run(sut))
}
