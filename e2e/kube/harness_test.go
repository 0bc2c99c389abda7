//go:build linux

// Package kube runs k8s.io/apiserver's storage conformance tests (the
// exported RunTest… functions of k8s.io/apiserver/pkg/storage/testing)
// on k8s.io/apiserver's own etcd3 store, the one kube-apiserver runs,
// pointed at a Tenure node's etcd API, and the same tests on a real etcd
// beside it, so that a failure on Tenure can be told from one the tests
// have with etcd 3.4 too. Objects are stored as kube-apiserver stores
// them by default: protobuf.
//
// It is a module of its own, as e2e/etcd is, so that k8s.io/apiserver and
// etcd's 3.7 client stay out of the core module's graph. It imports
// nothing from the core module: the system under test is the tenure
// binary, built from this checkout by `go build`.
//
// Each server is a process on free 127.0.0.1 ports with a data dir of its
// own, killed when the test ends: etcd from Debian's package (which
// scripts/install-etcd.sh installs), and tenure serve --etcd-listen.
package kube

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// server is one process speaking the etcd v3 API.
type server struct {
	name string // "etcd" or "tenure"
	addr string // host:port of its etcd API
	// fresh is set for a server started for one test alone, whose store
	// takes the whole keyspace.
	fresh bool
}

// startServers starts a fresh etcd and a fresh Tenure node, in that order,
// stopped at cleanup. Without etcd installed, only Tenure runs (outside
// CI; in CI its absence is a failure).
func startServers(t *testing.T) []server {
	t.Helper()
	var servers []server
	if bin, ok := etcdBinary(t); ok {
		servers = append(servers, server{name: "etcd", addr: startEtcd(t, bin)})
	}
	return append(servers, server{name: "tenure", addr: startTenure(t)})
}

// --- etcd ---

// etcdBinary is the path of etcd. Without an etcd on PATH, ok is false,
// except in CI, where .ci/run installs it and its absence fails the test.
func etcdBinary(t *testing.T) (bin string, ok bool) {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcd is not installed (scripts/install-etcd.sh installs it): %v", err)
		}
		t.Logf("etcd is not installed (scripts/install-etcd.sh installs it): running against Tenure alone")
		return "", false
	}
	return bin, true
}

// startEtcd runs one etcd member on free loopback ports, electing itself
// after 100 ms, with extra added to its flags, and returns its client
// address once it answers /health.
func startEtcd(t *testing.T, bin string, extra ...string) string {
	t.Helper()
	addrs := freeAddrs(t, 2)
	dir := t.TempDir()
	client, peer := "http://"+addrs[0], "http://"+addrs[1]
	startProc(t, "etcd", bin, append([]string{
		"--name", "ref", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "ref=" + peer,
		"--heartbeat-interval", "10", "--election-timeout", "100",
	}, extra...), filepath.Join(dir, "etcd.log"), func() bool { return httpOK("http://" + addrs[0] + "/health") })
	return addrs[0]
}

// --- tenure ---

var tenureBuild struct {
	once sync.Once
	dir  string // removed by TestMain
	path string
	err  error
}

// TestMain removes the tenure binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if tenureBuild.dir != "" {
		os.RemoveAll(tenureBuild.dir)
	}
	os.Exit(code)
}

// tenureBinary builds cmd/tenure from this checkout once per test binary
// (without -race: the server is what is tested, not the test), or
// returns $TENURE_BINARY when set. It builds in the core module's
// directory, two levels up, whose go.sum covers what the server links.
func tenureBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("TENURE_BINARY"); bin != "" {
		return bin
	}
	b := &tenureBuild
	b.once.Do(func() {
		root, err := filepath.Abs("../..")
		if err != nil {
			b.err = err
			return
		}
		if b.dir, b.err = os.MkdirTemp("", "tenure-e2e-kube-"); b.err != nil {
			return
		}
		path := filepath.Join(b.dir, "tenure")
		cmd := exec.Command("go", "build", "-o", path, "./cmd/tenure")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/tenure in %s: %w\n%s", root, err, out)
			return
		}
		b.path = path
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// startTenure runs one Tenure node with its etcd API on free loopback
// ports and returns that API's address once the node is ready. The node
// keeps every revision until a client compacts, as etcd does, and
// elects itself after 100 ms.
func startTenure(t *testing.T) string {
	t.Helper()
	return startTenureNode(t).etcd
}

// tenureNode is a Tenure process: its native API and etcd API
// addresses, and the file its log goes to.
type tenureNode struct {
	api, etcd, log string
}

// startTenureNode is startTenure, telling all of the node.
func startTenureNode(t *testing.T) tenureNode {
	t.Helper()
	bin := tenureBinary(t)
	addrs := freeAddrs(t, 3)
	dir := t.TempDir()
	log := filepath.Join(dir, "tenure.log")
	startProc(t, "tenure", bin, []string{"serve",
		"--listen", addrs[0], "--peer-listen", addrs[1], "--etcd-listen", addrs[2],
		"--data-dir", filepath.Join(dir, "data"), "--auto-compaction-retention", "0",
		"--election-timeout", "100ms", "--wal-segment-size", "1MiB",
	}, log, func() bool {
		if !httpOK("http://" + addrs[0] + "/readyz") {
			return false
		}
		c, err := net.DialTimeout("tcp", addrs[2], 500*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return tenureNode{api: addrs[0], etcd: addrs[2], log: log}
}

// --- processes ---

// startProc starts bin with args, its output in log, and returns once
// ready holds. Cleanup kills it and, if the test failed, shows the log's
// tail. The kernel kills it should the test binary die first.
func startProc(t *testing.T, name, bin string, args []string, log string, ready func() bool) {
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
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s log (last lines of %s):\n%s", name, log, tail(log, 30))
		}
	})
	deadline := time.After(30 * time.Second)
	for !ready() {
		select {
		case <-exited:
			t.Fatalf("%s exited before it was ready: %v\n%s", name, cmd.ProcessState, tail(log, 30))
		case <-deadline:
			t.Fatalf("%s not ready after 30s\n%s", name, tail(log, 30))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// httpOK tells whether a GET of url answers 200.
func httpOK(url string) bool {
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freeAddrs is n distinct free 127.0.0.1 addresses. They are free when
// returned, not reserved: another process may take one before the server
// binds it, which fails the test with the server's log.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
