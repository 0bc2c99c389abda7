package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
)

// authServer is a single node serving TLS with a policy, and what a test
// needs to call it as anybody.
type authServer struct {
	*Server
	policy *auth.Source
	url    string
	dir    string // certificates
	tokens map[string]string
	// logs holds everything the server logged, audit trail included.
	logs *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testPolicy: an admin; a reader of everything; team-a and team-b, each
// locking in its own namespace and writing its own keys; a validator
// that may only validate team-a's tokens; a token that has expired.
const testPolicy = `
principals:
  - name: admin
    roles: [admin]
    tokens: [{sha256: "%s"}]
  - name: reader
    roles: [reader]
    tokens: [{sha256: "%s"}]
  - name: team-a
    roles: [team-a]
    tokens: [{sha256: "%s"}]
  - name: team-b
    roles: [team-b]
    tokens: [{sha256: "%s"}]
    limits: {sessions: 3}
  - name: validator
    roles: [validator]
    tokens: [{sha256: "%s"}]
  - name: retired
    roles: [admin]
    tokens: [{sha256: "%s", expires: "2020-01-01T00:00:00Z"}]
  - name: slow
    roles: [team-a]
    tokens: [{sha256: "%s"}]
    identities: [slow]
    limits: {requests_per_second: 0.5, burst: 3}
  - name: team-*
    roles: [shared]
roles:
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
  reader:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read]
  team-a:
    - namespaces: [team-a]
      verbs: [read, lock]
    - keys: [team-a/]
      verbs: [read, write]
  team-b:
    - namespaces: [team-b]
      verbs: [read, lock]
    - keys: [team-b/]
      verbs: [read, write]
  validator:
    - namespaces: [team-a]
      verbs: [validate]
  shared:
    - namespaces: [shared]
      verbs: [read, lock]
`

var testPrincipals = []string{"admin", "reader", "team-a", "team-b", "validator", "retired", "slow"}

func writePolicy(t testing.TB, path string, tokens map[string]string, body string) {
	t.Helper()
	args := make([]any, len(testPrincipals))
	for i, p := range testPrincipals {
		args[i] = auth.HashToken(tokens[p])
	}
	if err := os.WriteFile(path, []byte(fmt.Sprintf(body, args...)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func startAuthServer(t testing.TB, options ...func(*Config)) *authServer {
	t.Helper()
	dir := t.TempDir()
	if err := certs.Init(dir, certs.Options{ClientName: "admin"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"reader", "team-a", "team-b"} {
		if err := certs.Client(dir, name, name, certs.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	// Signed by the right CA, but over.
	if err := certs.Client(dir, "expired", "admin", certs.Options{Now: time.Now().Add(-48 * time.Hour), Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// An admin certificate from a CA the server does not know.
	foreign := filepath.Join(dir, "foreign")
	if err := certs.Init(foreign, certs.Options{ClientName: "admin"}); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, p := range testPrincipals {
		tokens[p] = auth.NewToken()
	}
	policyFile := filepath.Join(dir, "policy.yaml")
	writePolicy(t, policyFile, tokens, testPolicy)
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	src, err := auth.Load(policyFile, func(p *auth.Policy, err error) {
		logger.Info("policy reloaded", "err", err)
	})
	if err != nil {
		t.Fatal(err)
	}
	clientCAs, err := certs.Pool(filepath.Join(dir, "client-ca.pem"), "--client-ca-file")
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := certs.AuthServerConfig(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Listener: testnet.Listen(t),
		TLS:      tlsConfig,
		Auth:     &auth.Authenticator{Policy: src, ClientCAs: clientCAs},
		Limits:   testLimits(),
		Logger:   logger,
		Raft:     oneNodeRaft(t),
	}
	for _, o := range options {
		o(&cfg)
	}
	srv, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	as := &authServer{Server: srv, policy: src, url: "https://" + srv.Addr(), dir: dir, tokens: tokens, logs: logs}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := as.http(t, "").Get(as.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return as
}

// credentials name how a caller authenticates: "token:NAME" (the
// policy's token for NAME, or the literal rest for an unknown one),
// "cert:FILE" (DIR/FILE.pem), "foreign" (a foreign CA's admin) or "".
func (as *authServer) http(t testing.TB, credentials string) *http.Client {
	t.Helper()
	ca := filepath.Join(as.dir, "ca.pem")
	var cert, key string
	switch {
	case strings.HasPrefix(credentials, "cert:"):
		name := strings.TrimPrefix(credentials, "cert:")
		cert, key = filepath.Join(as.dir, name+".pem"), filepath.Join(as.dir, name+"-key.pem")
	case credentials == "foreign":
		cert, key = filepath.Join(as.dir, "foreign", "client.pem"), filepath.Join(as.dir, "foreign", "client-key.pem")
	}
	cfg, err := certs.ClientConfig(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: cfg, Protocols: &p, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if name, ok := strings.CutPrefix(credentials, "token:"); ok {
		tok, known := as.tokens[name]
		if !known {
			tok = name
		}
		rt = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok)
			return tr.RoundTrip(r)
		})
	}
	return &http.Client{Transport: rt}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type authClients struct {
	http     *http.Client
	url      string
	sessions tenurev1connect.SessionServiceClient
	leases   tenurev1connect.LeaseServiceClient
	kv       tenurev1connect.KVServiceClient
	cluster  tenurev1connect.ClusterServiceClient
}

func (as *authServer) clients(t testing.TB, credentials string) *authClients {
	hc := as.http(t, credentials)
	return &authClients{
		http:     hc,
		url:      as.url,
		sessions: tenurev1connect.NewSessionServiceClient(hc, as.url),
		leases:   tenurev1connect.NewLeaseServiceClient(hc, as.url),
		kv:       tenurev1connect.NewKVServiceClient(hc, as.url),
		cluster:  tenurev1connect.NewClusterServiceClient(hc, as.url),
	}
}

// fixture is what team-a holds when a row of the matrix starts: a
// session, a grant of lease team-a/job-N and key team-a/k-N.
type fixture struct {
	session int64
	lease   string
	token   int64
	key     string
	// revocable is a second lease held, for Revoke.
	revocable string
}

func (as *authServer) fixture(t *testing.T, ctx context.Context, row int) fixture {
	t.Helper()
	a := as.clients(t, "token:team-a")
	open, err := a.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{session: open.Msg.Session.Id, lease: fmt.Sprintf("job-%d", row), key: fmt.Sprintf("team-a/k-%d", row)}
	acq, err := a.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: f.session, Namespace: "team-a", Name: f.lease}))
	if err != nil {
		t.Fatal(err)
	}
	f.token = acq.Msg.Token
	f.revocable = f.lease + "-r"
	if _, err := a.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: f.session, Namespace: "team-a", Name: f.revocable})); err != nil {
		t.Fatal(err)
	}
	if _, err := a.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: f.key, Value: "v"})); err != nil {
		t.Fatal(err)
	}
	return f
}

// revision is the store's revision, read as admin: a denied mutation
// must leave it where it was.
func (as *authServer) revision(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	r, err := as.clients(t, "token:admin").kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Limit: 1}))
	if err != nil {
		t.Fatal(err)
	}
	return r.Msg.GlobalRevision // session IDs and tokens are global revisions
}

// firstMessage receives one message of a server stream, which the
// watches below always have (they replay from revision 1).
func firstMessage[M any](s *connect.ServerStreamForClient[M], err error) error {
	if err != nil {
		return err
	}
	defer s.Close()
	if s.Receive() {
		return nil
	}
	if s.Err() != nil {
		return s.Err()
	}
	return errors.New("stream ended without a message")
}
