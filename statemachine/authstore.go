package statemachine

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// The etcd auth store: etcd's users and roles, kept in the replicated
// state so that etcdctl's user, role and auth commands change every
// member at once, and a token is judged by the same users on every
// node. The rules are etcd 3.5's (server/auth/store.go): a user has a
// bcrypt hash of its password, or none (NoPassword: it logs in by
// client certificate only) and a sorted list of roles; a role grants
// READ, WRITE or READWRITE on key ranges; the role "root" grants
// everything and need not exist to be granted; auth is enabled only
// while the user "root" exists with the role "root", and while it is
// enabled "root" can be neither deleted nor stripped of "root". Each
// change raises the auth revision, which tokens are checked against.
//
// The store knows nothing of passwords: the edge hashes one with bcrypt
// before proposing, since a salt drawn at apply would differ between
// replicas. How the store combines with the policy file is the server's
// (docs/security.md, etcd users and roles).

// authVersion is the cluster version that runs the auth store.
const authVersion = 8

// The auth store's refusals. Their texts are etcd's, less the
// "etcdserver: " of etcd's wire errors, which the etcd API adds.
var (
	ErrAuthUserEmpty       = errors.New("user name is empty")
	ErrAuthUserExists      = errors.New("user name already exists")
	ErrAuthUserNotFound    = errors.New("user name not found")
	ErrAuthRoleEmpty       = errors.New("role name is empty")
	ErrAuthRoleExists      = errors.New("role name already exists")
	ErrAuthRoleNotFound    = errors.New("role name not found")
	ErrAuthRoleNotGranted  = errors.New("role is not granted to the user")
	ErrAuthPermNotGranted  = errors.New("permission is not granted to the role")
	ErrAuthPermNotGiven    = errors.New("permission not given")
	ErrAuthInvalidMgmt     = errors.New("invalid auth management")
	ErrAuthRootUserMissing = errors.New("root user does not exist")
	ErrAuthRootRoleMissing = errors.New("root user does not have root role")
	ErrAuthNoPassword      = errors.New("a user without a password must be added with no-password")
)

// RootUser and RootRole are etcd's: the user that must exist, with the
// role, before auth is enabled; the role grants everything.
const (
	RootUser = "root"
	RootRole = "root"
)

// PermType is what a permission grants, numbered as etcd's
// authpb.Permission_Type.
type PermType uint8

const (
	PermRead PermType = iota
	PermWrite
	PermReadWrite
)

func (p PermType) String() string {
	switch p {
	case PermRead:
		return "READ"
	case PermWrite:
		return "WRITE"
	case PermReadWrite:
		return "READWRITE"
	}
	return fmt.Sprintf("permission %d", uint8(p))
}

// Reads and Writes report what p allows.
func (p PermType) Reads() bool  { return p == PermRead || p == PermReadWrite }
func (p PermType) Writes() bool { return p == PermWrite || p == PermReadWrite }

// AuthPerm grants Type on [Key, RangeEnd): RangeEnd "" is Key alone,
// "\x00" every key from Key on, as etcd's ranges.
type AuthPerm struct {
	Type     PermType `json:"type"`
	Key      string   `json:"key"`
	RangeEnd string   `json:"range_end,omitempty"`
}

// AuthUser is an etcd user.
type AuthUser struct {
	Name string `json:"name"`
	// Password is the bcrypt hash of the password; empty with
	// NoPassword.
	Password   string   `json:"password,omitempty"`
	NoPassword bool     `json:"no_password,omitempty"`
	Roles      []string `json:"roles,omitempty"` // sorted
}

// AuthRole is an etcd role.
type AuthRole struct {
	Name  string     `json:"name"`
	Perms []AuthPerm `json:"perms,omitempty"` // sorted by Key, then RangeEnd
}

// AuthOp is what an AuthChange does.
type AuthOp uint8

const (
	AuthEnable AuthOp = iota + 1
	AuthDisable
	AuthUserAdd
	AuthUserDelete
	AuthUserChangePassword
	AuthUserGrantRole
	AuthUserRevokeRole
	AuthRoleAdd
	AuthRoleDelete
	AuthRoleGrantPermission
	AuthRoleRevokePermission
)

