package cli

import (
	"strings"
	"testing"
)

// A lease name with '/' is a usage error before anything is sent (the
// endpoint is dead, so reaching the network would exit 3): the server
// refuses it, and "prod/x" most likely means -n prod x.
func TestLeaseNameWithSlashIsAUsageError(t *testing.T) {
	dead := deadEndpoint(t)
	for _, args := range [][]string{
		{"get", "lease", "prod/scheduler"},
		{"validate", "prod/scheduler", "--token", "1"},
		{"revoke", "prod/scheduler"},
		{"lock", "prod/scheduler", "--", "true"},
		{"elect", "prod/scheduler", "--", "true"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, stderr, code := runMain(append(args, "--endpoints", dead)...)
			want := `lease name "prod/scheduler" may not contain '/': give the namespace with -n, e.g. -n prod scheduler`
			if code != ExitUsage || !strings.Contains(stderr, want) {
				t.Fatalf("got = exit %d, %q, expected: exit %d with %q", code, stderr, ExitUsage, want)
			}
		})
	}
}
