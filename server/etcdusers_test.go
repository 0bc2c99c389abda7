package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/bcrypt"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/testnet"
)

// etcdUsersServer is a node without a policy file, serving the etcd API:
// its policy is etcd's users and roles alone.
type etcdUsersServer struct {
	*Server
	etcd string
	logs *lockedBuffer
}

func startEtcdUsersServer(t *testing.T, authn *auth.Authenticator) *etcdUsersServer {
	t.Helper()
	logs := &lockedBuffer{}
	etcdLn := testnet.Listen(t)
	srv, err := Open(Config{
		Listener: testnet.Listen(t),
		Auth:     authn,
		Limits:   testLimits(),
		Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		// bcrypt's least cost: each user add and login pays it, and
		// cost 10 is seconds apiece under the race detector.
		Etcd: EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String(), BcryptCost: bcrypt.MinCost},
		Raft: oneNodeRaft(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	es := &etcdUsersServer{Server: srv, etcd: etcdLn.Addr().String(), logs: logs}
	c := es.client(t, "", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, err := c.Get(ctx, "ready"); err == nil {
			return es
		} else if ctx.Err() != nil {
			t.Fatalf("the etcd API never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (es *etcdUsersServer) client(t *testing.T, user, password string) *clientv3.Client {
	t.Helper()
	return etcdLogin(t, es.etcd, user, password)
}

// native is a native KV client sending token as its bearer token ("":
// none).
func (es *etcdUsersServer) native(token string) tenurev1connect.KVServiceClient {
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	return tenurev1connect.NewKVServiceClient(hc, "http://"+es.Addr())
}

// token logs user in through the etcd API and returns its token.
func (es *etcdUsersServer) token(t *testing.T, ctx context.Context, user, password string) string {
	t.Helper()
	resp, err := es.client(t, "", "").Authenticate(ctx, user, password)
	if err != nil {
		t.Fatalf("authenticate %s: %v", user, err)
	}
	return resp.Token
}

// TestEtcdUsersGovernBothAPIs: etcd's runbook (role add, grant
// permission, user add, grant role, auth enable) on a node without a
// policy file puts etcd's users in force on the etcd API and the native
// API alike: an anonymous caller is refused on both, a user may do what
// its roles grant on both, a changed password ends its tokens, a revoked
// role applies to the next call, and auth disable opens the node again.
func TestEtcdUsersGovernBothAPIs(t *testing.T) {
	es := startEtcdUsersServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	anon := es.client(t, "", "")
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// Before auth enable everything is open, on both APIs.
	if _, err := es.native("").Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "open", Value: "1"})); err != nil {
		t.Fatalf("a native put before auth enable: got = %v, expected: open", err)
	}
	_, err := anon.RoleAdd(ctx, "app")
	must("role add", err)
	_, err = anon.RoleGrantPermission(ctx, "app", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
	must("grant permission", err)
	_, err = anon.UserAdd(ctx, "root", "root-pw")
	must("user add root", err)
	_, err = anon.UserGrantRole(ctx, "root", "root")
	must("grant root", err)
	_, err = anon.UserAdd(ctx, "carol", "carol-pw")
	must("user add carol", err)
	_, err = anon.UserGrantRole(ctx, "carol", "app")
	must("grant app", err)
	_, err = anon.AuthEnable(ctx)
	must("auth enable", err)

	// Anonymous callers are refused on both APIs.
	if _, err := anon.Put(ctx, "app/x", "1"); !isEtcdErr(err, rpctypes.ErrGRPCUserEmpty) {
		t.Errorf("an anonymous etcd put: got = %v, expected: %v", err, rpctypes.ErrGRPCUserEmpty)
	}
	if _, err := es.native("").Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "app/x", Value: "1"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("an anonymous native put: got = %v, expected: unauthenticated", err)
	}

	// carol may write under app/ and nowhere else, through both.
	carol := es.client(t, "carol", "carol-pw")
	if _, err := carol.Put(ctx, "app/x", "1"); err != nil {
		t.Errorf("carol's etcd put under app/: got = %v, expected: allowed", err)
	}
	if _, err := carol.Put(ctx, "other/x", "1"); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("carol's etcd put outside app/: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}
	if _, err := carol.UserAdd(ctx, "mallory", "pw"); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("carol adds a user: got = %v, expected: %v (only root manages users)", err, rpctypes.ErrGRPCPermissionDenied)
	}
	if _, err := carol.UserGet(ctx, "root"); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("carol reads root's roles: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}
	token := es.token(t, ctx, "carol", "carol-pw")
	if _, err := es.native(token).Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "app/y", Value: "2"})); err != nil {
		t.Errorf("carol's native put under app/ with her etcd token: got = %v, expected: allowed", err)
	}
	if _, err := es.native(token).Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "other/y", Value: "2"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("carol's native put outside app/: got = %v, expected: permission_denied", err)
	}
	if _, err := es.native(token).Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "open"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("carol's native read outside app/: got = %v, expected: permission_denied", err)
	}

	// A changed password ends carol's tokens, on both APIs.
	root := es.client(t, "root", "root-pw")
	_, err = root.UserChangePassword(ctx, "carol", "new-pw")
	must("change carol's password", err)
	if _, err := es.native(token).Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "app/z", Value: "3"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("carol's old token on the native API after the change: got = %v, expected: unauthenticated", err)
	}
	if _, err := anon.Authenticate(ctx, "carol", "carol-pw"); !isEtcdErr(err, rpctypes.ErrGRPCAuthFailed) {
		t.Errorf("carol's old password: got = %v, expected: %v", err, rpctypes.ErrGRPCAuthFailed)
	}
	carol = es.client(t, "carol", "new-pw")
	if _, err := carol.Get(ctx, "app/x"); err != nil {
		t.Errorf("carol's new password: got = %v, expected: allowed", err)
	}

	// A revoked role applies to the next call.
	_, err = root.UserRevokeRole(ctx, "carol", "app")
	must("revoke app", err)
	if _, err := carol.Get(ctx, "app/x"); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("carol's read after her role was revoked: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}

	st, err := root.AuthStatus(ctx)
	if err != nil || !st.Enabled || st.AuthRevision != 9 {
		t.Errorf("auth status: got = %v, %v, expected: enabled, auth revision 9", st, err)
	}
	// auth disable opens the node again, on both APIs.
	_, err = root.AuthDisable(ctx)
	must("auth disable", err)
	if _, err := anon.Put(ctx, "other/x", "1"); err != nil {
		t.Errorf("an anonymous etcd put after auth disable: got = %v, expected: open", err)
	}
	if _, err := es.native("").Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "other/y", Value: "1"})); err != nil {
		t.Errorf("an anonymous native put after auth disable: got = %v, expected: open", err)
	}
}

