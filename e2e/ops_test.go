package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/e2etest"
	"github.com/tenurehq/tenure/internal/testnet"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// The operator's cluster commands, end to end: real `tenure serve`
// processes formed into a cluster with --bootstrap-expect and --join,
// driven by the `tenure` binary as an operator would.

// clusterNode is one `tenure serve` of a test cluster, on fixed
// 127.0.0.1 ports and data dir so that it restarts as the same node.
type clusterNode struct {
	t                  *testing.T
	bin, id, api, peer string
	dataDir, logPath   string
	args               []string // serve's flags after --listen etc.
	cmd                *exec.Cmd
	exited             chan struct{}
	starts             int
}

// newClusterNodes lays out n nodes that form one cluster when started:
// every node is given --bootstrap-expect n and the others' API
// addresses. They are killed when the test ends.
func newClusterNodes(t *testing.T, bin string, n int) []*clusterNode {
	dir := t.TempDir()
	nodes := make([]*clusterNode, n)
	free := testnet.FreeN(t, 2*n)
	for i := range nodes {
		nodes[i] = &clusterNode{
			t: t, bin: bin, id: fmt.Sprintf("node%d", i+1),
			api: free[2*i], peer: free[2*i+1],
			dataDir: filepath.Join(dir, fmt.Sprintf("node%d", i+1)),
			logPath: filepath.Join(dir, fmt.Sprintf("node%d.log", i+1)),
		}
	}
	for _, node := range nodes {
		var join []string
		for _, other := range nodes {
			if other != node {
				join = append(join, other.api)
			}
		}
		node.args = []string{"--node-id", node.id, "--bootstrap-expect", fmt.Sprint(n), "--join", strings.Join(join, ",")}
	}
	t.Cleanup(func() {
		for _, node := range nodes {
			node.kill()
		}
		if t.Failed() {
			for _, node := range nodes {
				t.Logf("%s log (last lines):\n%s", node.id, proccluster.Tail(node.logPath, 25))
			}
		}
	})
	return nodes
}