func (o AuthOp) String() string {
	names := [...]string{"", "AuthEnable", "AuthDisable", "UserAdd", "UserDelete", "UserChangePassword",
		"UserGrantRole", "UserRevokeRole", "RoleAdd", "RoleDelete", "RoleGrantPermission", "RoleRevokePermission"}
	if int(o) < len(names) && o != 0 {
		return names[o]
	}
	return fmt.Sprintf("auth op %d", uint8(o))
}

// AuthChange is one change to the auth store, as one of etcd's Auth
// RPCs makes it. It emits no event and leaves the revision alone; a
// change that changes something raises the auth revision.
type AuthChange struct {
	Op   AuthOp `json:"op"`
	User string `json:"user,omitempty"`
	Role string `json:"role,omitempty"`
	// Password is the bcrypt hash for UserAdd and UserChangePassword.
	Password   string `json:"password,omitempty"`
	NoPassword bool   `json:"no_password,omitempty"`
	// Perm is RoleGrantPermission's, and the range RoleRevokePermission
	// revokes.
	Perm AuthPerm `json:"perm,omitzero"`
}

// authStore is the store's state in the Machine.
type authStore struct {
	enabled  bool
	revision int64
	users    map[string]*AuthUser
	roles    map[string]*AuthRole
}

func newAuthStore() authStore {
	return authStore{users: map[string]*AuthUser{}, roles: map[string]*AuthRole{}}
}

// empty reports whether the store has never been used: a snapshot then
// leaves it out.
func (a *authStore) empty() bool {
	return !a.enabled && a.revision == 0 && len(a.users) == 0 && len(a.roles) == 0
}

func (m *Machine) authChange(c AuthChange) Result {
	if !m.atLeast(authVersion) {
		return Result{Err: fmt.Errorf("%w: etcd users and roles need cluster version %d", ErrNotSupported, authVersion)}
	}
	a := &m.auth
	changed, err := a.apply(c)
	if err != nil {
		return Result{Err: fmt.Errorf("%s: %w", c.Op, err)}
	}
	if !changed {
		return Result{}
	}
	a.revision++
	return Result{AuthRevision: a.revision}
}

