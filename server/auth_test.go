package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
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

func startAuthServer(t testing.TB) *authServer {
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
	srv, err := Open(Config{
		Listener: testnet.Listen(t),
		TLS:      tlsConfig,
		Auth:     &auth.Authenticator{Policy: src, ClientCAs: clientCAs},
		Limits:   testLimits(),
		Logger:   logger,
		Raft: raftnode.Config{
			NodeID: "node1", DataDir: t.TempDir(), PeerAddr: "127.0.0.1:0", Bootstrap: true,
			ElectionTimeout: 100 * time.Millisecond,
		},
	})
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

// Expected outcomes of a matrix cell.
const (
	ok      = "ok"                // answered without error
	allowed = "allowed"           // past the gate: any answer but the two below
	unauth  = "unauthenticated"   // connect.CodeUnauthenticated, HTTP 401
	denied  = "permission_denied" // connect.CodePermissionDenied, HTTP 403
	// notFound is connect.CodeNotFound: a session the caller may not
	// see is answered as one that does not exist.
	notFound = "not_found"
)

type matrixCall struct {
	name     string
	mutation bool
	call     func(ctx context.Context, c *authClients, f fixture) error
}

// codeOf is the outcome of a call's error as the matrix names it.
func codeOf(err error) string {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return unauth
	case connect.CodePermissionDenied:
		return denied
	case connect.CodeNotFound:
		return notFound
	}
	if err == nil {
		return ok
	}
	return "error: " + err.Error()
}

func httpCall(path string) func(ctx context.Context, c *authClients, f fixture) error {
	return func(ctx context.Context, c *authClients, f fixture) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url+path, nil)
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return nil
		case http.StatusUnauthorized:
			return connect.NewError(connect.CodeUnauthenticated, errors.New(resp.Status))
		case http.StatusForbidden:
			return connect.NewError(connect.CodePermissionDenied, errors.New(resp.Status))
		}
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
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

