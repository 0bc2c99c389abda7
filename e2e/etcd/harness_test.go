//go:build linux

// Package etcd tests Tenure's etcd v3 API against a real etcd: the same
// etcdctl commands and the same clientv3 calls go to both servers, and
// their answers must agree. It is a module of its own so that the core
// module does not depend on etcd's client and server code.
//
// Every test runs against a server pair: a real etcd (Debian's, which
// scripts/install-etcd.sh installs) and a Tenure node serving the etcd API
// (--etcd-listen), each a fresh process on free 127.0.0.1 ports with a data
// dir of its own, killed at the end of the test.
package etcd

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/proccluster"
	"github.com/tenurehq/tenure/internal/testnet"
)

// TestMain removes the tenure binary the tests built.
func TestMain(m *testing.M) { proccluster.Main(m) }

// target is one server speaking the etcd v3 API.
type target struct {
	name string // "etcd" or "tenure"
	addr string // host:port of its etcd API
}

// pair starts a fresh etcd and a fresh Tenure node. When the tenure binary
// has no etcd listener yet, the Tenure side is left out (second is false)
// and the test runs against etcd alone.
func pair(t *testing.T) (ref target, sut target, second bool) {
	t.Helper()
	tenureBinary(t) // a build failure is the only thing to show
	ref = target{name: "etcd", addr: startEtcd(t)}
	addr, ok := startTenure(t)
	if !ok {
		return ref, target{}, false
	}
	return ref, target{name: "tenure", addr: addr}, true
}

// --- etcd ---

// startEtcd runs etcd on free loopback ports and returns its client
// address once it answers /health. Without an etcd on PATH the test skips,
// except in CI, where .ci/run installs it and its absence is a failure.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcd is not installed (scripts/install-etcd.sh installs it): %v", err)
		}
		t.Skipf("etcd is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	addrs := testnet.FreeN(t, 2)
	client, peer := "http://"+addrs[0], "http://"+addrs[1]
	dir := t.TempDir()
	args := []string{
		"--name", "ref", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "ref=" + peer,
	}
	p := startProc(t, "etcd", bin, args, filepath.Join(dir, "etcd.log"))
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	p.waitFor(t, func() bool {
		resp, err := hc.Get(client + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return addrs[0]
}

// --- tenure ---

// tenureBinary builds cmd/tenure once per test binary, or returns
// $TENURE_BINARY when set (a binary built from another tree). It builds in
// the core module's directory: this module's go.sum covers what the tests
// import, not everything the server links.
func tenureBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("TENURE_BINARY"); bin != "" {
		return bin
	}
	return proccluster.Binary(t)
}

// startTenure runs one Tenure node with the etcd API on a free loopback
// port and returns that address once the node is ready. ok is false (and
// the reason logged) when the binary has no --etcd-listen flag.
func startTenure(t *testing.T) (addr string, ok bool) {
	t.Helper()
	bin := tenureBinary(t)
	help, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	if !strings.Contains(string(help), "--etcd-listen") {
		t.Logf("tenure serve has no --etcd-listen flag yet: running against etcd alone")
		return "", false
	}
	addrs := testnet.FreeN(t, 3)
	dir := t.TempDir()
	// No automatic compaction: etcd keeps every revision unless told, and
	// the tests compact explicitly.
	args := []string{"serve",
		"--listen", addrs[0], "--peer-listen", addrs[1], "--etcd-listen", addrs[2],
		"--data-dir", filepath.Join(dir, "data"), "--auto-compaction-retention", "0",
	}
	p := startProc(t, "tenure", bin, args, filepath.Join(dir, "tenure.log"))
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	p.waitFor(t, func() bool {
		resp, err := hc.Get("http://" + addrs[0] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		c, err := net.DialTimeout("tcp", addrs[2], 500*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return addrs[2], true
}

// --- processes ---

type proc struct {
	name, log string
	cmd       *exec.Cmd
	exited    chan struct{}
}

// startProc starts a server process whose output goes to log, killed (and
// its log's tail shown if the test failed) at cleanup. The kernel kills
// it too should the test binary die first.
func startProc(t *testing.T, name, bin string, args []string, log string) *proc {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	f.Close() // the child has its own descriptor
	if err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	p := &proc{name: name, log: log, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s log (last lines of %s):\n%s", name, log, proccluster.Tail(log, 30))
		}
	})
	return p
}

// waitFor polls ready until it holds, failing the test when the process
// exits first or 30 seconds pass.
func (p *proc) waitFor(t *testing.T, ready func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !ready() {
		select {
		case <-p.exited:
			t.Fatalf("%s exited before it was ready: %v\n%s", p.name, p.cmd.ProcessState, proccluster.Tail(p.log, 30))
		case <-deadline:
			t.Fatalf("%s not ready after 30s\n%s", p.name, proccluster.Tail(p.log, 30))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// --- clients ---

// newClient is a clientv3 client of one server, closed at cleanup.
func newClient(t *testing.T, tg target) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{tg.addr},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("%s: clientv3: %v", tg.name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ctxT is a context bounded for one call.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
