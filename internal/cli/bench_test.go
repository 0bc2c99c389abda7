package cli

import (
	"strings"
	"testing"
)

// Every case here fails before any server is started.
func TestBenchUsageErrors(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"an unknown system to compare with",
			[]string{"bench", "--against", "consul"}, `--against "consul": only "etcd" is known`},
		{"--short is Tenure only",
			[]string{"bench", "--short", "--against", "etcd"}, "--short runs Tenure only"},
		{"an unknown workload",
			[]string{"bench", "--workloads", "1,99"}, `unknown workload "99"`},
		{"no rounds",
			[]string{"bench", "--rounds", "0"}, "--rounds 0 must be at least 1"},
		{"no time",
			[]string{"bench", "--duration", "0s"}, "--duration 0s must be positive"},
		{"an unknown client",
			[]string{"bench", "--client", "grpcurl"}, `--client grpcurl: client "grpcurl": only "tenure" and "etcd" are known`},
		{"a workload with no etcd-client form",
			[]string{"bench", "--client", "etcd", "--workloads", "1,memory"}, "--client etcd: workload 8 memory: not run through etcd's client, which runs 1 one-client,"},
		{"a negative round trip",
			[]string{"bench", "--peer-rtt", "-1ms"}, "--peer-rtt -1ms must not be negative"},
		{"a sync delay asked of a binary that cannot add it",
			[]string{"bench", "--sync-delay", "1ms"}, "not built with -tags benchsync"},
		{"growth steps that shrink",
			[]string{"bench", "--workloads", "growth", "--growth-keys", "1000,10"}, "growth keys steps [1000 10]: each must be positive and larger than the one before"},
		{"an etcd binary that is not there",
			[]string{"bench", "--against", "etcd", "--etcd", "/nonexistent/etcd"}, "install it with scripts/install-etcd.sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runMain(tt.args...)
			if code != ExitUsage || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("tenure %q: got = exit %d, stderr %q, expected: exit %d, stderr containing %q", tt.args, code, stderr, ExitUsage, tt.stderr)
			}
			if stdout != "" {
				t.Errorf("tenure %q: stdout got = %q, expected: nothing", tt.args, stdout)
			}
		})
	}
}