var matrixCalls = []matrixCall{
	{"SessionService/Open", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
		return err
	}},
	{"SessionService/KeepAlive", false, func(ctx context.Context, c *authClients, f fixture) error {
		s := c.sessions.KeepAlive(ctx)
		defer s.CloseResponse()
		if err := s.Send(&tenurev1.KeepAliveRequest{SessionId: f.session}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err := s.Receive()
		return err
	}},
	{"SessionService/Refresh", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: f.session}))
		return err
	}},
	{"SessionService/Get", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: f.session}))
		return err
	}},
	{"SessionService/List", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{}))
		return err
	}},
	{"SessionService/Pipeline", true, func(ctx context.Context, c *authClients, f fixture) error {
		s := c.sessions.Pipeline(ctx)
		defer s.CloseResponse()
		if err := s.Send(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_SetValue{SetValue: &tenurev1.SetValueRequest{
			Namespace: "team-a", Name: f.lease, Token: f.token, Value: "piped",
		}}}); err != nil && !errors.Is(err, io.EOF) {
			return err // io.EOF: refused; Receive says why
		}
		res, err := s.Receive()
		if err != nil {
			return err
		}
		if e := res.GetError(); e != nil {
			return connect.NewError(connect.Code(e.Code), errors.New(e.Message))
		}
		return nil
	}},
	{"LeaseService/Acquire", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: f.session, Namespace: "team-a", Name: f.lease + "-more"}))
		return err
	}},
	{"LeaseService/SetValue", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.SetValue(ctx, connect.NewRequest(&tenurev1.SetValueRequest{Namespace: "team-a", Name: f.lease, Token: f.token, Value: "x"}))
		return err
	}},
	{"LeaseService/Get", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: "team-a", Name: f.lease}))
		return err
	}},
	{"LeaseService/List", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{Namespace: "team-a"}))
		return err
	}},
	{"LeaseService/List all namespaces", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{AllNamespaces: true}))
		return err
	}},
	{"LeaseService/Validate", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Namespace: "team-a", Name: f.lease, Token: f.token}))
		return err
	}},
	{"LeaseService/Watch", false, func(ctx context.Context, c *authClients, f fixture) error {
		return firstMessage(c.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{Namespace: "team-a", StartRevision: 1})))
	}},
	{"KVService/Get", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: f.key}))
		return err
	}},
	{"KVService/ValidateKey", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.ValidateKey(ctx, connect.NewRequest(&tenurev1.ValidateKeyRequest{Key: f.key, Revision: 2}))
		return err
	}},
	{"KVService/Range", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: "team-a/"}))
		return err
	}},
	{"KVService/CompareAndSwap", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{Key: f.key, Value: "swapped",
			Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "v"}}}))
		return err
	}},
	{"KVService/Put", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: f.key, Value: "changed"}))
		return err
	}},
	{"KVService/Watch", false, func(ctx context.Context, c *authClients, f fixture) error {
		return firstMessage(c.kv.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: "team-a/", Prefix: true, StartRevision: 1})))
	}},
	{"ClusterService/Members", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Members(ctx, connect.NewRequest(&tenurev1.MembersRequest{}))
		return err
	}},
	{"ClusterService/Status", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
		return err
	}},
	// The cluster changes are made invalid on purpose, so that an
	// admin's call passes the gate and fails after it, leaving the
	// one-node cluster as it was.
	{"ClusterService/Join", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Join(ctx, connect.NewRequest(&tenurev1.JoinRequest{}))
		return err
	}},
	{"ClusterService/Introduce", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Introduce(ctx, connect.NewRequest(&tenurev1.IntroduceRequest{}))
		return err
	}},
	{"ClusterService/RemoveMember", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.RemoveMember(ctx, connect.NewRequest(&tenurev1.RemoveMemberRequest{Id: "no-such-node"}))
		return err
	}},
	{"ClusterService/TransferLeadership", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.TransferLeadership(ctx, connect.NewRequest(&tenurev1.TransferLeadershipRequest{Id: "no-such-node"}))
		return err
	}},
	{"ClusterService/Snapshot", false, func(ctx context.Context, c *authClients, f fixture) error {
		return firstMessage(c.cluster.Snapshot(ctx, connect.NewRequest(&tenurev1.SnapshotRequest{})))
	}},
	{"GET /v1/watch/leases", false, httpCall("/v1/watch/leases?namespace=team-a&start_revision=1")},
	{"GET /v1/watch/keys", false, httpCall("/v1/watch/keys?key=team-a/&prefix=true&start_revision=1")},
	{"GET /metrics", false, httpCall("/metrics")},
	{"GET /healthz", false, httpCall("/healthz")},
	{"GET /livez", false, httpCall("/livez")},
	{"GET /readyz", false, httpCall("/readyz")},
	{"GET / (the page)", false, httpCall("/")},
	{"LeaseService/SetPreferredHolder", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.SetPreferredHolder(ctx, connect.NewRequest(&tenurev1.SetPreferredHolderRequest{Namespace: "team-a", Name: f.lease, Identity: "team-a/standby"}))
		return err
	}},
	// Last: they end the fixture.
	{"LeaseService/Release", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: "team-a", Name: f.lease, Token: f.token}))
		return err
	}},
	{"LeaseService/Revoke", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Namespace: "team-a", Name: f.revocable, Reason: "matrix"}))
		return err
	}},
	{"KVService/Delete", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: f.key}))
		return err
	}},
	{"SessionService/Close", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: f.session}))
		return err
	}},
}

// open are the endpoints anybody may call: probes and the page itself.
var openEndpoints = map[string]bool{"GET /healthz": true, "GET /livez": true, "GET /readyz": true, "GET / (the page)": true}

