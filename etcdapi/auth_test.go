package etcdapi

import (
	"context"
	"errors"
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestAuthenticateAnswersTheBackendsTokenOrEtcdsError(t *testing.T) {
	ctx := context.Background()

	// Without a policy: etcd's "authentication is not enabled".
	off := serve(t, threeNodes(t))
	if _, err := off.Authenticate(ctx, "alice", "pw"); !errors.Is(rpctypes.Error(err), rpctypes.ErrAuthNotEnabled) {
		t.Errorf("Authenticate without a policy: got = %v, expected: %v", err, rpctypes.ErrAuthNotEnabled)
	}
	st, err := off.AuthStatus(ctx)
	if err != nil || st.Enabled {
		t.Errorf("AuthStatus without a policy: got = %v, %v, expected: not enabled", st, err)
	}

	b := threeNodes(t)
	b.authenticate = func(name, password string) (string, error) {
		if name == "alice" && password == "pw" {
			return "tok", nil
		}
		return "", rpctypes.ErrGRPCAuthFailed
	}
	on := serve(t, b)
	resp, err := on.Authenticate(ctx, "alice", "pw")
	if err != nil || resp.Token != "tok" || resp.Header.MemberId != 2 {
		t.Errorf("Authenticate: got = %v, %v, expected: token tok and member 2's header", resp, err)
	}
	if _, err := on.Authenticate(ctx, "alice", "wrong"); !errors.Is(rpctypes.Error(err), rpctypes.ErrAuthFailed) {
		t.Errorf("Authenticate with a wrong password: got = %v, expected: %v", err, rpctypes.ErrAuthFailed)
	}
	st, err = on.AuthStatus(ctx)
	if err != nil || !st.Enabled || st.Header.MemberId != 2 {
		t.Errorf("AuthStatus with a policy: got = %v, %v, expected: enabled", st, err)
	}
}

// TestTheUserAndRoleRunbookAnswersAsEtcd runs etcd's runbook (role
// add, grant-permission, user add, grant-role, auth enable) through the
// Auth service, each refusal in etcd's words, and reads it all back.
func TestTheUserAndRoleRunbookAnswersAsEtcd(t *testing.T) {
	c := serve(t, threeNodes(t))
	ctx := context.Background()
	wantErr := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(rpctypes.Error(err), rpctypes.Error(want)) {
			t.Errorf("%s: got = %v, expected: %v", what, err, want)
		}
	}
	_, err := c.AuthEnable(ctx)
	wantErr("auth enable without root", err, rpctypes.ErrGRPCRootUserNotExist)
	if _, err := c.RoleAdd(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	_, err = c.RoleAdd(ctx, "app")
	wantErr("role add twice", err, rpctypes.ErrGRPCRoleAlreadyExist)
	if _, err := c.RoleGrantPermission(ctx, "app", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RoleGrantPermission(ctx, "app", "\xff\x00", "", clientv3.PermissionType(clientv3.PermRead)); err != nil {
		t.Fatal(err)
	}
	_, err = c.RoleGrantPermission(ctx, "app", "b", "a", clientv3.PermissionType(clientv3.PermRead))
	wantErr("an empty range", err, rpctypes.ErrGRPCInvalidAuthMgmt)
	if _, err := c.UserAdd(ctx, "root", "rootpw"); err != nil {
		t.Fatal(err)
	}
	_, err = c.UserAdd(ctx, "", "pw")
	wantErr("user add without a name", err, rpctypes.ErrGRPCUserEmpty)
	if _, err := c.UserAddWithOptions(ctx, "svc", "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	_, err = c.AuthEnable(ctx)
	wantErr("auth enable before root has the root role", err, rpctypes.ErrGRPCRootRoleNotExist)
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UserGrantRole(ctx, "svc", "app"); err != nil {
		t.Fatal(err)
	}
	_, err = c.UserGrantRole(ctx, "svc", "none")
	wantErr("grant a role that does not exist", err, rpctypes.ErrGRPCRoleNotFound)
	_, err = c.UserRevokeRole(ctx, "svc", "other")
	wantErr("revoke a role not granted", err, rpctypes.ErrGRPCRoleNotGranted)
	_, err = c.RoleRevokePermission(ctx, "app", "zz", "")
	wantErr("revoke a permission not granted", err, rpctypes.ErrGRPCPermissionNotGranted)
	if _, err := c.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.UserDelete(ctx, "root")
	wantErr("delete root while enabled", err, rpctypes.ErrGRPCInvalidAuthMgmt)

	users, err := c.UserList(ctx)
	if err != nil || !slices.Equal(users.Users, []string{"root", "svc"}) {
		t.Errorf("user list: got = %v, %v, expected: [root svc]", users, err)
	}
	svc, err := c.UserGet(ctx, "svc")
	if err != nil || !slices.Equal(svc.Roles, []string{"app"}) {
		t.Errorf("user get svc: got = %v, %v, expected: roles [app]", svc, err)
	}
	_, err = c.UserGet(ctx, "ghost")
	wantErr("user get of nobody", err, rpctypes.ErrGRPCUserNotFound)
	app, err := c.RoleGet(ctx, "app")
	if err != nil || len(app.Perm) != 2 || string(app.Perm[0].Key) != "app/" || string(app.Perm[0].RangeEnd) != "app0" ||
		app.Perm[0].PermType != authpb.READWRITE || string(app.Perm[1].Key) != "\xff\x00" || len(app.Perm[1].RangeEnd) != 0 {
		t.Errorf("role get app: got = %v, %v, expected: READWRITE [app/, app0) and READ \\xff\\x00", app, err)
	}
	st, err := c.AuthStatus(ctx)
	if err != nil || st.AuthRevision != 8 {
		t.Errorf("auth status: got = %v, %v, expected: auth revision 8 (one per change)", st, err)
	}
	// The fake has no policy: a change puts nothing in force here; the
	// server's tests check that it does.
}
