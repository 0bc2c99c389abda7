//go:build linux

package etcd

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestEtcdClientsOfOtherLanguages runs etcd's Python client (Debian's
// python3-etcd3, as OpenStack uses it) and its Node client (npm's etcd3)
// against etcd and against Tenure, each driving keys and values of any
// bytes, a compare, a prefix delete whose range end is not UTF-8, the
// lock recipe (whose value is a binary UUID the holder compares with its
// own), an election with a binary value, a lease and a watch; and
// requires the same output from both. .ci/run installs both clients.
func TestEtcdClientsOfOtherLanguages(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	dir, err := filepath.Abs("testdata/clients")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, missing string
		ready         func() bool
		command       func(ctx context.Context, addr string) *exec.Cmd
	}{
		{
			name:    "python",
			missing: "Debian's python3-etcd3 (apt-get install python3-etcd3)",
			ready:   func() bool { return exec.Command("/usr/bin/python3", "-c", "import etcd3").Run() == nil },
			command: func(ctx context.Context, addr string) *exec.Cmd {
				return exec.CommandContext(ctx, "/usr/bin/python3", filepath.Join(dir, "etcd3_client.py"), addr)
			},
		},
		{
			name:    "node",
			missing: "node with npm's etcd3 (npm ci --prefix e2e/etcd/testdata/clients)",
			ready: func() bool {
				_, err := os.Stat(filepath.Join(dir, "node_modules", "etcd3"))
				_, lerr := exec.LookPath("node")
				return err == nil && lerr == nil
			},
			command: func(ctx context.Context, addr string) *exec.Cmd {
				return exec.CommandContext(ctx, "node", filepath.Join(dir, "etcd3_client.js"), addr)
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !c.ready() {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is not installed", c.missing)
				}
				t.Skipf("%s is not installed", c.missing)
			}
			ref, sut, ok := pair(t)
			run := func(tg target) string {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				out, err := c.command(ctx, tg.addr).CombinedOutput()
				if err != nil {
					t.Errorf("%s client against %s: %v\n%s", c.name, tg.name, err, out)
				}
				return string(out)
			}
			want := run(ref)
			if !ok {
				t.Logf("etcd's transcript:\n%s", want)
				return
			}
			compareTranscripts(t, want, run(sut))
		})
	}
}