// apply makes c's change, or refuses it having changed nothing, and
// reports whether the store changed (a role granted twice is not).
func (a *authStore) apply(c AuthChange) (bool, error) {
	switch c.Op {
	case AuthEnable:
		if a.enabled {
			return false, nil
		}
		u := a.users[RootUser]
		switch {
		case u == nil:
			return false, ErrAuthRootUserMissing
		case !slices.Contains(u.Roles, RootRole):
			return false, ErrAuthRootRoleMissing
		}
		a.enabled = true
	case AuthDisable:
		if !a.enabled {
			return false, nil
		}
		a.enabled = false
	case AuthUserAdd:
		switch {
		case c.User == "":
			return false, ErrAuthUserEmpty
		case a.users[c.User] != nil:
			return false, fmt.Errorf("%w: %q", ErrAuthUserExists, c.User)
		case !c.NoPassword && c.Password == "":
			return false, ErrAuthNoPassword
		}
		u := &AuthUser{Name: c.User, NoPassword: c.NoPassword}
		if !c.NoPassword {
			u.Password = c.Password
		}
		a.users[c.User] = u
	case AuthUserDelete:
		if a.enabled && c.User == RootUser {
			return false, fmt.Errorf("%w: the root user cannot be deleted while auth is enabled", ErrAuthInvalidMgmt)
		}
		if a.users[c.User] == nil {
			return false, fmt.Errorf("%w: %q", ErrAuthUserNotFound, c.User)
		}
		delete(a.users, c.User)
	case AuthUserChangePassword:
		u := a.users[c.User]
		switch {
		case u == nil:
			return false, fmt.Errorf("%w: %q", ErrAuthUserNotFound, c.User)
		case u.NoPassword:
			return true, nil // as etcd: nothing to change, the revision raised
		case c.Password == "":
			return false, ErrAuthNoPassword
		}
		u.Password = c.Password
	case AuthUserGrantRole:
		u := a.users[c.User]
		switch {
		case u == nil:
			return false, fmt.Errorf("%w: %q", ErrAuthUserNotFound, c.User)
		case c.Role != RootRole && a.roles[c.Role] == nil:
			return false, fmt.Errorf("%w: %q", ErrAuthRoleNotFound, c.Role)
		}
		i, found := slices.BinarySearch(u.Roles, c.Role)
		if found {
			return false, nil
		}
		u.Roles = slices.Insert(u.Roles, i, c.Role)
	case AuthUserRevokeRole:
		if a.enabled && c.User == RootUser && c.Role == RootRole {
			return false, fmt.Errorf("%w: the root user cannot lose the root role while auth is enabled", ErrAuthInvalidMgmt)
		}
		u := a.users[c.User]
		if u == nil {
			return false, fmt.Errorf("%w: %q", ErrAuthUserNotFound, c.User)
		}
		i, found := slices.BinarySearch(u.Roles, c.Role)
		if !found {
			return false, fmt.Errorf("%w: %q has no role %q", ErrAuthRoleNotGranted, c.User, c.Role)
		}
		u.Roles = slices.Delete(u.Roles, i, i+1)
	case AuthRoleAdd:
		switch {
		case c.Role == "":
			return false, ErrAuthRoleEmpty
		case a.roles[c.Role] != nil:
			return false, fmt.Errorf("%w: %q", ErrAuthRoleExists, c.Role)
		}
		a.roles[c.Role] = &AuthRole{Name: c.Role}
	case AuthRoleDelete:
		if a.enabled && c.Role == RootRole {
			return false, fmt.Errorf("%w: the root role cannot be deleted while auth is enabled", ErrAuthInvalidMgmt)
		}
		if a.roles[c.Role] == nil {
			return false, fmt.Errorf("%w: %q", ErrAuthRoleNotFound, c.Role)
		}
		delete(a.roles, c.Role)
		for _, u := range a.users {
			if i, found := slices.BinarySearch(u.Roles, c.Role); found {
				u.Roles = slices.Delete(u.Roles, i, i+1)
			}
		}
	case AuthRoleGrantPermission:
		r := a.roles[c.Role]
		switch {
		case r == nil:
			return false, fmt.Errorf("%w: %q", ErrAuthRoleNotFound, c.Role)
		case c.Perm.Type > PermReadWrite:
			return false, fmt.Errorf("%w: %v", ErrAuthInvalidMgmt, c.Perm.Type)
		case !validPermRange(c.Perm.Key, c.Perm.RangeEnd):
			return false, fmt.Errorf("%w: the range [%q, %q) is empty", ErrAuthInvalidMgmt, c.Perm.Key, c.Perm.RangeEnd)
		}
		i, found := slices.BinarySearchFunc(r.Perms, c.Perm, comparePermRange)
		if found {
			if r.Perms[i].Type == c.Perm.Type {
				return false, nil
			}
			r.Perms[i].Type = c.Perm.Type
		} else {
			r.Perms = slices.Insert(r.Perms, i, c.Perm)
		}
	case AuthRoleRevokePermission:
		r := a.roles[c.Role]
		if r == nil {
			return false, fmt.Errorf("%w: %q", ErrAuthRoleNotFound, c.Role)
		}
		i, found := slices.BinarySearchFunc(r.Perms, c.Perm, comparePermRange)
		if !found {
			return false, fmt.Errorf("%w: %q has no permission on [%q, %q)", ErrAuthPermNotGranted, c.Role, c.Perm.Key, c.Perm.RangeEnd)
		}
		r.Perms = slices.Delete(r.Perms, i, i+1)
	default:
		return false, fmt.Errorf("%w: %v", ErrNotSupported, c.Op)
	}
	return true, nil
}

// validPermRange is etcd's isValidPermissionRange: a key, or a range
// that is not empty ("\x00" as its end: every key from key on).
func validPermRange(key, end string) bool {
	return key != "" && (end == "" || end == "\x00" || key < end)
}

func comparePermRange(a, b AuthPerm) int {
	return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.RangeEnd, b.RangeEnd))
}

