package server

import (
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/statemachine"
)

// noteEtcdAuth puts etcd's users and roles, as the state m now holds
// them, in force beside the policy file (auth.Policy.WithEtcd), when
// they changed since it last looked. It runs on the apply goroutine
// under the state write lock, after each command that changes them and
// after a restore, so every node judges a caller by the same users once
// it has applied the same entries.
func (s *Server) noteEtcdAuth(m *statemachine.Machine) {
	rev := m.AuthRevision()
	if s.etcdAuthRev.Swap(rev) == rev {
		return
	}
	st := auth.EtcdStore{Enabled: m.AuthEnabled(), Roles: map[string][]auth.EtcdPerm{}}
	for _, name := range m.AuthUsers() {
		u, _ := m.AuthUser(name)
		st.Users = append(st.Users, auth.EtcdUser{Name: u.Name, PasswordBcrypt: u.Password, Roles: u.Roles})
	}
	for _, name := range m.AuthRoles() {
		r, _ := m.AuthRole(name)
		perms := make([]auth.EtcdPerm, 0, len(r.Perms))
		for _, p := range r.Perms {
			perms = append(perms, auth.EtcdPerm{Read: p.Type.Reads(), Write: p.Type.Writes(), Key: p.Key, End: p.RangeEnd})
		}
		st.Roles[name] = perms
	}
	s.auth.authn.Policy.SetEtcd(st)
}
