package cli

import (
	"strings"
	"testing"

	"github.com/tenurehq/tenure/internal/testserver"
)

// A bad argument exits 2 whoever finds it: the CLI before sending
// anything, or the server, whose refusal (InvalidArgument) names the
// problem. Either way the message is the problem alone, without an RPC
// name or a prefix that repeats it.
func TestMainBadArgumentsExit2(t *testing.T) {
	addr := testserver.Start(t, testserver.Limits())
	const badNamespace = `namespace "Bad" must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit`
	tests := []struct {
		name   string
		args   []string
		stderr string // all of stderr after "Error: ", or a part of it with contains
		exact  bool
	}{
		{"an empty lease name, found by the server",
			[]string{"lock", "", "--", "true"}, "name is empty", true},
		{"an empty lease name to get",
			[]string{"get", "lease", ""}, "name is empty", true},
		{"an empty key",
			[]string{"kv", "get", ""}, "key is empty", true},
		{"a namespace that is not a DNS label, to lock in",
			[]string{"lock", "-n", "Bad", "x", "--", "true"}, badNamespace, true},
		{"a namespace that is not a DNS label, to list",
			[]string{"get", "leases", "-n", "Bad"}, badNamespace, true},
		{"a namespace that is not a DNS label, to validate in",
			[]string{"validate", "-n", "Bad", "x", "--token", "1"}, badNamespace, true},
		{"a namespace that is not a DNS label, to revoke in",
			[]string{"revoke", "-n", "Bad", "x"}, badNamespace, true},
		{"a namespace that is not a DNS label, to watch",
			[]string{"watch", "-n", "Bad"}, badNamespace, true},
		{"a namespace that is not a DNS label, to campaign in once",
			[]string{"elect", "-n", "Bad", "x", "--", "true"}, badNamespace, true},
		{"a namespace that is not a DNS label, to campaign in with --retry, which would otherwise retry forever",
			[]string{"elect", "-n", "Bad", "x", "--retry", "--", "true"}, badNamespace, true},
		{"a namespace that is not a DNS label, to observe, which would otherwise wait forever",
			[]string{"elect", "-n", "Bad", "x", "--observe"}, badNamespace, true},
		{"a namespace that is not a DNS label, to ask for the leader",
			[]string{"elect", "-n", "Bad", "x", "--leader"}, badNamespace, true},
		{"a session TTL over the server's maximum",
			[]string{"lock", "--ttl", "48h", "x", "--", "true"}, "ttl 48h0m0s is outside 100ms..24h0m0s (--min-ttl, --max-ttl)", true},
		{"a session TTL over the server's maximum, to campaign",
			[]string{"elect", "--ttl", "48h", "x", "--", "true"}, "ttl 48h0m0s is outside", false},
		{"a key TTL over the server's maximum",
			[]string{"kv", "put", "k", "v", "--ttl", "48h"}, "ttl 48h0m0s is outside", false},
		{"a label selector the server cannot parse, for leases",
			[]string{"get", "leases", "-l", "!!!"}, `label selector "!!!"`, false},
		{"a label selector the server cannot parse, for sessions",
			[]string{"get", "sessions", "-l", "!!!"}, `label selector "!!!"`, false},
		{"a capacity over the server's maximum",
			[]string{"lock", "--capacity", "100000", "x", "--", "true"}, "capacity 100000 is outside 1..10000", true},
		{"a negative --wait, which used to mean forever",
			[]string{"lock", "--wait", "-1s", "x", "--", "true"}, "--wait -1s must not be negative", true},
		{"a negative --timeout",
			[]string{"--timeout", "-1s", "kv", "get", "k"}, "--timeout -1s must not be negative", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runMain(append([]string{"--endpoints", addr}, tt.args...)...)
			if code != ExitUsage {
				t.Errorf("tenure %q: exit code got = %d, expected: %d (stderr %q)", tt.args, code, ExitUsage, stderr)
			}
			want := "Error: " + tt.stderr + "\n"
			if tt.exact && stderr != want || !tt.exact && (!strings.HasPrefix(stderr, "Error: ") || !strings.Contains(stderr, tt.stderr)) {
				t.Errorf("tenure %q: stderr got = %q, expected: %q", tt.args, stderr, want)
			}
			if stdout != "" {
				t.Errorf("tenure %q: stdout got = %q, expected: nothing", tt.args, stdout)
			}
		})
	}
}