// AuthEnabled reports whether etcd's auth is enabled, and AuthRevision
// is the auth store's revision: raised by every change.
func (m *Machine) AuthEnabled() bool   { return m.auth.enabled }
func (m *Machine) AuthRevision() int64 { return m.auth.revision }

// AuthUser is the user name, a copy.
func (m *Machine) AuthUser(name string) (AuthUser, bool) {
	u := m.auth.users[name]
	if u == nil {
		return AuthUser{}, false
	}
	c := *u
	c.Roles = slices.Clone(u.Roles)
	return c, true
}

// AuthRole is the role name, a copy. The root role, which grants
// everything, exists only once added, as in etcd.
func (m *Machine) AuthRole(name string) (AuthRole, bool) {
	r := m.auth.roles[name]
	if r == nil {
		return AuthRole{}, false
	}
	return AuthRole{Name: r.Name, Perms: slices.Clone(r.Perms)}, true
}

// AuthUsers and AuthRoles list the names, sorted.
func (m *Machine) AuthUsers() []string { return slices.Sorted(maps.Keys(m.auth.users)) }
func (m *Machine) AuthRoles() []string { return slices.Sorted(maps.Keys(m.auth.roles)) }

// authSnapshot is the store as a snapshot keeps it.
type authSnapshot struct {
	Enabled  bool       `json:"enabled,omitempty"`
	Revision int64      `json:"revision,omitempty"`
	Users    []AuthUser `json:"users,omitempty"`
	Roles    []AuthRole `json:"roles,omitempty"`
}

func (a *authStore) snapshot() *authSnapshot {
	if a.empty() {
		return nil
	}
	s := &authSnapshot{Enabled: a.enabled, Revision: a.revision}
	for _, name := range slices.Sorted(maps.Keys(a.users)) {
		u := *a.users[name]
		u.Roles = slices.Clone(u.Roles)
		s.Users = append(s.Users, u)
	}
	for _, name := range slices.Sorted(maps.Keys(a.roles)) {
		r := a.roles[name]
		s.Roles = append(s.Roles, AuthRole{Name: r.Name, Perms: slices.Clone(r.Perms)})
	}
	return s
}

func (s *authSnapshot) restore() authStore {
	a := newAuthStore()
	if s == nil {
		return a
	}
	a.enabled, a.revision = s.Enabled, s.Revision
	for _, u := range s.Users {
		u.Roles = slices.Clone(u.Roles)
		a.users[u.Name] = &u
	}
	for _, r := range s.Roles {
		a.roles[r.Name] = &AuthRole{Name: r.Name, Perms: slices.Clone(r.Perms)}
	}
	return a
}

func encodeAuthPerm(e *encoder, p *AuthPerm) {
	e.uint(uint64(p.Type))
	e.str(p.Key)
	e.str(p.RangeEnd)
}

func decodeAuthPerm(d *decoder, p *AuthPerm) {
	*p = AuthPerm{Type: PermType(d.small()), Key: d.str(), RangeEnd: d.str()}
}

func (s *authSnapshot) encode(e *encoder) {
	e.bool(s.Enabled)
	e.int(s.Revision)
	encodeSlice(e, s.Users, func(e *encoder, u *AuthUser) {
		e.str(u.Name)
		e.str(u.Password)
		e.bool(u.NoPassword)
		e.strs(u.Roles)
	})
	encodeSlice(e, s.Roles, func(e *encoder, r *AuthRole) {
		e.str(r.Name)
		encodeSlice(e, r.Perms, encodeAuthPerm)
	})
}

func (s *authSnapshot) decode(d *decoder) {
	s.Enabled, s.Revision = d.bool(), d.int()
	s.Users = decodeSlice(d, func(d *decoder, u *AuthUser) {
		*u = AuthUser{Name: d.str(), Password: d.str(), NoPassword: d.bool(), Roles: d.strs()}
	})
	s.Roles = decodeSlice(d, func(d *decoder, r *AuthRole) {
		*r = AuthRole{Name: d.str(), Perms: decodeSlice(d, decodeAuthPerm)}
	})
}
