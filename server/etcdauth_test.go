package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
)

// etcdAuthPolicy: alice is an etcd user (password "alice-pw", or the
// hash given), carol has a Tenure token; both read and write under
// "app/". reader (a client certificate) reads "app/". admin (password
// "admin-pw") may do anything.
const etcdAuthPolicy = `
principals:
  - name: alice
    roles: [app]
    etcd_password_bcrypt: %q
  - name: carol
    roles: [app]
    tokens: [{sha256: %q}]
  - name: reader
    roles: [app-reader]
  - name: admin
    roles: [admin]
    etcd_password_bcrypt: %q
roles:
  app:
    - keys: [app/]
      verbs: [read, write]
  app-reader:
    - keys: [app/]
      verbs: [read]
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
`

// etcdAuthServer is a single node serving the etcd API on loopback with
// etcdAuthPolicy, without TLS: the interceptors' handling of client
// certificates is tested on its own (TestEtcdCallerByClientCertificate).
type etcdAuthServer struct {
	*Server
	policyFile  string
	policy      *auth.Source
	certs       string
	etcd        string // the etcd API's address
	carolToken  string
	logs        *lockedBuffer
	alicePolicy func(aliceHash, carolToken string)
	adminHash   string
}

func bcryptOf(t testing.TB, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func startEtcdAuthServer(t *testing.T) *etcdAuthServer {
	t.Helper()
	dir := t.TempDir()
	if err := certs.Init(dir, certs.Options{ClientName: "admin"}); err != nil {
		t.Fatal(err)
	}
	if err := certs.Client(dir, "reader", "reader", certs.Options{}); err != nil {
		t.Fatal(err)
	}
	es := &etcdAuthServer{policyFile: filepath.Join(dir, "policy.yaml"), certs: dir, carolToken: auth.NewToken(), logs: &lockedBuffer{}, adminHash: bcryptOf(t, "admin-pw")}
	es.alicePolicy = func(aliceHash, carolToken string) {
		body := fmt.Sprintf(etcdAuthPolicy, aliceHash, auth.HashToken(carolToken), es.adminHash)
		if err := os.WriteFile(es.policyFile, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	es.alicePolicy(bcryptOf(t, "alice-pw"), es.carolToken)
	logger := slog.New(slog.NewTextHandler(es.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	src, err := auth.Load(es.policyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	es.policy = src
	clientCAs, err := certs.Pool(filepath.Join(dir, "client-ca.pem"), "--client-ca-file")
	if err != nil {
		t.Fatal(err)
	}
	etcdLn := testnet.Listen(t)
	srv, err := Open(Config{
		Listener: testnet.Listen(t),
		Auth:     &auth.Authenticator{Policy: src, ClientCAs: clientCAs},
		Limits:   testLimits(),
		Logger:   logger,
		Etcd:     EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String(), BcryptCost: bcrypt.MinCost},
		Raft:     oneNodeRaft(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	es.Server, es.etcd = srv, etcdLn.Addr().String()
	// Ready when the node leads: a write through the etcd API works.
	c := es.client(t, "admin", "admin-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := c.Put(ctx, "ready", "1")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the etcd API never took a write: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return es
}

// client is an etcd client of es, logged in as user when it is set.
func (es *etcdAuthServer) client(t *testing.T, user, password string) *clientv3.Client {
	t.Helper()
	return etcdLogin(t, es.etcd, user, password)
}

// etcdLogin is an etcd client of endpoint, logged in as user when it is
// set, closed at cleanup.
func etcdLogin(t *testing.T, endpoint, user, password string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: []string{endpoint}, Username: user, Password: password,
		// A login is a bcrypt: seconds at etcd's cost under the race
		// detector on a busy machine.
		DialTimeout: 30 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client (%q): %v", user, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// conn is a plain gRPC connection to es's etcd API: the test sets the
// metadata itself.
func (es *etcdAuthServer) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(es.etcd, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, token)
}

// isEtcdErr reports whether err is etcd's error want, by code and text,
// as clients match them.
func isEtcdErr(err, want error) bool {
	return err != nil && errors.Is(rpctypes.Error(err), rpctypes.Error(want))
}

func TestEtcdCallersAuthenticateAsWithEtcd(t *testing.T) {
	es := startEtcdAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep := es.etcd

	// Nobody: only Authenticate answers, as etcd 3.5 with auth on.
	anon := es.client(t, "", "")
	for name, call := range map[string]func() error{
		"Status":     func() error { _, err := anon.Status(ctx, ep); return err },
		"MemberList": func() error { _, err := anon.MemberList(ctx); return err },
		"Put":        func() error { _, err := anon.Put(ctx, "app/x", "v"); return err },
		"Get":        func() error { _, err := anon.Get(ctx, "app/x"); return err },
		"LeaseGrant": func() error { _, err := anon.Grant(ctx, 10); return err },
	} {
		if err := call(); !isEtcdErr(err, rpctypes.ErrGRPCUserEmpty) {
			t.Errorf("%s without credentials: got = %v, expected: %v", name, err, rpctypes.ErrGRPCUserEmpty)
		}
	}
	// A forwarded principal is believed only from a node.
	ac := pb.NewAuthClient(es.conn(t))
	kv := pb.NewKVClient(es.conn(t))
	claim := metadata.AppendToOutgoingContext(ctx, etcdPrincipalKey, "admin")
	if _, err := kv.Put(claim, &pb.PutRequest{Key: []byte("app/x"), Value: []byte("v")}); !isEtcdErr(err, rpctypes.ErrGRPCUserEmpty) {
		t.Errorf("Put claiming to be forwarded for admin: got = %v, expected: %v", err, rpctypes.ErrGRPCUserEmpty)
	}
	if _, err := ac.Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "wrong"}); !isEtcdErr(err, rpctypes.ErrGRPCAuthFailed) {
		t.Errorf("Authenticate with a wrong password: got = %v, expected: %v", err, rpctypes.ErrGRPCAuthFailed)
	}
	if _, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Username: "alice", Password: "wrong", DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err == nil {
		t.Errorf("an etcd client with a wrong password: got = no error, expected: authentication failed")
	}

	// alice by password: her keys, nobody else's, and no admin calls.
	alice := es.client(t, "alice", "alice-pw")
	if _, err := alice.Put(ctx, "app/a", "1"); err != nil {
		t.Fatalf("alice puts app/a: %v", err)
	}
	if r, err := alice.Get(ctx, "app/", clientv3.WithPrefix()); err != nil || len(r.Kvs) != 1 {
		t.Errorf("alice reads the prefix app/: got = %v, %v, expected: app/a", r, err)
	}
	for name, call := range map[string]func() error{
		"Put other/a":           func() error { _, err := alice.Put(ctx, "other/a", "1"); return err },
		"Get of every key":      func() error { _, err := alice.Get(ctx, "", clientv3.WithFromKey()); return err },
		"Get of a wider prefix": func() error { _, err := alice.Get(ctx, "app", clientv3.WithPrefix()); return err },
		"AuthStatus":            func() error { _, err := alice.AuthStatus(ctx); return err },
		"Alarm DEACTIVATE": func() error {
			_, err := alice.AlarmDisarm(ctx, &clientv3.AlarmMember{Alarm: pb.AlarmType_NOSPACE})
			return err
		},
	} {
		if err := call(); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
			t.Errorf("alice: %s: got = %v, expected: %v", name, err, rpctypes.ErrGRPCPermissionDenied)
		}
	}
	if st, err := alice.Status(ctx, ep); err != nil || !strings.HasPrefix(st.Version, "3.5.13") {
		t.Errorf("alice asks the status: got = %v, %v, expected: version 3.5.0...", st, err)
	}
	if !strings.Contains(es.logs.String(), `may not write key \"other/a\"`) {
		t.Errorf("audit log: no line for alice's denied put of other/a:\n%s", es.logs.String())
	}

	// carol by her Tenure token in the token metadata.
	if _, err := kv.Put(withToken(ctx, es.carolToken), &pb.PutRequest{Key: []byte("app/c"), Value: []byte("v")}); err != nil {
		t.Errorf("carol puts app/c with her Tenure token: %v", err)
	}
	if _, err := kv.Put(withToken(ctx, "tnr_not-a-token"), &pb.PutRequest{Key: []byte("app/c"), Value: []byte("v")}); !isEtcdErr(err, rpctypes.ErrGRPCInvalidAuthToken) {
		t.Errorf("a put with a token nobody issued: got = %v, expected: %v", err, rpctypes.ErrGRPCInvalidAuthToken)
	}

	admin := es.client(t, "admin", "admin-pw")
	if st, err := admin.AuthStatus(ctx); err != nil || !st.Enabled {
		t.Errorf("admin asks AuthStatus: got = %v, %v, expected: enabled", st, err)
	}
}

// A client certificate from the client CA names the principal by its
// CN, as etcd names the user; the interceptor puts it on the context
// where etcdAuthorize and actorFor find it.
func TestEtcdCallerByClientCertificate(t *testing.T) {
	es := startEtcdAuthServer(t)
	if err := certs.Client(es.certs, "stranger", "stranger", certs.Options{}); err != nil {
		t.Fatal(err)
	}
	chain := func(name string) []*x509.Certificate {
		pemBytes, err := os.ReadFile(filepath.Join(es.certs, name+".pem"))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(pemBytes)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{cert}
	}
	call := func(certName, method string, req any, inner func(ctx context.Context) error) error {
		p := &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: chain(certName)}}}
		ctx := peer.NewContext(context.Background(), p)
		_, err := es.etcdUnaryAuth()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
			return nil, inner(ctx)
		})
		return err
	}
	put := &pb.PutRequest{Key: []byte("app/r"), Value: []byte("v")}
	err := call("reader", "/etcdserverpb.KV/Range", &pb.RangeRequest{}, func(ctx context.Context) error {
		if c, _ := callerOf(ctx); c.Principal != "reader" || c.By != auth.ByCertificate {
			return fmt.Errorf("caller: got = %+v, expected: reader by certificate", c)
		}
		if id := es.etcdIdentity(ctx); id != "reader" {
			return fmt.Errorf("etcdIdentity: got = %q, expected: reader", id)
		}
		return etcdapi.ToGRPC(frontNode{es.Server}.Authorize(ctx, etcdapi.VerbRead, "app/", "app0"))
	})
	if err != nil {
		t.Errorf("reader reads app/ by its certificate: %v", err)
	}
	err = call("reader", "/etcdserverpb.KV/Put", put, func(ctx context.Context) error {
		return etcdapi.ToGRPC(frontNode{es.Server}.Authorize(ctx, etcdapi.VerbWrite, "app/r", ""))
	})
	if !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("reader writes app/r: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}
	err = call("stranger", "/etcdserverpb.KV/Put", put, func(context.Context) error { return errors.New("the handler ran") })
	if !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("a certificate the policy does not name: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}
	if !strings.Contains(es.logs.String(), "principal stranger is not in the policy") {
		t.Errorf("audit log: no line for the stranger's refused call:\n%s", es.logs.String())
	}
}

// An etcd token works until the password hash in the policy changes;
// an etcd client then logs in again by itself, with the new password.
func TestEtcdTokenStopsWorkingWhenThePasswordChanges(t *testing.T) {
	es := startEtcdAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ac, kv := pb.NewAuthClient(es.conn(t)), pb.NewKVClient(es.conn(t))
	resp, err := ac.Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "alice-pw"})
	if err != nil {
		t.Fatal(err)
	}
	put := &pb.PutRequest{Key: []byte("app/t"), Value: []byte("v")}
	if _, err := kv.Put(withToken(ctx, resp.Token), put); err != nil {
		t.Fatalf("a put with alice's fresh token: %v", err)
	}
	es.alicePolicy(bcryptOf(t, "new-pw"), es.carolToken)
	if err := es.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(withToken(ctx, resp.Token), put); !isEtcdErr(err, rpctypes.ErrGRPCInvalidAuthToken) {
		t.Errorf("a put with alice's token after her password changed: got = %v, expected: %v", err, rpctypes.ErrGRPCInvalidAuthToken)
	}
	if _, err := ac.Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "alice-pw"}); !isEtcdErr(err, rpctypes.ErrGRPCAuthFailed) {
		t.Errorf("Authenticate with the old password: got = %v, expected: %v", err, rpctypes.ErrGRPCAuthFailed)
	}
	alice := es.client(t, "alice", "new-pw")
	if _, err := alice.Put(ctx, "app/t", "w"); err != nil {
		t.Errorf("a put by a client with the new password: %v", err)
	}
}

