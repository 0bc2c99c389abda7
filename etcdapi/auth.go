package etcdapi

import (
	"context"
	"encoding/base64"
	"fmt"

	"github.com/tenurehq/tenure/statemachine"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// authServer serves Auth as etcd 3.5 does. etcd's users and roles live
// in the replicated state (statemachine's auth store, AuthChange), so
// etcdctl's user, role and auth commands change every member at once;
// the server puts them in force beside the policy file, which wins for
// the names it defines (auth.Policy.WithEtcd, docs/security.md). A
// password is hashed here, with bcrypt at etcd's default cost, before
// it is proposed: a salt drawn at apply would differ between replicas.
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

// AuthStatus says whether a policy is in force (a policy file, or the
// store enabled) and the store's auth revision, raised by every change.
func (s *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	var rev, authRev int64
	err := s.b.Read(ctx, true, func(m *statemachine.Machine) error {
		rev, authRev = m.KVRevision(), m.AuthRevision()
		return nil
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.AuthStatusResponse{Header: header(s.b, rev), Enabled: s.b.AuthEnabled(), AuthRevision: uint64(authRev)}, nil
}

// change proposes one change to the store and answers its header.
func (s *authServer) change(ctx context.Context, c statemachine.AuthChange) (*pb.ResponseHeader, error) {
	if _, err := s.b.Propose(ctx, c); err != nil {
		return nil, toGRPC(err)
	}
	rev, err := currentRevision(ctx, s.b)
	if err != nil {
		return nil, toGRPC(err)
	}
	return header(s.b, rev), nil
}

// read runs fn on the store, linearizably, and answers the header.
func (s *authServer) read(ctx context.Context, fn func(m *statemachine.Machine) error) (*pb.ResponseHeader, error) {
	var rev int64
	err := s.b.Read(ctx, false, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		return fn(m)
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return header(s.b, rev), nil
}

// passwordHash is the hash the store keeps for a request's password: a
// given hashedPassword (base64, as etcd 3.5 logs it) if it is bcrypt,
// else the bcrypt of the password, which may be empty, as in etcd.
func passwordHash(cost int, password, hashed string) (string, error) {
	if hashed != "" {
		h, err := base64.StdEncoding.DecodeString(hashed)
		if err == nil {
			_, err = bcrypt.Cost(h)
		}
		if err != nil {
			return "", status.Errorf(codes.InvalidArgument, "etcdserver: hashedPassword is not a base64 bcrypt hash: %v", err)
		}
		return string(h), nil
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "etcdserver: %v", err)
	}
	return string(h), nil
}

func (s *authServer) AuthEnable(ctx context.Context, r *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthEnable})
	if err != nil {
		return nil, err
	}
	return &pb.AuthEnableResponse{Header: h}, nil
}

func (s *authServer) AuthDisable(ctx context.Context, r *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthDisable})
	if err != nil {
		return nil, err
	}
	return &pb.AuthDisableResponse{Header: h}, nil
}

// UserAdd adds a user, unless the policy file defines a principal of
// that name: the file wins, and a second user of its name would only
// mislead. That is answered as etcd answers a name it has: clients
// match the text.
func (s *authServer) UserAdd(ctx context.Context, r *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	if r.Name == "" {
		return nil, rpctypes.ErrGRPCUserEmpty
	}
	if s.b.PolicyFileNames(r.Name) {
		return nil, rpctypes.ErrGRPCUserAlreadyExist
	}
	c := statemachine.AuthChange{Op: statemachine.AuthUserAdd, User: r.Name, NoPassword: r.Options != nil && r.Options.NoPassword}
	if !c.NoPassword {
		var err error
		if c.Password, err = passwordHash(s.b.BcryptCost(), r.Password, r.HashedPassword); err != nil {
			return nil, err
		}
	}
	h, err := s.change(ctx, c)
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserAddResponse{Header: h}, nil
}