// start runs the node without waiting for it: a node of a new cluster is
// not ready until the others have started too.
func (n *clusterNode) start() {
	n.t.Helper()
	n.starts++
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %d\n", n.starts)
	args := append([]string{"serve", "--listen", n.api, "--peer-listen", n.peer, "--data-dir", n.dataDir,
		"--wal-segment-size", "4MiB"}, n.args...)
	cmd := exec.Command(n.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	setDeathSignal(cmd)
	err = cmd.Start()
	f.Close()
	if err != nil {
		n.t.Fatalf("start %s: %v", n.id, err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(n.exited)
}

// kill sends SIGKILL and waits for the process to be gone; nothing when
// it is not running.
func (n *clusterNode) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

func endpointsOf(nodes []*clusterNode) string {
	eps := make([]string, len(nodes))
	for i, n := range nodes {
		eps[i] = n.api
	}
	return strings.Join(eps, ",")
}

// tenureRun runs the tenure binary to its end.
func tenureRun(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("tenure %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

// memberJSON is a member as `tenure members -o json` prints it.
type memberJSON struct {
	ID          string `json:"id"`
	APIAddress  string `json:"apiAddress"`
	PeerAddress string `json:"peerAddress"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
	Error       string `json:"error"`
	Status      *struct {
		Role         string `json:"role"`
		CommitIndex  uint64 `json:"commitIndex"`
		AppliedIndex uint64 `json:"appliedIndex"`
		Ready        bool   `json:"ready"`
	} `json:"status"`
}

// members runs `tenure members -o json` against endpoints.
func members(t *testing.T, bin, endpoints string) ([]memberJSON, error) {
	t.Helper()
	stdout, stderr, code := tenureRun(t, bin, "--endpoints", endpoints, "members", "-o", "json")
	if code != 0 {
		return nil, fmt.Errorf("tenure members: exit %d: %s", code, stderr)
	}
	var doc struct {
		Items []memberJSON `json:"items"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		return nil, fmt.Errorf("tenure members -o json: %v\n%s", err, stdout)
	}
	return doc.Items, nil
}

// settled waits until `tenure members` lists want members, each a
// reachable, ready voter that has applied at least index, and returns
// them with the leader's ID.
func settled(t *testing.T, bin, endpoints string, want int, index uint64, within time.Duration) ([]memberJSON, string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ms, err := members(t, bin, endpoints)
		leader := ""
		ok := err == nil && len(ms) == want
		for _, m := range ms {
			ok = ok && m.Error == "" && m.Status != nil && m.Status.Ready && m.Voter && m.Status.AppliedIndex >= index
			if m.Leader {
				leader = m.ID
			}
		}
		if ok && leader != "" {
			return ms, leader
		}
		if time.Now().After(deadline) {
			t.Fatalf("members never settled in %v: got = %+v (%v), expected: %d ready voters, applied up to %d, one leading", within, ms, err, want, index)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func nodeByID(t *testing.T, nodes []*clusterNode, id string) *clusterNode {
	t.Helper()
	for _, n := range nodes {
		if n.id == id {
			return n
		}
	}
	t.Fatalf("no node %s", id)
	return nil
}

func quietClient(t *testing.T, ctx context.Context, endpoints string) *client.Client {
	t.Helper()
	c, err := client.New(ctx, strings.Split(endpoints, ","),
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		client.WithRetry(20, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lockAsync starts Lock on m and returns where its result arrives.
func lockAsync(ctx context.Context, m *client.Mutex) <-chan error {
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }()
	return done
}

func tokenOf(t *testing.T, m *client.Mutex) int64 {
	t.Helper()
	tok, ok := m.Token()
	if !ok {
		t.Fatalf("no token: the grant is not held")
	}
	return tok.Token
}

// waitQueued waits until the lease lists n waiters.
func waitQueued(t *testing.T, ctx context.Context, c *client.Client, name string, n int) {
	t.Helper()
	for {
		l, err := c.Lease(ctx, client.DefaultNamespace, name)
		if err == nil && len(l.Waiters) == n {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: waiters got = %+v (%v), expected: %d", name, l.Waiters, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFiveNodesSurviveTwoNodesDown kills two of five nodes, the leader
// among them, with SIGKILL: writes and lock handoffs go on, since three
// still make a quorum; restarted, the two catch up and `tenure members`
// lists all five again. Then leadership moves on request and a member is
// removed, through the CLI.
func TestFiveNodesSurviveTwoNodesDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a five-node cluster of processes")
	}
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := newClusterNodes(t, bin, 5)
	for _, n := range nodes {
		n.start()
	}
	eps := endpointsOf(nodes)
	_, leader := settled(t, bin, eps, 5, 0, 20*time.Second)

	c := quietClient(t, ctx, eps)
	alice, err := c.NewSession(ctx, client.WithIdentity("alice"), client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close(context.Background())
	bob, err := c.NewSession(ctx, client.WithIdentity("bob"), client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close(context.Background())
	aliceLock, bobLock := alice.Mutex("handoff"), bob.Mutex("handoff")
	if err := aliceLock.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	bobGranted := lockAsync(ctx, bobLock)
	waitQueued(t, ctx, c, "handoff", 1)

	// Down go the leader and one follower.
	down := []*clusterNode{nodeByID(t, nodes, leader)}
	for _, n := range nodes {
		if n.id != leader {
			down = append(down, n)
			break
		}
	}
	for _, n := range down {
		n.kill()
	}
	began := time.Now()
	rev, err := c.KV().Put(ctx, "after-the-loss", "written")
	if errors.Is(err, client.ErrUnknownOutcome) {
		// Sent on the dead leader's connection before the client saw
		// it close, as can happen on a loaded machine: the put is
		// idempotent, so the answer to the question asked here (does
		// the cluster take writes?) is the second try's.
		rev, err = c.KV().Put(ctx, "after-the-loss", "written")
	}
	if err != nil {
		t.Fatalf("put with two of five nodes down: %v", err)
	}
	t.Logf("first write after killing %s and %s took %v", down[0].id, down[1].id, time.Since(began).Round(time.Millisecond))
	aliceToken := tokenOf(t, aliceLock)
	if err := aliceLock.Unlock(ctx); err != nil {
		t.Fatalf("unlock with two of five nodes down: %v", err)
	}
	if err := <-bobGranted; err != nil {
		t.Fatalf("bob's lock with two of five nodes down: %v", err)
	}
	if bobToken := tokenOf(t, bobLock); bobToken <= aliceToken {
		t.Errorf("bob's token got = %d, expected: above alice's %d", bobToken, aliceToken)
	}
	if err := bobLock.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Back up, the two catch up with everything written meanwhile.
	live := []*clusterNode{}
	for _, n := range nodes {
		if n.cmd != nil {
			live = append(live, n)
		}
	}
	ms, _ := members(t, bin, endpointsOf(live))
	var commit uint64
	for _, m := range ms {
		if m.Leader && m.Status != nil {
			commit = m.Status.CommitIndex
		}
	}
	for _, n := range down {
		n.start()
	}
	_, leader = settled(t, bin, eps, 5, commit, 20*time.Second)
	for _, n := range down {
		// A stale read is answered from the node's own state.
		own := quietClient(t, ctx, n.api)
		kv, err := own.KV().Get(ctx, "after-the-loss", client.Stale())
		if err != nil || kv.Value != "written" || kv.ModRevision != rev {
			t.Errorf("%s after its restart: after-the-loss got = %+v %v, expected: the write made while it was down (revision %d)", n.id, kv, err, rev)
		}
	}

	// Leadership moves where it is asked to.
	var target string
	for _, n := range nodes {
		if n.id != leader {
			target = n.id
			break
		}
	}
	stdout, stderr, code := tenureRun(t, bin, "--endpoints", eps, "members", "transfer-leadership", target)
	if code != 0 || stdout != "leader is now "+target+"\n" {
		t.Fatalf("transfer-leadership %s: got = exit %d, %q %q, expected: exit 0, %q", target, code, stdout, stderr, "leader is now "+target+"\n")
	}
	if _, now := settled(t, bin, eps, 5, 0, 10*time.Second); now != target {
		t.Errorf("leader after the transfer: got = %s, expected: %s", now, target)
	}

	// A member removed is gone from the list; the rest carry on.
	gone := nodes[len(nodes)-1]
	if gone.id == target {
		gone = nodes[0]
	}
	stdout, stderr, code = tenureRun(t, bin, "--endpoints", eps, "members", "remove", gone.id)
	if code != 0 || stdout != "removed member "+gone.id+"\n" {
		t.Fatalf("members remove %s: got = exit %d, %q %q, expected: exit 0", gone.id, code, stdout, stderr)
	}
	gone.kill()
	rest := []*clusterNode{}
	for _, n := range nodes {
		if n != gone {
			rest = append(rest, n)
		}
	}
	ms, _ = settled(t, bin, endpointsOf(rest), 4, 0, 10*time.Second)
	for _, m := range ms {
		if m.ID == gone.id {
			t.Errorf("members after removing %s: got = %+v, expected: it gone", gone.id, ms)
		}
	}
	stdout, stderr, code = tenureRun(t, bin, "--endpoints", endpointsOf(rest), "members", "remove", gone.id)
	if code != 1 || !strings.Contains(stderr, "no member "+gone.id) {
		t.Errorf("remove %s again: got = exit %d, %q, expected: exit 1 and no such member", gone.id, code, stderr)
	}
}

// TestSnapshotSaveRestoreRoundTripsAPopulatedCluster saves a three-node
// cluster holding sessions, held leases with waiters, and keys, from a
// follower, restores the file into a fresh data dir and starts the node
// with the command restore printed: every lease, holder, waiter, token
// and key is there, and a new grant's token is above every earlier one.
func TestSnapshotSaveRestoreRoundTripsAPopulatedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-node cluster of processes, then a restored node")
	}
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := newClusterNodes(t, bin, 3)
	for _, n := range nodes {
		n.start()
	}
	eps := endpointsOf(nodes)
	_, leader := settled(t, bin, eps, 3, 0, 20*time.Second)

	c := quietClient(t, ctx, eps)
	sess := map[string]*client.Session{}
	for _, who := range []string{"alice", "bob", "carol"} {
		s, err := c.NewSession(ctx, client.WithIdentity(who), client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		sess[who] = s
	}
	held := map[string]*client.Mutex{"jobs": sess["alice"].Mutex("jobs"), "reports": sess["bob"].Mutex("reports")}
	for _, m := range held {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lockCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	carolWaits := lockAsync(lockCtx, sess["carol"].Mutex("jobs"))
	bobWaits := lockAsync(lockCtx, sess["bob"].Mutex("jobs"))
	waitQueued(t, ctx, c, "jobs", 2)
	keyRev, err := c.KV().Put(ctx, "config/color", "blue")
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.Leases(ctx, client.ListOptions{AllNamespaces: true})
	if err != nil {
		t.Fatal(err)
	}
	var topToken int64
	for _, l := range before {
		topToken = max(topToken, l.Token)
	}

	var follower *clusterNode
	for _, n := range nodes {
		if n.id != leader {
			follower = n
			break
		}
	}
	file := filepath.Join(t.TempDir(), "backup.snap")
	stdout, stderr, code := tenureRun(t, bin, "--endpoints", follower.api, "snapshot", "save", file)
	if code != 0 || !strings.HasPrefix(stdout, "saved revision ") {
		t.Fatalf("snapshot save from follower %s: got = exit %d, %q %q, expected: exit 0, saved revision ...", follower.id, code, stdout, stderr)
	}

	restored := newServerProc(t, bin)
	stdout, stderr, code = tenureRun(t, bin, "snapshot", "restore", file, "--data-dir", restored.dataDir, "--peer-listen", restored.peer)
	if code != 0 {
		t.Fatalf("snapshot restore: exit %d: %s", code, stderr)
	}
	wantCmd := "  tenure serve --data-dir " + restored.dataDir + " --peer-listen " + restored.peer + "\n"
	if !strings.HasSuffix(stdout, wantCmd) {
		t.Errorf("snapshot restore: stdout got = %q, expected it to end with %q", stdout, wantCmd)
	}
	// The printed command, plus --listen, is what serverProc runs.
	restored.start(ctx)

	rc := quietClient(t, ctx, restored.listen)
	after, err := rc.Leases(ctx, client.ListOptions{AllNamespaces: true})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]client.Lease{}
	for _, l := range after {
		byName[l.Name] = l
	}
	for _, l := range before {
		got := byName[l.Name]
		if got.Holder != l.Holder || got.Token != l.Token || len(got.Waiters) != len(l.Waiters) {
			t.Errorf("restored %s: got = holder %q token %d %d waiters, expected: holder %q token %d %d waiters", l.Name, got.Holder, got.Token, len(got.Waiters), l.Holder, l.Token, len(l.Waiters))
		}
		for i := range min(len(got.Waiters), len(l.Waiters)) {
			if got.Waiters[i].Holder != l.Waiters[i].Holder {
				t.Errorf("restored %s waiter %d: got = %q, expected: %q (the queue in order)", l.Name, i, got.Waiters[i].Holder, l.Waiters[i].Holder)
			}
		}
	}
	if got := byName["jobs"]; got.Holder != "alice" || len(got.Waiters) != 2 {
		t.Errorf("restored jobs: got = %+v, expected: held by alice, carol and bob waiting", got)
	}
	kv, err := rc.KV().Get(ctx, "config/color")
	if err != nil || kv.Value != "blue" || kv.ModRevision != keyRev {
		t.Errorf("restored config/color: got = %+v %v, expected: blue at revision %d", kv, err, keyRev)
	}
	v, err := rc.Validate(ctx, client.Token{Namespace: client.DefaultNamespace, Name: "jobs", Token: tokenOf(t, held["jobs"])})
	if err != nil || !v.Valid {
		t.Errorf("alice's token on the restored node: got = %+v %v, expected: valid", v, err)
	}

	dave, err := rc.NewSession(ctx, client.WithIdentity("dave"), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer dave.Close(context.Background())
	fresh := dave.Mutex("fresh")
	if err := fresh.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if tok := tokenOf(t, fresh); tok <= topToken || tok <= keyRev {
		t.Errorf("new grant's token on the restored node: got = %d, expected: above every earlier token (%d) and revision (%d)", tok, topToken, keyRev)
	}

	stopWaiting()
	<-carolWaits
	<-bobWaits
}

// TestDevClusterServesThroughANodeLossAndRestarts runs `tenure dev
// cluster`: it prints every node and a ready line, keeps serving when a
// node is killed, stops every node on SIGTERM, and run again restarts the
// same cluster with its data.
func TestDevClusterServesThroughANodeLossAndRestarts(t *testing.T) {
	t.Parallel() // its own processes, mostly waiting: it runs beside the package's other slow tests
	if testing.Short() {
		t.Skip("runs tenure dev cluster twice")
	}
	bin := tenureBinary(t)
	dir := filepath.Join(t.TempDir(), "dev")
	var apiPorts, peerPorts, etcdPorts, apis, etcds []string
	free := testnet.FreeN(t, 9)
	for i := range 3 {
		api, peer, etcd := free[3*i], free[3*i+1], free[3*i+2]
		apis, etcds = append(apis, api), append(etcds, etcd)
		apiPorts = append(apiPorts, api[strings.LastIndex(api, ":")+1:])
		peerPorts = append(peerPorts, peer[strings.LastIndex(peer, ":")+1:])
		etcdPorts = append(etcdPorts, etcd[strings.LastIndex(etcd, ":")+1:])
	}
	args := []string{"dev", "cluster", "--data-dir", dir, "--api-ports", strings.Join(apiPorts, ","), "--peer-ports", strings.Join(peerPorts, ","), "--etcd-ports", strings.Join(etcdPorts, ","), "--log-level", "warn"}
	eps := strings.Join(apis, ",")

	dev := startDev(t, bin, args...)
	pids := dev.waitReady(t)
	if len(pids) != 3 {
		t.Fatalf("nodes printed: got = %v, expected: 3\n%s", pids, dev.stdout.String())
	}
	if want := "export TENURE_ENDPOINTS=" + eps; !strings.Contains(dev.stdout.String(), want) {
		t.Errorf("stdout got = %q, expected it to contain %q", dev.stdout.String(), want)
	}
	e2etest.Within(t, 5*time.Second, "the etcd endpoints printed", func() bool {
		return strings.Contains(dev.stdout.String(), "export ETCDCTL_API=3 ETCDCTL_ENDPOINTS="+strings.Join(etcds, ","))
	})
	if _, stderr, code := tenureRun(t, bin, "--endpoints", eps, "kv", "put", "dev/k", "before"); code != 0 {
		t.Fatalf("kv put: exit %d: %s", code, stderr)
	}

	_, leader := settled(t, bin, eps, 3, 0, 10*time.Second)
	if err := syscall.Kill(pids[leader], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e2etest.Within(t, 10*time.Second, "report of the killed node", func() bool {
		return strings.Contains(dev.stderr.String(), fmt.Sprintf("%s (pid %d) exited: signal: killed; 2 nodes still run", leader, pids[leader]))
	})
	var stderr string
	e2etest.Within(t, 15*time.Second, "write with the leader killed", func() bool {
		var code int
		_, stderr, code = tenureRun(t, bin, "--endpoints", eps, "kv", "put", "dev/k", "after")
		return code == 0
	})

	dev.signal(syscall.SIGTERM)
	if code := dev.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("dev cluster after SIGTERM: exit code got = %d, expected: 0\nstderr: %s", code, dev.stderr.String())
	}
	for id, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("%s (pid %d) outlived dev cluster", id, pid)
		}
	}

	again := startDev(t, bin, args...)
	again.waitReady(t)
	stdout, stderr, code := tenureRun(t, bin, "--endpoints", eps, "kv", "get", "dev/k")
	if code != 0 || stdout != "after\n" {
		t.Errorf("kv get after the restart: got = exit %d, %q %q, expected: after", code, stdout, stderr)
	}
	again.signal(syscall.SIGINT)
	if code := again.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("dev cluster after SIGINT: exit code got = %d, expected: 0\nstderr: %s", code, again.stderr.String())
	}
}

type devRun struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	exited         chan struct{}
}

func startDev(t *testing.T, bin string, args ...string) *devRun {
	t.Helper()
	d := &devRun{stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.stdout, d.stderr
	setDeathSignal(d.cmd)
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.exited:
			case <-time.After(10 * time.Second):
				_ = d.cmd.Process.Kill()
				<-d.exited
			}
		}
		if t.Failed() {
			t.Logf("dev cluster stdout:\n%s\nstderr:\n%s", d.stdout.String(), d.stderr.String())
		}
	})
	return d
}

// waitReady waits for the ready line and returns each node's pid.
func (d *devRun) waitReady(t *testing.T) map[string]int {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !strings.Contains(d.stdout.String(), "\nready: ") {
		select {
		case <-d.exited:
			t.Fatalf("dev cluster exited before ready: %v\nstderr: %s", d.cmd.ProcessState, d.stderr.String())
		case <-deadline:
			t.Fatalf("dev cluster not ready in 20s:\n%s", d.stdout.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	pids := map[string]int{}
	for _, line := range strings.Split(d.stdout.String(), "\n") {
		var id string
		var pid int
		if _, err := fmt.Sscanf(line, "%s pid %d", &id, &pid); err == nil {
			pids[id] = pid
		}
	}
	return pids
}

func (d *devRun) signal(sig syscall.Signal) { _ = d.cmd.Process.Signal(sig) }

func (d *devRun) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-d.exited:
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("dev cluster still running %v after the signal", timeout)
		return -1
	}
}