// expected is what each caller must get from each call on team-a's
// resources.
func expected(caller, call string) string {
	if openEndpoints[call] {
		return ok
	}
	switch caller {
	case "no credentials", "unknown token", "expired token", "expired certificate", "foreign-CA certificate":
		return unauth
	case "admin token", "admin certificate":
		switch call {
		// An admin may break in, but never act as the holder.
		case "SessionService/KeepAlive", "SessionService/Refresh", "LeaseService/Acquire",
			"LeaseService/SetValue", "SessionService/Pipeline":
			return denied
		case "ClusterService/Join", "ClusterService/Introduce", "ClusterService/RemoveMember", "ClusterService/TransferLeadership":
			return allowed
		}
		return ok
	case "read-only principal":
		switch call {
		case "SessionService/Get", "SessionService/List", "LeaseService/Get", "LeaseService/List",
			"LeaseService/List all namespaces", "LeaseService/Validate", "LeaseService/Watch",
			"KVService/Get", "KVService/ValidateKey", "KVService/Range", "KVService/Watch", "ClusterService/Members",
			"ClusterService/Status", "GET /v1/watch/leases", "GET /v1/watch/keys", "GET /metrics":
			return ok
		}
		return denied
	case "lock principal of another namespace":
		switch call {
		case "SessionService/Get":
			return notFound
		// Its own session; lists filtered to what it may read.
		case "SessionService/Open", "SessionService/List", "LeaseService/List all namespaces",
			"ClusterService/Members", "ClusterService/Status", "GET /metrics":
			return ok
		}
		return denied
	case "validate-only principal":
		switch call {
		case "SessionService/Get":
			return notFound
		case "LeaseService/Validate", "SessionService/List", "LeaseService/List all namespaces",
			"ClusterService/Members", "ClusterService/Status", "GET /metrics":
			return ok
		}
		return denied
	}
	panic("no expectations for " + caller)
}

// TestEveryEndpointAnswersEachCallerExactlyAsThePolicySays is the
// authorization matrix: every RPC and HTTP endpoint, called on team-a's
// session, lease and key by callers without credentials, with a token
// the policy does not know or that expired, with an expired or a
// foreign CA's certificate, and as a reader, a lock principal of another
// namespace, a validate-only principal and an admin (by token and by
// certificate). Each answers exactly the expected code, and a refused
// mutation leaves the store's revision where it was.
func TestEveryEndpointAnswersEachCallerExactlyAsThePolicySays(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	callers := []struct{ name, credentials string }{
		{"no credentials", ""},
		{"unknown token", "token:tnr_not-a-token-the-policy-knows"},
		{"expired token", "token:retired"},
		{"expired certificate", "cert:expired"},
		{"foreign-CA certificate", "foreign"},
		{"read-only principal", "token:reader"},
		{"lock principal of another namespace", "cert:team-b"},
		{"validate-only principal", "token:validator"},
		{"admin token", "token:admin"},
		{"admin certificate", "cert:client"},
	}
	for row, caller := range callers {
		t.Run(caller.name, func(t *testing.T) {
			f := as.fixture(t, ctx, row)
			c := as.clients(t, caller.credentials)
			for _, call := range matrixCalls {
				want := expected(caller.name, call.name)
				before := as.revision(t, ctx)
				callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := call.call(callCtx, c, f)
				cancel()
				got := codeOf(err)
				if want == allowed {
					if got == unauth || got == denied {
						t.Errorf("%s: got = %s (%v), expected: past the gate", call.name, got, err)
					}
				} else if got != want {
					t.Errorf("%s: got = %s, expected: %s", call.name, got, want)
				}
				if call.mutation && (want == unauth || want == denied) {
					if after := as.revision(t, ctx); after != before {
						t.Errorf("%s refused, yet the revision moved from %d to %d", call.name, before, after)
					}
				}
			}
		})
	}
	// Every refusal is in the audit trail with its principal; no token
	// is anywhere in the logs.
	logs := as.logs.String()
	for _, want := range []string{`principal=reader action=/tenure.v1.KVService/Put target=team-a/k-5 outcome=denied`, `action=/tenure.v1.LeaseService/Revoke target=team-a/job-8-r outcome=allowed`} {
		if !strings.Contains(logs, want) {
			t.Errorf("audit log lacks %q", want)
		}
	}
	for name, tok := range as.tokens {
		if strings.Contains(logs, tok) || strings.Contains(logs, tok[len(tok)/2:]) {
			t.Errorf("the logs hold %s's token", name)
		}
	}
}