func (s *authServer) UserGet(ctx context.Context, r *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	var roles []string
	h, err := s.read(ctx, func(m *statemachine.Machine) error {
		u, ok := m.AuthUser(r.Name)
		if !ok {
			return fmt.Errorf("%w: %q", statemachine.ErrAuthUserNotFound, r.Name)
		}
		roles = u.Roles
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserGetResponse{Header: h, Roles: roles}, nil
}

func (s *authServer) UserList(ctx context.Context, r *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	var users []string
	h, err := s.read(ctx, func(m *statemachine.Machine) error {
		users = m.AuthUsers()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserListResponse{Header: h, Users: users}, nil
}

func (s *authServer) UserDelete(ctx context.Context, r *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthUserDelete, User: r.Name})
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserDeleteResponse{Header: h}, nil
}

// UserChangePassword ends the user's tokens: each is keyed by the hash
// it replaces.
func (s *authServer) UserChangePassword(ctx context.Context, r *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	hash, err := passwordHash(s.b.BcryptCost(), r.Password, r.HashedPassword)
	if err != nil {
		return nil, err
	}
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthUserChangePassword, User: r.Name, Password: hash})
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserChangePasswordResponse{Header: h}, nil
}

func (s *authServer) UserGrantRole(ctx context.Context, r *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthUserGrantRole, User: r.User, Role: r.Role})
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserGrantRoleResponse{Header: h}, nil
}

func (s *authServer) UserRevokeRole(ctx context.Context, r *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthUserRevokeRole, User: r.Name, Role: r.Role})
	if err != nil {
		return nil, err
	}
	return &pb.AuthUserRevokeRoleResponse{Header: h}, nil
}

func (s *authServer) RoleAdd(ctx context.Context, r *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthRoleAdd, Role: r.Name})
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleAddResponse{Header: h}, nil
}

func (s *authServer) RoleGet(ctx context.Context, r *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	var perms []*authpb.Permission
	h, err := s.read(ctx, func(m *statemachine.Machine) error {
		role, ok := m.AuthRole(r.Role)
		if !ok {
			return fmt.Errorf("%w: %q", statemachine.ErrAuthRoleNotFound, r.Role)
		}
		for _, p := range role.Perms {
			perm := &authpb.Permission{PermType: authpb.Permission_Type(p.Type), Key: []byte(p.Key)}
			if p.RangeEnd != "" {
				perm.RangeEnd = []byte(p.RangeEnd)
			}
			perms = append(perms, perm)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleGetResponse{Header: h, Perm: perms}, nil
}

func (s *authServer) RoleList(ctx context.Context, r *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	var roles []string
	h, err := s.read(ctx, func(m *statemachine.Machine) error {
		roles = m.AuthRoles()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleListResponse{Header: h, Roles: roles}, nil
}

func (s *authServer) RoleDelete(ctx context.Context, r *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	h, err := s.change(ctx, statemachine.AuthChange{Op: statemachine.AuthRoleDelete, Role: r.Role})
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleDeleteResponse{Header: h}, nil
}

func (s *authServer) RoleGrantPermission(ctx context.Context, r *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	if r.Perm == nil {
		return nil, rpctypes.ErrGRPCPermissionNotGiven
	}
	c := statemachine.AuthChange{Op: statemachine.AuthRoleGrantPermission, Role: r.Name,
		Perm: statemachine.AuthPerm{Type: statemachine.PermType(r.Perm.PermType), Key: string(r.Perm.Key), RangeEnd: string(r.Perm.RangeEnd)}}
	if r.Perm.PermType < 0 || r.Perm.PermType > authpb.READWRITE {
		return nil, rpctypes.ErrGRPCInvalidAuthMgmt
	}
	h, err := s.change(ctx, c)
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleGrantPermissionResponse{Header: h}, nil
}

func (s *authServer) RoleRevokePermission(ctx context.Context, r *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	c := statemachine.AuthChange{Op: statemachine.AuthRoleRevokePermission, Role: r.Role,
		Perm: statemachine.AuthPerm{Key: string(r.Key), RangeEnd: string(r.RangeEnd)}}
	h, err := s.change(ctx, c)
	if err != nil {
		return nil, err
	}
	return &pb.AuthRoleRevokePermissionResponse{Header: h}, nil
}
