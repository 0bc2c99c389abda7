package statemachine

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// authOp is one step of an auth store scenario: the change, and the
// error it must meet (nil: applied).
type authOp struct {
	c    AuthChange
	want error
}

func userAdd(name, hash string) AuthChange {
	return AuthChange{Op: AuthUserAdd, User: name, Password: hash}
}
func grantRole(user, role string) AuthChange {
	return AuthChange{Op: AuthUserGrantRole, User: user, Role: role}
}
func grantPerm(role string, t PermType, key, end string) AuthChange {
	return AuthChange{Op: AuthRoleGrantPermission, Role: role, Perm: AuthPerm{Type: t, Key: key, RangeEnd: end}}
}

// TestTheAuthStoreKeepsEtcdsRules runs etcd 3.5's rules (server/auth
// store.go) one change at a time: each refusal changes nothing, not
// even the auth revision, and each change raises it once.
func TestTheAuthStoreKeepsEtcdsRules(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: Version})
	steps := []authOp{
		{AuthChange{Op: AuthEnable}, ErrAuthRootUserMissing},
		{userAdd("", "h"), ErrAuthUserEmpty},
		{userAdd("root", ""), ErrAuthNoPassword},
		{userAdd("root", "$2a$10$root"), nil},
		{userAdd("root", "$2a$10$again"), ErrAuthUserExists},
		{AuthChange{Op: AuthEnable}, ErrAuthRootRoleMissing},
		{grantRole("root", "admin"), ErrAuthRoleNotFound},
		// The root role need not exist to be granted.
		{grantRole("root", RootRole), nil},
		{grantRole("root", RootRole), nil}, // again: no change
		{AuthChange{Op: AuthRoleAdd}, ErrAuthRoleEmpty},
		{AuthChange{Op: AuthRoleAdd, Role: "app"}, nil},
		{AuthChange{Op: AuthRoleAdd, Role: "app"}, ErrAuthRoleExists},
		{grantPerm("app", PermRead, "a/", "a0"), nil},
		{grantPerm("app", PermReadWrite, "a/", "a0"), nil}, // the same range: its type changes
		{grantPerm("app", PermWrite, "\xff\x00", ""), nil},
		{grantPerm("app", PermRead, "b", "a"), ErrAuthInvalidMgmt},
		{grantPerm("app", PermRead, "", ""), ErrAuthInvalidMgmt},
		{grantPerm("app", PermType(7), "c", ""), ErrAuthInvalidMgmt},
		{grantPerm("none", PermRead, "c", ""), ErrAuthRoleNotFound},
		{AuthChange{Op: AuthUserAdd, User: "svc", NoPassword: true}, nil},
		{grantRole("svc", "app"), nil},
		{grantRole("ghost", "app"), ErrAuthUserNotFound},
		{AuthChange{Op: AuthEnable}, nil},
		{AuthChange{Op: AuthEnable}, nil}, // again: no change
		{AuthChange{Op: AuthUserDelete, User: "root"}, ErrAuthInvalidMgmt},
		{AuthChange{Op: AuthUserRevokeRole, User: "root", Role: RootRole}, ErrAuthInvalidMgmt},
		{AuthChange{Op: AuthRoleDelete, Role: RootRole}, ErrAuthInvalidMgmt},
		{AuthChange{Op: AuthUserRevokeRole, User: "svc", Role: "other"}, ErrAuthRoleNotGranted},
		{AuthChange{Op: AuthRoleRevokePermission, Role: "app", Perm: AuthPerm{Key: "zz"}}, ErrAuthPermNotGranted},
		{AuthChange{Op: AuthUserChangePassword, User: "root", Password: "$2a$10$new"}, nil},
		{AuthChange{Op: AuthUserChangePassword, User: "root"}, ErrAuthNoPassword},
		{AuthChange{Op: AuthUserChangePassword, User: "ghost", Password: "h"}, ErrAuthUserNotFound},
	}
	changes := 0
	for i, s := range steps {
		before, rev := snapshotBytes(t, m), m.AuthRevision()
		res := m.Apply(int64(i+2), s.c)
		switch {
		case s.want == nil && res.Err != nil:
			t.Fatalf("step %d %v: got = %v, expected: applied", i, s.c.Op, res.Err)
		case s.want != nil && !errors.Is(res.Err, s.want):
			t.Fatalf("step %d %v: got = %v, expected: %v", i, s.c.Op, res.Err, s.want)
		case s.want != nil:
			expect(t, fmt.Sprintf("step %d: the state after a refused %v", i, s.c.Op), snapshotBytes(t, m), before)
		case m.AuthRevision() > rev:
			changes++
		}
		if len(res.Events) != 0 {
			t.Fatalf("step %d %v: got = %d events, expected: none", i, s.c.Op, len(res.Events))
		}
	}
	expect(t, "auth revision", m.AuthRevision(), int64(changes))
	expect(t, "changes", changes, 10)
	expect(t, "enabled", m.AuthEnabled(), true)
	expect(t, "users", m.AuthUsers(), []string{"root", "svc"})
	root, _ := m.AuthUser("root")
	expect(t, "root", root, AuthUser{Name: "root", Password: "$2a$10$new", Roles: []string{"root"}})
	app, _ := m.AuthRole("app")
	expect(t, "app's permissions, by key", app.Perms, []AuthPerm{
		{Type: PermReadWrite, Key: "a/", RangeEnd: "a0"},
		{Type: PermWrite, Key: "\xff\x00"},
	})

	// Deleting a role takes it from its users; disabling lets root go.
	applyOK(t, m, 100, AuthChange{Op: AuthRoleDelete, Role: "app"})
	svc, _ := m.AuthUser("svc")
	expect(t, "svc's roles after app's deletion", len(svc.Roles), 0)
	applyOK(t, m, 101, AuthChange{Op: AuthDisable})
	applyOK(t, m, 102, AuthChange{Op: AuthUserDelete, User: "root"})
	expect(t, "users", m.AuthUsers(), []string{"svc"})
}