// TestNoPrincipalCanActAsAnother: team-a and team-b both lock in the
// "shared" namespace. team-b cannot open a session as team-a, acquire or
// heartbeat with team-a's session, release or set the value of team-a's
// grant, close team-a's session, read team-a's keys, see team-a's
// sessions or lease events, or claim to be admin with the header a
// forwarding node uses; and the same refusals reach a Go client on its
// pipelined connection as ErrPermissionDenied.
func TestNoPrincipalCanActAsAnother(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := as.clients(t, "token:team-a"), as.clients(t, "token:team-b")
	open, err := a.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	sa := open.Msg.Session
	if sa.Identity != "team-a" {
		t.Errorf("identity of a session opened without one: got = %q, expected: the principal, team-a", sa.Identity)
	}
	grant, err := a.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sa.Id, Namespace: "shared", Name: "db-migration"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "team-a/secret", Value: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("team-b %s: got = %v, expected: permission_denied", what, err)
		}
	}
	_, err = b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "team-a"}))
	refused("opens a session as team-a", err)
	_, err = b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "team-a/pod-1"}))
	refused("opens a session as team-a/pod-1", err)
	_, err = b.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sa.Id, Namespace: "shared", Name: "other"}))
	refused("acquires with team-a's session", err)
	_, err = b.sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: sa.Id}))
	refused("heartbeats team-a's session", err)
	_, err = b.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: "shared", Name: "db-migration", Token: grant.Msg.Token}))
	refused("releases team-a's grant", err)
	_, err = b.leases.SetValue(ctx, connect.NewRequest(&tenurev1.SetValueRequest{Namespace: "shared", Name: "db-migration", Token: grant.Msg.Token, Value: "mine"}))
	refused("sets the value of team-a's grant", err)
	_, err = b.sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sa.Id}))
	refused("closes team-a's session", err)
	_, err = b.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/secret"}))
	refused("reads team-a's key", err)
	_, err = b.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: ""}))
	refused("ranges over every key", err)
	refused("watches every key", firstMessage(b.kv.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Prefix: true, StartRevision: 1}))))

	// A caller's claim to be forwarding for admin is dropped: only a
	// node's certificate makes it believed.
	forged := connect.NewRequest(&tenurev1.RevokeRequest{Namespace: "shared", Name: "db-migration", Reason: "forged"})
	forged.Header().Set(auth.ForwardedPrincipalHeader, "admin")
	_, err = b.leases.Revoke(ctx, forged)
	refused("revokes, claiming to forward for admin", err)

	// Lists: team-b sees team-a's session only for what they share, and
	// no event of team-a's own namespace.
	list, err := b.sessions.List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, sess := range list.Msg.Sessions {
		if sess.Id == sa.Id && (len(sess.Leases) != 1 || sess.Leases[0] != "shared/db-migration") {
			t.Errorf("team-a's session as team-b sees it: got = leases %v, expected: only shared/db-migration", sess.Leases)
		}
	}
	if _, err := a.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sa.Id, Namespace: "team-a", Name: "private"})); err != nil {
		t.Fatal(err)
	}
	watch, err := b.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{AllNamespaces: true, StartRevision: 1}))
	if err != nil {
		t.Fatal(err)
	}
	// A marker event team-b may see ends the replay.
	sb, err := b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sb.Msg.Session.Id, Namespace: "team-b", Name: "marker"})); err != nil {
		t.Fatal(err)
	}
	for watch.Receive() {
		ev := watch.Msg()
		if ev.Namespace == "team-a" {
			t.Errorf("team-b's watch of every namespace delivered %s/%s", ev.Namespace, ev.Name)
		}
		if ev.Name == "marker" {
			break
		}
	}
	watch.Close()

	// The Go client, on its pipelined connection.
	cfg, err := certs.ClientConfig(filepath.Join(as.dir, "ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	gc, err := client.New(ctx, []string{as.url}, client.WithTLS(cfg), client.WithToken(as.tokens["team-b"]))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if _, err := gc.KV().Put(ctx, "team-a/secret", "overwritten"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("Go client put of team-a's key: got = %v, expected: ErrPermissionDenied", err)
	}
	s, err := gc.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if s.Identity() != "team-b" {
		t.Errorf("Go client session identity: got = %q, expected: team-b", s.Identity())
	}
	if err := s.Mutex("private", client.WithNamespace("team-a")).TryLock(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("Go client TryLock in team-a: got = %v, expected: ErrPermissionDenied", err)
	}
	if err := s.Mutex("own", client.WithNamespace("team-b")).TryLock(ctx); err != nil {
		t.Errorf("Go client TryLock in its own namespace: got = %v, expected: held", err)
	}

	got, err := a.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/secret"}))
	if err != nil || got.Msg.Kv.Value != "s3cret" {
		t.Errorf("team-a's key after team-b's attempts: got = %v, %v, expected: s3cret", got, err)
	}
	if l, err := a.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: "shared", Name: "db-migration"})); err != nil ||
		len(l.Msg.Lease.Holders) != 1 || l.Msg.Lease.Holders[0].Token != grant.Msg.Token || l.Msg.Lease.Value != "" {
		t.Errorf("team-a's grant after team-b's attempts: got = %v, %v, expected: held as granted", l, err)
	}
}