// TestThePolicyFileWinsOverEtcdUsers: with a policy file, a name the
// file defines cannot become an etcd user; the file's admin manages the
// store, and the store's users join the file's principals once enabled.
func TestThePolicyFileWinsOverEtcdUsers(t *testing.T) {
	t.Parallel()
	es := startEtcdAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := es.client(t, "admin", "admin-pw")
	if _, err := admin.UserAdd(ctx, "alice", "pw"); err == nil || !errors.Is(rpctypes.Error(err), rpctypes.ErrUserAlreadyExist) {
		t.Errorf("user add of the file's alice: got = %v, expected: user name already exists", err)
	}
	for _, step := range []func() error{
		func() error { _, err := admin.RoleAdd(ctx, "dave-role"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "dave-role", "dave/", clientv3.GetPrefixRangeEnd("dave/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "dave", "dave-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "dave", "dave-role"); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	// Not yet enabled: dave cannot log in, the file's users can.
	if _, err := es.client(t, "", "").Authenticate(ctx, "dave", "dave-pw"); !isEtcdErr(err, rpctypes.ErrGRPCAuthFailed) {
		t.Errorf("dave before auth enable: got = %v, expected: %v", err, rpctypes.ErrGRPCAuthFailed)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	dave := es.client(t, "dave", "dave-pw")
	if _, err := dave.Put(ctx, "dave/x", "1"); err != nil {
		t.Errorf("dave's put under dave/: got = %v, expected: allowed", err)
	}
	if _, err := dave.Put(ctx, "app/x", "1"); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("dave's put under app/: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}
	// The file's principals work as before.
	if _, err := es.client(t, "alice", "alice-pw").Put(ctx, "app/x", "1"); err != nil {
		t.Errorf("the file's alice after auth enable: got = %v, expected: allowed", err)
	}
}
