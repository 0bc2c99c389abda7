//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/testnet"
)

// TestDevClusterLeavesTheWorkingDirectoryAlone: `tenure dev cluster`
// without --data-dir keeps its data in the user's cache directory and
// says where, so that trying it in a checkout leaves no untracked
// directory there.
func TestDevClusterLeavesTheWorkingDirectoryAlone(t *testing.T) {
	bin := tenureBinary(t)
	cwd, cache := t.TempDir(), t.TempDir()
	t.Chdir(cwd)
	t.Setenv("XDG_CACHE_HOME", cache)
	free := testnet.FreeN(t, 3)
	port := func(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }
	dev := startDev(t, bin, "dev", "cluster", "--nodes", "1", "--api-ports", port(free[0]), "--peer-ports", port(free[1]), "--etcd-ports", port(free[2]), "--log-level", "warn")
	dev.waitReady(t)
	dev.signal(syscall.SIGTERM)
	select {
	case <-dev.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("dev cluster still running 20s after SIGTERM")
	}
	dataDir := filepath.Join(cache, "tenure", "dev-cluster")
	if want := "data in " + dataDir + " (remove it to start afresh)\n"; !strings.HasPrefix(dev.stdout.String(), want) {
		t.Errorf("stdout got = %q, expected it to start with %q", dev.stdout.String(), want)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "cluster.json")); err != nil {
		t.Errorf("the cluster's layout in the cache directory: %v", err)
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Errorf("the working directory got = %v, expected: empty", entries)
	}
}
