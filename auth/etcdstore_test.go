package auth_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tenurehq/tenure/auth"
)

// store is an etcd store with root (root role) and carol, whose role
// reads one key and writes [r/, r0).
func store(t *testing.T, enabled bool, carolPassword string) auth.EtcdStore {
	return auth.EtcdStore{
		Enabled: enabled,
		Users: []auth.EtcdUser{
			{Name: "root", PasswordBcrypt: bcryptHash(t, "rootpw"), Roles: []string{auth.EtcdRootRole}},
			{Name: "carol", PasswordBcrypt: bcryptHash(t, carolPassword), Roles: []string{"app"}},
			{Name: "alice", PasswordBcrypt: bcryptHash(t, "not the file's"), Roles: []string{auth.EtcdRootRole}},
		},
		Roles: map[string][]auth.EtcdPerm{"app": {
			{Read: true, Key: "one"},
			{Write: true, Key: "r/", End: "r0"},
		}},
	}
}

// TestEtcdUsersJoinThePolicy: while the store is enabled its users are
// principals with their roles' key ranges, exactly (one key is not a
// prefix); root is admin of everything; a name the file names stays the
// file's; a disabled store adds nobody.
func TestEtcdUsersJoinThePolicy(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, file := range []bool{false, true} {
		var base *auth.Policy
		if file {
			base = mustParse(t, etcdPolicy(bcryptHash(t, "alicepw")))
		}
		off := base.WithEtcd(store(t, false, "carolpw"))
		if off.InForce() != file || off.For("carol").Known() {
			t.Fatalf("file=%v, store disabled: got = in force %v, carol known %v, expected: in force only with a file, carol unknown", file, off.InForce(), off.For("carol").Known())
		}
		p := base.WithEtcd(store(t, true, "carolpw"))
		if !p.InForce() || !p.EtcdEnabled() {
			t.Fatalf("file=%v, store enabled: got = in force %v, expected: in force", file, p.InForce())
		}
		carol := p.For("carol")
		checks := []struct {
			what string
			got  bool
			want bool
		}{
			{"carol reads one", carol.Key(auth.Read, "one"), true},
			{"carol reads one/more (a key, not a prefix)", carol.Key(auth.Read, "one/more"), false},
			{"carol writes one", carol.Key(auth.Write, "one"), false},
			{"carol writes r/x", carol.Key(auth.Write, "r/x"), true},
			{"carol writes r0", carol.Key(auth.Write, "r0"), false},
			{"carol writes [r/a, r/b)", carol.KeyRange(auth.Write, "r/a", "r/b"), true},
			{"carol writes [r/a, s)", carol.KeyRange(auth.Write, "r/a", "s"), false},
			{"carol writes the prefix r/", carol.KeyPrefix(auth.Write, "r/"), true},
			{"carol writes the prefix r", carol.KeyPrefix(auth.Write, "r"), false},
			{"carol reads the prefix r/", carol.KeyPrefix(auth.Read, "r/"), false},
			{"carol holds leases", carol.AnyNamespace(auth.Lock), false},
			{"root writes every key", p.For("root").KeyRange(auth.Write, "\x00", "\x00"), true},
			{"root is cluster admin", p.For("root").ClusterAdmin(), true},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("file=%v: %s: got = %v, expected: %v", file, c.what, c.got, c.want)
			}
		}
		// alice is the file's when there is one: its grants, its password.
		alice := p.For("alice")
		if file && (alice.ClusterAdmin() || !alice.Key(auth.Write, "app/x")) || !file && !alice.ClusterAdmin() {
			t.Errorf("file=%v: alice got = admin %v, expected: the file's alice with a file, the store's root role without", file, alice.ClusterAdmin())
		}
		if file {
			if _, err := p.EtcdAuthenticate("alice", "not the file's", now); err == nil {
				t.Errorf("alice with the store's password: got = a token, expected: refused, the file's password counts")
			}
			if !p.FileNames("alice") || p.FileNames("carol") {
				t.Errorf("FileNames: got = alice %v carol %v, expected: true false", p.FileNames("alice"), p.FileNames("carol"))
			}
		}

		// A token works until the password changes, and the user goes.
		token, err := p.EtcdAuthenticate("carol", "carolpw", now)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := p.EtcdTokenPrincipal(token, now); err != nil || got != "carol" {
			t.Fatalf("carol's token: got = %q, %v, expected: carol", got, err)
		}
		changed := base.WithEtcd(store(t, true, "newpw"))
		if _, err := changed.EtcdTokenPrincipal(token, now); !errors.Is(err, auth.ErrInvalidToken) {
			t.Errorf("carol's token after a password change: got = %v, expected: %v", err, auth.ErrInvalidToken)
		}
		if _, err := off.EtcdTokenPrincipal(token, now); !errors.Is(err, auth.ErrInvalidToken) {
			t.Errorf("carol's token after auth disable: got = %v, expected: %v", err, auth.ErrInvalidToken)
		}
	}
}

// TestASourceFollowsTheStore: SetEtcd puts the store in force beside the
// file, and a reload of the file keeps it.
func TestASourceFollowsTheStore(t *testing.T) {
	src := auth.Static(nil)
	if src.Policy().InForce() {
		t.Fatal("no file, no store: got = in force, expected: open")
	}
	src.SetEtcd(store(t, true, "carolpw"))
	if !src.Policy().InForce() || !src.Policy().For("carol").Key(auth.Read, "one") {
		t.Fatal("store enabled: got = carol unknown, expected: carol reads one")
	}
	src.SetEtcd(store(t, false, "carolpw"))
	if src.Policy().InForce() {
		t.Fatal("store disabled again: got = in force, expected: open")
	}
}
