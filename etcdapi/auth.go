package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// authServer serves Auth: Authenticate and AuthStatus. Tenure's users
// and roles live in its policy file (tenure serve --policy), which the
// operator replicates by putting the same file on every node: an etcd
// user is a principal with an etcd_password_bcrypt, and its roles are
// the principal's (docs/security.md, etcd users). So the user and role
// management RPCs, and AuthEnable and AuthDisable, answer Unimplemented
// and point at the policy file, rather than keep a second set of users
// that the policy would not know.
type authServer struct {
	b Backend
}

var _ pb.AuthServer = (*authServer)(nil)

func newAuth(b Backend) *authServer { return &authServer{b: b} }

// Authenticate checks a user's name and password and answers the token
// later calls send in their "token" metadata: etcd's errors for a wrong
// password (authentication failed) and without a policy (authentication
// is not enabled) come from the Backend.
func (s *authServer) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	token, err := s.b.Authenticate(ctx, r.Name, r.Password)
	if err != nil {
		return nil, toGRPC(err)
	}
	rev, err := currentRevision(ctx, s.b)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.AuthenticateResponse{Header: header(s.b, rev), Token: token}, nil
}

// AuthStatus says whether a policy is in force. Its auth revision is 0:
// the policy has no revision that clients could compare.
func (s *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	rev, err := currentRevision(ctx, s.b)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.AuthStatusResponse{Header: header(s.b, rev), Enabled: s.b.AuthEnabled()}, nil
}

// inPolicy answers a management RPC: users and roles are the policy
// file's.
func inPolicy(method string) error {
	return unimplemented("Auth."+method, "Tenure's users and roles live in its policy file (tenure serve --policy FILE, the same file on every node): an etcd user is a principal with an etcd_password_bcrypt, and its roles grant verbs on key prefixes; see docs/security.md, etcd users")
}

func (s *authServer) AuthEnable(context.Context, *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	return nil, inPolicy("AuthEnable")
}

func (s *authServer) AuthDisable(context.Context, *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return nil, inPolicy("AuthDisable")
}

func (s *authServer) UserAdd(context.Context, *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	return nil, inPolicy("UserAdd")
}

func (s *authServer) UserGet(context.Context, *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	return nil, inPolicy("UserGet")
}

func (s *authServer) UserList(context.Context, *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	return nil, inPolicy("UserList")
}

func (s *authServer) UserDelete(context.Context, *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	return nil, inPolicy("UserDelete")
}

func (s *authServer) UserChangePassword(context.Context, *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	return nil, inPolicy("UserChangePassword")
}

func (s *authServer) UserGrantRole(context.Context, *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	return nil, inPolicy("UserGrantRole")
}

func (s *authServer) UserRevokeRole(context.Context, *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	return nil, inPolicy("UserRevokeRole")
}

func (s *authServer) RoleAdd(context.Context, *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	return nil, inPolicy("RoleAdd")
}

func (s *authServer) RoleGet(context.Context, *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	return nil, inPolicy("RoleGet")
}

func (s *authServer) RoleList(context.Context, *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	return nil, inPolicy("RoleList")
}

func (s *authServer) RoleDelete(context.Context, *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	return nil, inPolicy("RoleDelete")
}

func (s *authServer) RoleGrantPermission(context.Context, *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	return nil, inPolicy("RoleGrantPermission")
}

func (s *authServer) RoleRevokePermission(context.Context, *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	return nil, inPolicy("RoleRevokePermission")
}
