package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// --enable-pprof serves Go's profiles to an admin only; without it there
// is nothing at /debug/pprof/ for anyone.
func TestProfilesAreServedOnlyWhenEnabledAndOnlyToAnAdmin(t *testing.T) {
	t.Parallel()
	on := startAuthServer(t, func(c *Config) { c.Pprof = true })
	off := startAuthServer(t)
	for _, tc := range []struct {
		name        string
		as          *authServer
		credentials string
		want        int
	}{
		{"an admin reads them", on, "token:admin", http.StatusOK},
		{"a reader of every namespace may not", on, "token:reader", http.StatusForbidden},
		{"a team may not", on, "token:team-a", http.StatusForbidden},
		{"an unknown token may not", on, "token:nobody", http.StatusUnauthorized},
		{"nobody without credentials", on, "", http.StatusUnauthorized},
		{"not even an admin when they are off", off, "token:admin", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
				resp, err := tc.as.http(t, tc.credentials).Get(tc.as.url + path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Errorf("GET %s: got = %d %.200s, expected: %d", path, resp.StatusCode, body, tc.want)
				}
			}
		})
	}
}

// Profiles follow the policy as it is now: an admin demoted by a reload
// is refused on its next request, with the token it used a moment ago.
func TestProfilesAreRefusedOnceTheAdminRoleIsRevoked(t *testing.T) {
	t.Parallel()
	as := startAuthServer(t, func(c *Config) { c.Pprof = true })
	get := func() int {
		resp, err := as.http(t, "token:admin").Get(as.url + "/debug/pprof/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != http.StatusOK {
		t.Fatalf("got = %d before the reload, expected: 200", got)
	}
	demoted := strings.Replace(testPolicy, "- name: admin\n    roles: [admin]", "- name: admin\n    roles: [reader]", 1)
	if demoted == testPolicy {
		t.Fatal("the test policy no longer names the admin's role as this test expects")
	}
	writePolicy(t, as.policy.Path(), as.tokens, demoted)
	if err := as.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != http.StatusForbidden {
		t.Fatalf("got = %d after the admin role was taken away, expected: 403", got)
	}
}
