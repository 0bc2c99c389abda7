//go:build linux

package etcd

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// readmeEtcdctlBlock is the README's etcdctl walkthrough: the shell block
// that sets ETCDCTL_ENDPOINTS, as printed.
func readmeEtcdctlBlock(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const start = "```sh\nexport ETCDCTL_API=3 ETCDCTL_ENDPOINTS=127.0.0.1:2379\n"
	i := strings.Index(string(readme), start)
	if i < 0 {
		t.Fatalf("README.md has no etcdctl block starting %q", start)
	}
	block := string(readme[i+len("```sh\n"):])
	return block[:strings.Index(block, "```")]
}

// TestTheReadmeEtcdctlWalkthroughRuns pastes the README's etcdctl block
// into bash, as a user would, against etcd and against Tenure (the
// address swapped for each server's free port): every line must succeed
// on both, and Tenure's output must say what the README's comments
// promise.
func TestTheReadmeEtcdctlWalkthroughRuns(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("etcdctl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
		}
		t.Skipf("etcdctl is not installed: %v", err)
	}
	block := readmeEtcdctlBlock(t)
	ref, sut, ok := pair(t)
	run := func(tg target) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", strings.ReplaceAll(block, "127.0.0.1:2379", tg.addr))
		cmd.Dir = t.TempDir() // snapshot save writes backup.db here
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: the README's etcdctl block failed: %v\n%s", tg.name, err, out)
		}
		return string(out)
	}
	run(ref)
	if !ok {
		return
	}
	out := run(sut)
	for _, want := range []string{
		"postgres://db2:5432",              // the txn's put, seen by the watch from history
		"attached keys([/workers/w1])",     // the lease's key
		"/locks/nightly/",                  // the lock's key, echoed by the command it ran
		"2f 62 69 6e 2f fe 0a 9f c3 ff 0a", // bytes that are not UTF-8, back as written
		"Snapshot saved at backup.db",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("got = Tenure's output without %q, expected: what the README promises\n%s", want, out)
		}
	}
}