// A stream's credential is checked on every message: once carol's token
// leaves the policy, her open keep-alive stream ends with etcd's invalid
// auth token, and nothing more is renewed through it.
func TestEtcdStreamEndsWhenItsTokenIsRevoked(t *testing.T) {
	es := startEtcdAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := es.conn(t)
	lc := pb.NewLeaseClient(conn)
	carol := withToken(ctx, es.carolToken)
	grant, err := lc.LeaseGrant(carol, &pb.LeaseGrantRequest{TTL: 30})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := lc.LeaseKeepAlive(carol)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: grant.ID}); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.TTL <= 0 {
		t.Fatalf("a keep-alive with carol's token: got = %v, %v, expected: the lease renewed", r, err)
	}
	es.alicePolicy(bcryptOf(t, "alice-pw"), auth.NewToken()) // carol's token is gone
	if err := es.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: grant.ID}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if !isEtcdErr(err, rpctypes.ErrGRPCInvalidAuthToken) {
		t.Errorf("a keep-alive after carol's token left the policy: got = %v, %v, expected: %v", r, err, rpctypes.ErrGRPCInvalidAuthToken)
	}
	if !strings.Contains(es.logs.String(), "/etcdserverpb.Lease/LeaseKeepAlive") {
		t.Errorf("audit log: no line for the refused keep-alive:\n%s", es.logs.String())
	}
}
