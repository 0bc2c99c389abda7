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
	"fmt"
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
// address once it answers /health.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin := requireEtcd(t)
	addrs := testnet.FreeN(t, 2)
	dir := t.TempDir()
	p := startProc(t, "etcd", bin, etcdArgs(addrs, dir, false), filepath.Join(dir, "etcd.log"))
	p.waitFor(t, etcdReady(addrs[0]))
	return addrs[0]
}

// requireEtcd is the path of etcd. Without an etcd on PATH the test
// skips, except in CI, where .ci/run installs it and its absence is a
// failure.
func requireEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcd is not installed (scripts/install-etcd.sh installs it): %v", err)
		}
		t.Skipf("etcd is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	return bin
}

// etcdArgs runs one etcd member with its client and peer URLs on addrs
// and its data under dir. quick shortens the election timeout (a
// one-member cluster waits for one before it elects itself) to 100 ms.
func etcdArgs(addrs []string, dir string, quick bool) []string {
	client, peer := "http://"+addrs[0], "http://"+addrs[1]
	args := []string{
		"--name", "ref", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "ref=" + peer,
	}
	if quick {
		args = append(args, "--heartbeat-interval", "10", "--election-timeout", "100")
	}
	return args
}

// etcdReady tells whether etcd's client address answers /health.
func etcdReady(addr string) func() bool {
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	return func() bool {
		resp, err := hc.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
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
	p := startProc(t, "tenure", bin, tenureArgs(addrs, dir, false), filepath.Join(dir, "tenure.log"))
	p.waitFor(t, tenureReady(addrs))
	return addrs[2], true
}

// tenureArgs runs one Tenure node with its API, peer and etcd API on
// addrs and its data under dir, with no automatic compaction: etcd keeps
// every revision unless told, and the tests compact explicitly. quick
// shortens the election timeout to 100 ms (a one-voter cluster elects
// itself after one) and preallocates 1 MiB log segments, not 64 MiB.
func tenureArgs(addrs []string, dir string, quick bool) []string {
	args := []string{"serve",
		"--listen", addrs[0], "--peer-listen", addrs[1], "--etcd-listen", addrs[2],
		"--data-dir", filepath.Join(dir, "data"), "--auto-compaction-retention", "0",
	}
	if quick {
		args = append(args, "--election-timeout", "100ms", "--wal-segment-size", "1MiB")
	}
	return args
}

// tenureReady tells whether the node at addrs (as tenureArgs takes them)
// is ready and its etcd listener accepts connections.
func tenureReady(addrs []string) func() bool {
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	return func() bool {
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
	}
}

// --- server pairs for the differential fuzzer ---

// serverPair is a fresh etcd and a fresh Tenure node for one run of the
// differential fuzzer, each quick to start (etcdArgs, tenureArgs), their
// data in a directory of their own that stop removes.
type serverPair struct {
	ref, sut target
	procs    []*proc
	dir      string
}

// startPair starts etcd and the Tenure binary bin side by side, and
// returns once both are ready. The caller stops the pair.
func startPair(bin string) (*serverPair, error) {
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	dir, err := os.MkdirTemp("", "tenure-diff-")
	if err != nil {
		return nil, err
	}
	p := &serverPair{dir: dir}
	addrs, err := freeAddrs(5)
	if err != nil {
		p.stop()
		return nil, err
	}
	p.ref = target{name: "etcd", addr: addrs[0]}
	p.sut = target{name: "tenure", addr: addrs[4]}
	for _, s := range []struct {
		name, bin string
		args      []string
	}{
		{"etcd", etcdBin, etcdArgs(addrs[:2], filepath.Join(dir, "etcd"), true)},
		{"tenure", bin, tenureArgs(addrs[2:], filepath.Join(dir, "tenure"), true)},
	} {
		if err := os.Mkdir(filepath.Join(dir, s.name), 0o755); err != nil {
			p.stop()
			return nil, err
		}
		pr, err := launchProc(s.name, s.bin, s.args, filepath.Join(dir, s.name, s.name+".log"))
		if err != nil {
			p.stop()
			return nil, err
		}
		p.procs = append(p.procs, pr)
	}
	for i, ready := range []func() bool{etcdReady(addrs[0]), tenureReady(addrs[2:])} {
		if err := p.procs[i].waitReady(ready); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

// stop kills both servers and removes their data.
func (p *serverPair) stop() {
	for _, pr := range p.procs {
		pr.kill()
	}
	os.RemoveAll(p.dir)
}

// freeAddrs is n distinct free 127.0.0.1 addresses, as testnet.FreeN
// finds them, for code that has no *testing.T.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// pairPool starts each server pair while the one before is in use: a
// pair takes a few hundred milliseconds to start, about what a shrinking
// attempt takes to run.
type pairPool struct {
	bin  string
	next chan pairOrError // the pair starting, one at a time
}

type pairOrError struct {
	p   *serverPair
	err error
}

func newPairPool(bin string) *pairPool {
	pp := &pairPool{bin: bin, next: make(chan pairOrError, 1)}
	pp.prepare()
	return pp
}

func (pp *pairPool) prepare() {
	go func() {
		p, err := startPair(pp.bin)
		pp.next <- pairOrError{p, err}
	}()
}

// get is a fresh pair, for the caller to stop.
func (pp *pairPool) get() (*serverPair, error) {
	r := <-pp.next
	pp.prepare()
	return r.p, r.err
}

// close stops the pair started last, once it has started.
func (pp *pairPool) close() {
	if r := <-pp.next; r.p != nil {
		r.p.stop()
	}
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
	p, err := launchProc(name, bin, args, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s log (last lines of %s):\n%s", name, log, proccluster.Tail(log, 30))
		}
	})
	return p
}

// launchProc starts a server process whose output goes to log. The
// caller kills it; the kernel does should the test binary die first.
func launchProc(name, bin string, args []string, log string) (*proc, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	f.Close() // the child has its own descriptor
	if err != nil {
		return nil, fmt.Errorf("start %s: %v", bin, err)
	}
	p := &proc{name: name, log: log, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// kill ends the process with SIGKILL and waits for it to be gone. It is
// safe to call twice.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// waitFor polls ready until it holds, failing the test when the process
// exits first or 30 seconds pass.
func (p *proc) waitFor(t *testing.T, ready func() bool) {
	t.Helper()
	if err := p.waitReady(ready); err != nil {
		t.Fatal(err)
	}
}

// waitReady polls ready until it holds; it fails when the process exits
// first or 30 seconds pass.
func (p *proc) waitReady(ready func() bool) error {
	deadline := time.After(30 * time.Second)
	for !ready() {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready: %v\n%s", p.name, p.cmd.ProcessState, proccluster.Tail(p.log, 30))
		case <-deadline:
			return fmt.Errorf("%s not ready after 30s\n%s", p.name, proccluster.Tail(p.log, 30))
		case <-time.After(25 * time.Millisecond):
		}
	}
	return nil
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