// TestTheAuthStoreSurvivesASnapshot: users, roles, the flag and the
// revision come back byte for byte, with alarms raised or not.
func TestTheAuthStoreSurvivesASnapshot(t *testing.T) {
	for _, alarm := range []bool{false, true} {
		t.Run(fmt.Sprintf("alarm=%v", alarm), func(t *testing.T) {
			m := New()
			applyOK(t, m, 1, SetVersion{Version: Version})
			applyOK(t, m, 2, userAdd("root", "$2a$10$x"))
			applyOK(t, m, 3, grantRole("root", RootRole))
			applyOK(t, m, 4, AuthChange{Op: AuthRoleAdd, Role: "r\xff"})
			applyOK(t, m, 5, grantPerm("r\xff", PermRead, "\x00", "\x00"))
			applyOK(t, m, 6, AuthChange{Op: AuthEnable})
			if alarm {
				applyOK(t, m, 7, SetAlarm{Member: "n1", Alarm: AlarmNoSpace, Active: true})
			}
			snap := snapshotBytes(t, m)
			r := New()
			if err := r.Restore(bytes.NewReader(snap)); err != nil {
				t.Fatal(err)
			}
			expect(t, "the snapshot of the restored state", snapshotBytes(t, r), snap)
			expect(t, "enabled", r.AuthEnabled(), true)
			expect(t, "revision", r.AuthRevision(), int64(5))
			role, _ := r.AuthRole("r\xff")
			expect(t, "role", role, AuthRole{Name: "r\xff", Perms: []AuthPerm{{Type: PermRead, Key: "\x00", RangeEnd: "\x00"}}})
			expect(t, "alarms", len(r.Alarms()), map[bool]int{false: 0, true: 1}[alarm])
		})
	}
}

func TestTheAuthStoreWaitsForItsClusterVersion(t *testing.T) {
	m := New()
	applyOK(t, m, 1, SetVersion{Version: authVersion - 1})
	before := snapshotBytes(t, m)
	if res := m.Apply(2, userAdd("root", "h")); !errors.Is(res.Err, ErrNotSupported) {
		t.Fatalf("UserAdd at version %d: got = %v, expected: %v", authVersion-1, res.Err, ErrNotSupported)
	}
	expect(t, "state", snapshotBytes(t, m), before)
	applyOK(t, m, 3, SetVersion{Version: authVersion})
	applyOK(t, m, 4, userAdd("root", "h"))
}
