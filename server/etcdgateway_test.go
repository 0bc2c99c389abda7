package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
)

// gw is a plain HTTP client of an etcd port's JSON gateway, as curl is.
type gw struct {
	t    *testing.T
	base string // http://host:port or https://host:port
	hc   *http.Client
}

// post sends body to path with the token (when set) in the
// Authorization header, as etcd's gateway clients do, and returns the
// status and the answer decoded.
func (g gw) post(path, token, body string) (int, map[string]any) {
	g.t.Helper()
	code, raw := g.raw(http.MethodPost, path, token, body)
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		g.t.Fatalf("POST %s %s: not JSON: %q", path, body, raw)
	}
	return code, m
}

func (g gw) raw(method, path, token, body string) (int, string) {
	g.t.Helper()
	req, err := http.NewRequest(method, g.base+path, strings.NewReader(body))
	if err != nil {
		g.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// field is the value at a dotted path of a decoded answer ("kvs.0.key").
func field(m any, path string) any {
	for p := range strings.SplitSeq(path, ".") {
		switch v := m.(type) {
		case map[string]any:
			m = v[p]
		case []any:
			i := 0
			for _, c := range p {
				i = i*10 + int(c-'0')
			}
			if i >= len(v) {
				return nil
			}
			m = v[i]
		default:
			return nil
		}
	}
	return m
}

func wantField(t *testing.T, what string, m map[string]any, path string, want any) {
	t.Helper()
	if got := field(m, path); got != want {
		t.Errorf("%s: %s: got = %#v, expected: %#v (answer %v)", what, path, got, want, m)
	}
}

// Every path etcd's gateway serves, through plain HTTP/1.1 on the port
// that serves gRPC, with etcd's JSON: bytes in base64, int64 as
// strings, the protos' field names.
func TestEtcdGatewayServesEtcdsJSONBesideGRPC(t *testing.T) {
	ts, c := etcdNode(t, t.TempDir())
	g := gw{t: t, base: "http://" + ts.cfg.Etcd.Listener.Addr().String(), hc: &http.Client{Timeout: 10 * time.Second}}

	code, m := g.post("/v3/kv/put", "", `{"key":"Zm9v","value":"YmFy"}`)
	if code != http.StatusOK {
		t.Fatalf("put: got = %d %v, expected: 200", code, m)
	}
	rev := field(m, "header.revision").(string)
	_, m = g.post("/v3/kv/range", "", `{"key":"Zm9v"}`)
	wantField(t, "range", m, "kvs.0.key", "Zm9v")
	wantField(t, "range", m, "kvs.0.value", "YmFy")
	wantField(t, "range", m, "kvs.0.mod_revision", rev)
	wantField(t, "range", m, "count", "1")
	// The same key through gRPC on the same port.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := mustGet(t, c, "foo"); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "bar" {
		t.Errorf("gRPC get foo: got = %v, expected: bar", got.Kvs)
	}
	// /v3beta/ is /v3/, as etcd's accessController rewrites it.
	_, m = g.post("/v3beta/kv/range", "", `{"key":"Zm9v"}`)
	wantField(t, "v3beta range", m, "kvs.0.value", "YmFy")

	_, m = g.post("/v3/kv/txn", "", `{"compare":[{"target":"VALUE","key":"Zm9v","value":"YmFy"}],"success":[{"request_put":{"key":"YQ==","value":"Yg==","prev_kv":true}}]}`)
	wantField(t, "txn", m, "succeeded", true)
	_, m = g.post("/v3/kv/deleterange", "", `{"key":"YQ==","prev_kv":true}`)
	wantField(t, "deleterange", m, "deleted", "1")
	wantField(t, "deleterange", m, "prev_kvs.0.value", "Yg==")
	code, m = g.post("/v3/kv/compaction", "", `{"revision":"`+rev+`"}`)
	if code != http.StatusOK {
		t.Errorf("compaction: got = %d %v, expected: 200", code, m)
	}

	// Leases: grant, keep alive (a stream of one answer), time to live
	// with the keys attached, list, revoke.
	_, m = g.post("/v3/lease/grant", "", `{"TTL":30}`)
	id, _ := field(m, "ID").(string)
	wantField(t, "grant", m, "TTL", "30")
	g.post("/v3/kv/put", "", `{"key":"bGVhc2Vk","value":"eA==","lease":"`+id+`"}`)
	_, ka := g.raw(http.MethodPost, "/v3/lease/keepalive", "", `{"ID":"`+id+`"}`)
	var kam map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(ka, "\n", 2)[0]), &kam); err != nil {
		t.Fatalf("keepalive: %q: %v", ka, err)
	}
	wantField(t, "keepalive", kam, "result.ID", id)
	wantField(t, "keepalive", kam, "result.TTL", "30")
	_, m = g.post("/v3/lease/timetolive", "", `{"ID":"`+id+`","keys":true}`)
	wantField(t, "timetolive", m, "grantedTTL", "30")
	wantField(t, "timetolive", m, "keys.0", "bGVhc2Vk")
	_, m = g.post("/v3/lease/leases", "", `{}`)
	wantField(t, "leases", m, "leases.0.ID", id)
	_, m = g.post("/v3/kv/lease/leases", "", `{}`)
	wantField(t, "kv/lease/leases", m, "leases.0.ID", id)
	g.post("/v3/lease/revoke", "", `{"ID":"`+id+`"}`)
	_, m = g.post("/v3/kv/range", "", `{"key":"bGVhc2Vk"}`)
	if field(m, "kvs") != nil {
		t.Errorf("the lease's key after revoke: got = %v, expected: none", m)
	}

	_, m = g.post("/v3/maintenance/status", "", `{}`)
	if v, _ := field(m, "version").(string); !strings.HasPrefix(v, "3.5.13") {
		t.Errorf("status: version: got = %v, expected: 3.5.0...", m)
	}
	_, m = g.post("/v3/cluster/member/list", "", `{}`)
	wantField(t, "member list", m, "members.0.ID", field(m, "header.member_id"))
	code, m = g.post("/v3/auth/authenticate", "", `{"name":"a","password":"b"}`)
	if code != http.StatusBadRequest {
		t.Errorf("authenticate without auth: got = %d, expected: 400", code)
	}
	wantField(t, "authenticate", m, "error", "etcdserver: authentication is not enabled")
	wantField(t, "authenticate", m, "code", 9.0)

	// Bad input changes nothing and gets etcd's answers.
	before := mustGet(t, c, "foo").Header.Revision
	for _, bad := range []struct{ body, msg string }{
		{`{"key":"Zm9v`, "unexpected EOF"},
		{`{"key":"!!!","value":"eA=="}`, "illegal base64 data at input byte 0"},
		{`{"key":"Zm9v","value":42}`, ""},
	} {
		code, m := g.post("/v3/kv/put", "", bad.body)
		if code != http.StatusBadRequest || field(m, "code") != 3.0 {
			t.Errorf("put %s: got = %d %v, expected: 400 and code 3", bad.body, code, m)
		}
		if bad.msg != "" {
			wantField(t, "put "+bad.body, m, "error", bad.msg)
			wantField(t, "put "+bad.body, m, "message", bad.msg)
		}
	}
	if after := mustGet(t, c, "foo").Header.Revision; after != before {
		t.Errorf("revision after bad requests: got = %d, expected: %d", after, before)
	}
	if code, _ := g.raw(http.MethodGet, "/v3/kv/range", "", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v3/kv/range: got = %d, expected: 405", code)
	}
	if code, body := g.raw(http.MethodPost, "/v3/kv/nothing", "", "{}"); code != http.StatusNotFound || body != "Not Found\n" {
		t.Errorf("an unknown /v3/ path: got = %d %q, expected: 404 \"Not Found\\n\"", code, body)
	}

	code, body := g.raw(http.MethodGet, "/health", "", "")
	if code != http.StatusOK || body != `{"health":"true","reason":""}` {
		t.Errorf("/health: got = %d %s", code, body)
	}
	code, body = g.raw(http.MethodGet, "/health?serializable=true", "", "")
	if code != http.StatusOK || body != `{"health":"true","reason":""}` {
		t.Errorf("/health?serializable=true: got = %d %s", code, body)
	}
	code, body = g.raw(http.MethodGet, "/version", "", "")
	st, err := c.Status(ctx, g.base[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"etcdserver":"` + st.Version + `","etcdcluster":"3.5.0"}`; code != http.StatusOK || body != want {
		t.Errorf("/version: got = %d %s, expected: %s", code, body, want)
	}
}

// A watch streams its answers, one JSON object a line, as they happen.
func TestEtcdGatewayWatchStreams(t *testing.T) {
	ts, c := etcdNode(t, t.TempDir())
	base := "http://" + ts.cfg.Etcd.Listener.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v3/watch", strings.NewReader(`{"create_request":{"key":"dy8=","range_end":"dzA=","prev_kv":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	next := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("watch stream ended: %v", lines.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		return m
	}
	wantField(t, "watch created", next(), "result.created", true)
	mustPut(t, c, "w/a", "1")
	mustPut(t, c, "w/a", "2")
	m := next()
	wantField(t, "first event", m, "result.events.0.kv.key", "dy9h")
	wantField(t, "first event", m, "result.events.0.kv.value", "MQ==")
	m = next()
	wantField(t, "second event", m, "result.events.0.kv.value", "Mg==")
	wantField(t, "second event", m, "result.events.0.prev_kv.value", "MQ==")
	if _, err := c.Delete(ctx, "w/a"); err != nil {
		t.Fatal(err)
	}
	wantField(t, "delete event", next(), "result.events.0.type", "DELETE")
}

// With a policy, the gateway's calls are authenticated as gRPC's are:
// the token of /v3/auth/authenticate in the Authorization header, the
// same refusals, and the HTTP client's address in the audit log.
func TestEtcdGatewayAuthenticatesAsGRPC(t *testing.T) {
	es := startEtcdAuthServer(t)
	g := gw{t: t, base: "http://" + es.etcd, hc: &http.Client{Timeout: 10 * time.Second}}

	code, m := g.post("/v3/kv/put", "", `{"key":"YXBwL2E=","value":"MQ=="}`)
	if code != http.StatusBadRequest {
		t.Errorf("put without a token: got = %d, expected: 400", code)
	}
	wantField(t, "put without a token", m, "error", "etcdserver: user name is empty")
	code, m = g.post("/v3/auth/authenticate", "", `{"name":"alice","password":"wrong"}`)
	if code != http.StatusBadRequest {
		t.Errorf("a wrong password: got = %d, expected: 400", code)
	}
	wantField(t, "a wrong password", m, "error", "etcdserver: authentication failed, invalid user ID or password")
	_, m = g.post("/v3/auth/authenticate", "", `{"name":"alice","password":"alice-pw"}`)
	token, _ := field(m, "token").(string)
	if token == "" {
		t.Fatalf("authenticate: no token in %v", m)
	}
	if code, m := g.post("/v3/kv/put", token, `{"key":"YXBwL2E=","value":"MQ=="}`); code != http.StatusOK {
		t.Errorf("alice puts app/a: got = %d %v, expected: 200", code, m)
	}
	_, m = g.post("/v3/kv/range", "Bearer "+token, `{"key":"YXBwL2E="}`)
	wantField(t, "alice reads app/a with a Bearer token", m, "kvs.0.value", "MQ==")
	code, m = g.post("/v3/kv/put", token, `{"key":"b3RoZXIvYQ==","value":"MQ=="}`)
	if code != http.StatusForbidden {
		t.Errorf("alice puts other/a: got = %d, expected: 403", code)
	}
	wantField(t, "alice puts other/a", m, "error", "etcdserver: permission denied")
	code, m = g.post("/v3/kv/range", "not-a-token", `{"key":"YXBwL2E="}`)
	if code != http.StatusUnauthorized {
		t.Errorf("a bad token: got = %d, expected: 401", code)
	}
	wantField(t, "a bad token", m, "error", "etcdserver: invalid auth token")
	logs := es.logs.String()
	if !strings.Contains(logs, `may not write key \"other/a\"`) || !strings.Contains(logs, "remote=127.0.0.1:") || strings.Contains(logs, "remote=etcd-gateway") {
		t.Errorf("audit log: no line for alice's denied put with her address:\n%s", logs)
	}

	// A watch with her token streams; without it, it is refused.
	code, body := g.raw(http.MethodPost, "/v3/watch", "", `{"create_request":{"key":"YXBwL2E="}}`)
	if !strings.Contains(body, "user name is empty") {
		t.Errorf("watch without a token: got = %d %s, expected: user name is empty", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.base+"/v3/watch", strings.NewReader(`{"create_request":{"key":"YXBwL2E="}}`))
	req.Header.Set("Authorization", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	if !lines.Scan() || !strings.Contains(lines.Text(), `"created":true`) {
		t.Fatalf("alice's watch: got = %q %v, expected: created", lines.Text(), lines.Err())
	}
	g.post("/v3/kv/put", token, `{"key":"YXBwL2E=","value":"Mg=="}`)
	if !lines.Scan() || !strings.Contains(lines.Text(), `"value":"Mg=="`) {
		t.Errorf("alice's watch event: got = %q %v", lines.Text(), lines.Err())
	}

	// /health needs no credentials, as etcd's.
	if code, body := g.raw(http.MethodGet, "/health", "", ""); code != http.StatusOK || body != `{"health":"true","reason":""}` {
		t.Errorf("/health: got = %d %s", code, body)
	}
}

// Over TLS the port still serves both: HTTP/1.1 to a client that offers
// it (curl, Python), gRPC to etcd's client, and a client certificate
// still names a gRPC caller.
func TestEtcdGatewayOverTLS(t *testing.T) {
	dir := t.TempDir()
	if err := certs.Init(dir, certs.Options{ClientName: "admin"}); err != nil {
		t.Fatal(err)
	}
	serverTLS, err := certs.ServerConfig(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "client-ca.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, t.TempDir(), testLimits())
	ln := testnet.Listen(t)
	ts.cfg.Etcd = EtcdConfig{Listener: ln, Advertise: ln.Addr().String()}
	ts.etcdTLS = serverTLS
	if err := ts.startEtcd(); err != nil {
		t.Fatal(err)
	}
	clientTLS, err := certs.ClientConfig(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ln.Addr().String()}, TLS: clientTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	mustPut(t, c, "foo", "bar")

	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	// Go's client offers h2 and http/1.1, as curl does.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	g := gw{t: t, base: "https://" + ln.Addr().String(), hc: hc}
	_, m := g.post("/v3/kv/range", "", `{"key":"Zm9v"}`)
	wantField(t, "range over TLS", m, "kvs.0.value", "YmFy")
	resp, err := hc.Get(g.base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/1.1" || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Errorf("/health over TLS: got = %d %s ALPN %q, expected: 200 over HTTP/1.1", resp.StatusCode, resp.Proto, resp.TLS.NegotiatedProtocol)
	}
	// Plain HTTP to a TLS port gets nothing served.
	if resp, err := http.Get("http://" + ln.Addr().String() + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("cleartext /health on a TLS port: got = 200")
		}
	}
}
