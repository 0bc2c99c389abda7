package etcdapi

import (
	"context"
	"errors"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

func TestUserAndRoleManagementPointsAtThePolicyFile(t *testing.T) {
	c := serve(t, threeNodes(t))
	ac := pb.NewAuthClient(c.ActiveConnection())
	policy := []string{"policy file", "docs/security.md"}
	calls := map[string]func(context.Context) error{
		"AuthEnable":  func(ctx context.Context) error { _, err := ac.AuthEnable(ctx, &pb.AuthEnableRequest{}); return err },
		"AuthDisable": func(ctx context.Context) error { _, err := ac.AuthDisable(ctx, &pb.AuthDisableRequest{}); return err },
		"UserAdd": func(ctx context.Context) error {
			_, err := ac.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "u", Password: "p"})
			return err
		},
		"UserGet": func(ctx context.Context) error {
			_, err := ac.UserGet(ctx, &pb.AuthUserGetRequest{Name: "u"})
			return err
		},
		"UserList": func(ctx context.Context) error { _, err := ac.UserList(ctx, &pb.AuthUserListRequest{}); return err },
		"UserDelete": func(ctx context.Context) error {
			_, err := ac.UserDelete(ctx, &pb.AuthUserDeleteRequest{Name: "u"})
			return err
		},
		"UserChangePassword": func(ctx context.Context) error {
			_, err := ac.UserChangePassword(ctx, &pb.AuthUserChangePasswordRequest{Name: "u"})
			return err
		},
		"UserGrantRole": func(ctx context.Context) error {
			_, err := ac.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "u", Role: "r"})
			return err
		},
		"UserRevokeRole": func(ctx context.Context) error {
			_, err := ac.UserRevokeRole(ctx, &pb.AuthUserRevokeRoleRequest{Name: "u", Role: "r"})
			return err
		},
		"RoleAdd": func(ctx context.Context) error {
			_, err := ac.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "r"})
			return err
		},
		"RoleGet": func(ctx context.Context) error {
			_, err := ac.RoleGet(ctx, &pb.AuthRoleGetRequest{Role: "r"})
			return err
		},
		"RoleList": func(ctx context.Context) error { _, err := ac.RoleList(ctx, &pb.AuthRoleListRequest{}); return err },
		"RoleDelete": func(ctx context.Context) error {
			_, err := ac.RoleDelete(ctx, &pb.AuthRoleDeleteRequest{Role: "r"})
			return err
		},
		"RoleGrantPermission": func(ctx context.Context) error {
			_, err := ac.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: "r"})
			return err
		},
		"RoleRevokePermission": func(ctx context.Context) error {
			_, err := ac.RoleRevokePermission(ctx, &pb.AuthRoleRevokePermissionRequest{Role: "r"})
			return err
		},
	}
	cases := map[string]unimplementedCase{}
	for name, call := range calls {
		cases[name] = unimplementedCase{call, append([]string{"Auth." + name}, policy...)}
	}
	checkUnimplemented(t, cases)
}
