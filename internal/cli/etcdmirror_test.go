package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/server"
)

// startEtcd runs a one-member etcd (scripts/install-etcd.sh) on free
// 127.0.0.1 ports until the test ends, and returns its client endpoint.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed (scripts/install-etcd.sh installs it)")
	}
	dir := t.TempDir()
	client, peer := testnet.Free(t), testnet.Free(t)
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--data-dir", filepath.Join(dir, "data"), "--name", "m",
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "m=http://"+peer, "--log-level", "warn", "--logger", "zap")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + client + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return client
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "etcd.log"))
			t.Fatalf("etcd on %s not healthy after 30s (%v); its log:\n%s", client, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func etcdClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// mirrorRun is a mirror running in the background.
type mirrorRun struct {
	cancel context.CancelFunc
	done   chan error
	out    *syncBuffer
}

func startMirror(t *testing.T, o mirrorOptions) *mirrorRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := &mirrorRun{cancel: cancel, done: make(chan error, 1), out: &syncBuffer{}}
	go func() { m.done <- runEtcdMirror(ctx, m.out, 5*time.Second, o) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

// stop interrupts the mirror, as Ctrl-C does, and returns its error.
func (m *mirrorRun) stop(t *testing.T) error {
	t.Helper()
	m.cancel()
	select {
	case err, ok := <-m.done:
		if ok {
			close(m.done)
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the mirror did not stop within 10s of its interrupt")
		return nil
	}
}

type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitKeys polls c until the keys under prefix are want (key → value).
func waitKeys(t *testing.T, c *clientv3.Client, prefix string, want map[string]string) *clientv3.GetResponse {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, kv := range resp.Kvs {
			got[string(kv.Key)] = string(kv.Value)
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys under %q got = %v, expected: %v", prefix, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mirrorScenario copies /app/ from a real etcd to dst under /copy/:
// the keys there at the start (one bound to a lease, which the copy
// drops), a transaction of a put and a delete (one revision at the
// source, one transaction at the destination), a put, and the lease's
// revocation (the key is deleted from the copy too).
func mirrorScenario(t *testing.T, dstEndpoint string) {
	ctx := context.Background()
	srcEndpoint := startEtcd(t)
	src, dst := etcdClient(t, srcEndpoint), etcdClient(t, dstEndpoint)
	lease, err := src.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []clientv3.Op{
		clientv3.OpPut("/app/a", "1"), clientv3.OpPut("/app/b", "2", clientv3.WithLease(lease.ID)), clientv3.OpPut("/other/x", "3"),
	} {
		if _, err := src.Do(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	m := startMirror(t, mirrorOptions{from: srcEndpoint, to: dstEndpoint, prefix: "/app/", destPrefix: "/copy/", maxTxnOps: 128})
	resp := waitKeys(t, dst, "/copy/", map[string]string{"/copy/a": "1", "/copy/b": "2"})
	for _, kv := range resp.Kvs {
		if kv.Lease != 0 {
			t.Errorf("%s: lease got = %x, expected: 0 (the copy drops leases, as make-mirror does)", kv.Key, kv.Lease)
		}
	}
	afterCopy := resp.Header.Revision
	if _, err := src.Txn(ctx).Then(clientv3.OpPut("/app/c", "3"), clientv3.OpDelete("/app/a")).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Put(ctx, "/app/b", "22", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	resp = waitKeys(t, dst, "/copy/", map[string]string{"/copy/b": "22", "/copy/c": "3"})
	if got := resp.Header.Revision - afterCopy; got != 2 {
		t.Errorf("destination revisions for two source revisions got = %d, expected: 2 (one transaction per source revision)", got)
	}
	if _, err := src.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	waitKeys(t, dst, "/copy/", map[string]string{"/copy/c": "3"})
	last, err := src.Get(ctx, "/app/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.stop(t); err != nil {
		t.Errorf("mirror after an interrupt: got = %v, expected: nil", err)
	}
	out := m.out.String()
	for _, want := range []string{
		"mirror: 2 keys copied, source revision 4: the copy at revision 4 is done; following changes\n",
		fmt.Sprintf("mirror: 6 keys copied, source revision %d\n", last.Header.Revision),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output got = %q, expected a line %q", out, want)
		}
	}
	if o, err := dst.Get(ctx, "/other/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || o.Count != 0 {
		t.Errorf("keys outside --prefix copied: got = %v (%v), expected: 0", o.Count, err)
	}
}

// TestEtcdMirrorEtcdToEtcd copies from one real etcd into another, as
// etcdctl make-mirror would.
func TestEtcdMirrorEtcdToEtcd(t *testing.T) {
	mirrorScenario(t, startEtcd(t))
}

// TestEtcdMirrorEtcdToTenure copies from a real etcd into a Tenure
// node's etcd API.
func TestEtcdMirrorEtcdToTenure(t *testing.T) {
	c := cluster.New(t, 1, cluster.WithEtcd(server.Compaction{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	mirrorScenario(t, c.Node(0).EtcdAddr())
}

func TestEtcdMirrorUsageErrors(t *testing.T) {
	dead := deadEndpoint(t)
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no source", []string{"etcd", "mirror", "--to", dead}, ExitUsage, "--from is required"},
		{"no destination", []string{"etcd", "mirror", "--from", dead}, ExitUsage, "--to is required"},
		{"both prefix rules", []string{"etcd", "mirror", "--from", dead, "--to", dead, "--dest-prefix", "/a", "--no-dest-prefix"}, ExitUsage,
			"--dest-prefix and --no-dest-prefix cannot be set at the same time"},
		{"a user without a password", []string{"etcd", "mirror", "--from", dead, "--to", dead, "--user", "root"}, ExitUsage, `the source's user "root" has no password`},
		{"a source nobody answers at", []string{"etcd", "mirror", "--from", dead, "--to", dead, "--timeout", "300ms"}, ExitUnreachable, "reach the source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runMain(tt.args...)
			if code != tt.code || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("tenure %q: got = exit %d, stderr %q, expected: exit %d, stderr containing %q", tt.args, code, stderr, tt.code, tt.stderr)
			}
			if stdout != "" {
				t.Errorf("stdout got = %q, expected: nothing", stdout)
			}
		})
	}
}

// TestEtcdMirrorRefusesItsOwnSource: a destination in the source's
// cluster whose keys overlap the prefix would copy its own writes for
// ever.
func TestEtcdMirrorRefusesItsOwnSource(t *testing.T) {
	ep := startEtcd(t)
	stdout, stderr, code := runMain("etcd", "mirror", "--from", ep, "--to", ep, "--prefix", "/app/", "--dest-prefix", "/app/copy/")
	if code != ExitUsage || !strings.Contains(stderr, "--from and --to reach the same cluster") {
		t.Errorf("got = exit %d, stderr %q, stdout %q, expected: exit %d naming the same cluster", code, stderr, stdout, ExitUsage)
	}
}