// TestPerPrincipalLimitsAnswerResourceExhaustedNamingTheLimit: a
// principal over its open sessions, or over its request rate, is
// refused with resource_exhausted and a message naming the limit, and
// nothing is opened.
func TestPerPrincipalLimitsAnswerResourceExhaustedNamingTheLimit(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := as.clients(t, "token:team-b")
	for i := range 3 {
		if _, err := b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)})); err != nil {
			t.Fatalf("session %d of 3: %v", i+1, err)
		}
	}
	before := as.revision(t, ctx)
	_, err := b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "team-b has 3 sessions open") {
		t.Errorf("a fourth session: got = %v, expected: resource_exhausted naming the limit of 3", err)
	}
	if after := as.revision(t, ctx); after != before {
		t.Errorf("the refused Open moved the revision from %d to %d", before, after)
	}

	slow := as.clients(t, "token:slow")
	var last error
	for range 10 {
		if _, last = slow.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/x"})); connect.CodeOf(last) == connect.CodeResourceExhausted {
			break
		}
	}
	if connect.CodeOf(last) != connect.CodeResourceExhausted || !strings.Contains(last.Error(), "slow is over its limit of 0.5 requests per second") {
		t.Errorf("past its burst of 3: got = %v, expected: resource_exhausted naming the rate", last)
	}
}

// TestPolicyReloadAppliesAValidChangeAndKeepsTheOldOnABadFile: a valid
// new policy takes effect without a restart, whether reloaded at once
// (SIGHUP) or noticed on disk; an invalid one is refused, the policy in
// force stays, and the refusal is logged.
func TestPolicyReloadAppliesAValidChangeAndKeepsTheOldOnABadFile(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reader := as.clients(t, "token:reader")
	put := func() error {
		_, err := reader.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "notes/1", Value: "x"}))
		return err
	}
	if err := put(); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("reader puts before the change: got = %v, expected: permission_denied", err)
	}
	file := filepath.Join(as.dir, "policy.yaml")
	writable := strings.Replace(testPolicy, "  reader:\n    - namespaces: [\"*\"]\n      keys: [\"*\"]\n      verbs: [read]",
		"  reader:\n    - namespaces: [\"*\"]\n      keys: [\"*\"]\n      verbs: [read, write]", 1)
	if writable == testPolicy {
		t.Fatal("the test's policy edit matched nothing")
	}
	writePolicy(t, file, as.tokens, writable)
	if err := as.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := put(); err != nil {
		t.Errorf("reader puts after the reload: got = %v, expected: ok", err)
	}

	// A bad file: refused, the policy before it stays.
	if err := os.WriteFile(file, []byte("principals:\n  - name: reader\n    roles: [no-such-role]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := as.policy.Reload(); err == nil || !strings.Contains(err.Error(), `role "no-such-role" is not defined`) {
		t.Errorf("reloading a bad file: got = %v, expected: an error naming the undefined role", err)
	}
	if err := put(); err != nil {
		t.Errorf("reader puts after a bad reload: got = %v, expected: ok, the old policy stays", err)
	}
	if !strings.Contains(as.logs.String(), "no-such-role") {
		t.Error("the refused reload is not in the log")
	}

	// Noticed on disk, without being told.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watching := make(chan struct{})
	defer func() {
		stopWatch()
		<-watching
	}()
	go func() {
		defer close(watching)
		as.policy.Watch(watchCtx, 20*time.Millisecond)
	}()
	writePolicy(t, file, as.tokens, testPolicy)
	deadline := time.Now().Add(10 * time.Second)
	for put() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the policy file's change was not noticed in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
