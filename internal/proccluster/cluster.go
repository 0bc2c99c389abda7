package proccluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
)

// binDir holds the tenure binaries, each built at most once per test
// binary run by Binary or BenchBinary and removed by Main.
var (
	binMu  sync.Mutex // guards binDir and bins
	binDir string
	bins   = map[string]*build{} // by build tags
)

type build struct {
	once sync.Once
	path string
	err  error
}

// Main runs the tests, removes the built binaries and fails the run when
// goroutines outlive the tests. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	binMu.Lock()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	binMu.Unlock()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Binary builds cmd/tenure on first use and returns its path. It is not
// built with -race: the nodes are the system under test, not the test.
// When $PROCCLUSTER_BINARY names a file, that is the binary instead:
// scripts/test.sh builds cmd/tenure once for all the packages that start
// processes, where each would otherwise link its own. (Not a TENURE_
// name: the tenure processes the tests start inherit it, and tenure
// warns of a TENURE_ variable it does not read.)
func Binary(t testing.TB) string {
	t.Helper()
	if path := os.Getenv("PROCCLUSTER_BINARY"); path != "" {
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("PROCCLUSTER_BINARY: %v", err)
		}
		return path
	}
	return buildTenure(t, "")
}

// BenchBinary is Binary built with -tags benchsync, whose log store
// sleeps TENURE_BENCH_SYNC_DELAY after every sync (raftnode's
// afterLogSync): a slower disk, for measurements. A release binary never
// has it.
func BenchBinary(t testing.TB) string {
	t.Helper()
	return buildTenure(t, "benchsync")
}

func buildTenure(t testing.TB, tags string) string {
	t.Helper()
	binMu.Lock()
	b := bins[tags]
	if b == nil {
		b = &build{}
		bins[tags] = b
	}
	binMu.Unlock()
	b.once.Do(func() {
		binMu.Lock()
		if binDir == "" {
			binDir, b.err = os.MkdirTemp("", "tenure-proccluster-bin-")
		}
		dir := binDir
		binMu.Unlock()
		if b.err != nil {
			return
		}
		name, args := "tenure", []string{"build"}
		if tags != "" {
			name, args = "tenure-"+tags, append(args, "-tags", tags)
		}
		path := filepath.Join(dir, name)
		args = append(args, "-o", path, "./cmd/tenure")
		// Built in the core module, whose go.sum covers the server, also
		// when the tests are those of another module (e2e/etcd).
		mod, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/tenurehq/tenure").Output()
		if err != nil {
			b.err = fmt.Errorf("find the core module: %w", err)
			return
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = strings.TrimSpace(string(mod))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
			return
		}
		b.path = path
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Cluster is N tenure processes behind proxies. Its methods are meant for
// the test goroutine, except Endpoints, Node accessors and the partition
// methods, which are safe for concurrent use.
type Cluster struct {
	t     testing.TB
	bin   string
	Nodes []*Node

	env []string // added to every node's environment

	mu     sync.Mutex // guards groups, rtt and linkRTT
	groups []int      // partition group per node; clients are in group 0
	// rtt is added to the round trips of every peer link, except the
	// pairs of nodes linkRTT names.
	rtt     time.Duration
	linkRTT map[[2]int]time.Duration // by node pair, lower index first
}

// Node is one tenure process with fixed ports and data dir, so that a
// restart runs the same node.
type Node struct {
	c     *Cluster
	Index int
	// API is the address clients and other nodes reach the node at (its
	// proxy); Direct is its real listener, for the test's own probes.
	API, Direct string
	// Peer is the raft address other nodes dial (its proxy), also the
	// node's raft ID.
	Peer       string
	peerListen string
	// Etcd is the address etcd clients reach the node's etcd API at (its
	// proxy, which partitions cut like the others); etcdListen is the
	// node's own listener.
	Etcd                string
	etcdListen          string
	dataDir, logPath    string
	apiProxy, peerProxy *proxy
	etcdProxy           *proxy
	args                []string
	starts              int

	mu     sync.Mutex // guards cmd, exited and pid
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	pid    int
}

// Start runs n nodes that form one cluster (--bootstrap-expect n, each
// joining the others), with extra added to every node's command line,
// and returns once every node is ready and one leads. Cleanup kills them
// and prints the tail of each node's log if the test failed.
func Start(t testing.TB, n int, extra ...string) *Cluster {
	t.Helper()
	return StartWith(t, n, WithArgs(extra...))
}

// StartWith is Start with options.
func StartWith(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c := &Cluster{t: t, groups: make([]int, n), rtt: o.peerRTT}
	if o.syncDelay > 0 {
		c.bin = BenchBinary(t)
		c.env = []string{"TENURE_BENCH_SYNC_DELAY=" + o.syncDelay.String()}
	} else {
		c.bin = Binary(t)
	}
	extra := o.args
	dir := t.TempDir()
	// The proxies' listeners first, held from here on: the ports FreeN
	// releases could otherwise be handed to a proxy (node 2's peer proxy
	// once took node 1's --peer-listen port, and node 1 could not bind).
	lns := make([]net.Listener, 3*n)
	for i := range lns {
		lns[i] = testnet.Listen(t)
	}
	free := testnet.FreeN(t, 3*n)
	for i := range n {
		node := &Node{
			c:          c,
			Index:      i,
			Direct:     free[3*i],
			peerListen: free[3*i+1],
			etcdListen: free[3*i+2],
			dataDir:    filepath.Join(dir, fmt.Sprintf("node%d", i)),
			logPath:    filepath.Join(dir, fmt.Sprintf("node%d.log", i)),
		}
		node.API, node.Peer, node.Etcd = lns[3*i].Addr().String(), lns[3*i+1].Addr().String(), lns[3*i+2].Addr().String()
		c.Nodes = append(c.Nodes, node)
	}
	// Proxies start once c.Nodes is complete: they read it.
	for i, node := range c.Nodes {
		node.apiProxy = newProxy(c, i, lns[3*i], node.Direct, false)
		node.peerProxy = newProxy(c, i, lns[3*i+1], node.peerListen, true)
		node.etcdProxy = newProxy(c, i, lns[3*i+2], node.etcdListen, false)
	}
	for _, node := range c.Nodes {
		var join []string
		for _, other := range c.Nodes {
			if other != node {
				join = append(join, other.API)
			}
		}
		node.args = append([]string{"serve",
			"--listen", node.Direct, "--advertise", node.API,
			"--peer-listen", node.peerListen, "--peer-advertise", node.Peer,
			"--etcd-listen", node.etcdListen, "--etcd-advertise", node.Etcd,
			"--data-dir", node.dataDir,
			"--bootstrap-expect", fmt.Sprint(n), "--join", strings.Join(join, ","),
		}, extra...)
	}
	t.Cleanup(func() {
		for _, node := range c.Nodes {
			node.Kill()
		}
		for _, node := range c.Nodes {
			node.apiProxy.close()
			node.peerProxy.close()
			node.etcdProxy.close()
		}
		if t.Failed() {
			for _, node := range c.Nodes {
				t.Logf("node %d log (last lines of %s):\n%s", node.Index, node.logPath, Tail(node.logPath, 60))
			}
		}
	})
	for _, node := range c.Nodes {
		node.launch()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, node := range c.Nodes {
		node.WaitReady(ctx)
	}
	c.WaitLeader(ctx)
	return c
}

// Endpoints are the nodes' API (proxy) addresses, rotated to start at
// node first, so that clients given different rotations start on
// different nodes.
func (c *Cluster) Endpoints(first int) []string {
	var out []string
	for i := range c.Nodes {
		out = append(out, c.Nodes[(first+i)%len(c.Nodes)].API)
	}
	return out
}

// EtcdEndpoints are the nodes' etcd API (proxy) addresses, rotated as
// Endpoints are.
func (c *Cluster) EtcdEndpoints(first int) []string {
	var out []string
	for i := range c.Nodes {
		out = append(out, c.Nodes[(first+i)%len(c.Nodes)].Etcd)
	}
	return out
}

// --- processes ---

func (n *Node) launch() {
	t := n.c.t
	t.Helper()
	n.starts++
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %d at %s: %s %s\n", n.starts, time.Now().Format(time.StampMilli), strings.Join(append(slices.Clone(n.c.env), n.c.bin), " "), strings.Join(n.args, " "))
	if err := n.apiProxy.listen(); err != nil {
		f.Close()
		t.Fatalf("node %d: listen for clients again: %v", n.Index, err)
	}
	if err := n.etcdProxy.listen(); err != nil {
		f.Close()
		t.Fatalf("node %d: listen for etcd clients again: %v", n.Index, err)
	}
	cmd := exec.Command(n.c.bin, n.args...)
	if n.c.env != nil {
		cmd.Env = append(os.Environ(), n.c.env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	setDeathSignal(cmd)
	err = cmd.Start()
	f.Close() // the child has its own descriptor
	if err != nil {
		t.Fatalf("start node %d: %v", n.Index, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.mu.Lock()
	n.cmd, n.exited, n.pid = cmd, exited, cmd.Process.Pid
	n.mu.Unlock()
}

// Restart starts the node again with the same command line and data dir
// and returns once it is ready (it knows a leader, or leads and has
// caught up). The node must have been stopped or killed.
func (n *Node) Restart(ctx context.Context) {
	n.c.t.Helper()
	if n.Running() {
		n.c.t.Fatalf("restart node %d: it is still running", n.Index)
	}
	n.launch()
	n.WaitReady(ctx)
}

// DataDir is the node's --data-dir, for tests that damage what it keeps.
func (n *Node) DataDir() string { return n.dataDir }

// LogPath is the file the node's output goes to.
func (n *Node) LogPath() string { return n.logPath }

// Running reports whether the node's process is alive (maybe stopped).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// PID is the node's process ID, 0 when it does not run.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.pid
}

// Kill sends SIGKILL (after SIGCONT, should it be paused) and waits for
// the process to be gone. Safe to call when nothing runs.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
	n.apiProxy.refuse()
	n.etcdProxy.refuse()
}

// Stop sends SIGTERM and waits for the node to exit by itself: a clean
// shutdown, which hands leadership over first. It fails the test when the
// node needs more than timeout.
func (n *Node) Stop(timeout time.Duration) {
	t := n.c.t
	t.Helper()
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		t.Errorf("node %d did not exit within %v of SIGTERM; killing it", n.Index, timeout)
	}
	n.Kill()
	if st := cmd.ProcessState; st != nil && !st.Success() {
		t.Errorf("node %d exit after SIGTERM: got = %v, expected: exit status 0", n.Index, st)
	}
}

// Pause stops the process with SIGSTOP: alive, holding its connections,
// answering nothing. Resume continues it.
func (n *Node) Pause()  { n.signal(syscall.SIGSTOP) }
func (n *Node) Resume() { n.signal(syscall.SIGCONT) }

func (n *Node) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		if err := n.cmd.Process.Signal(sig); err != nil {
			n.c.t.Errorf("signal %v to node %d: %v", sig, n.Index, err)
		}
	}
}

// WaitReady polls the node's /readyz until it answers 200.
func (n *Node) WaitReady(ctx context.Context) {
	t := n.c.t
	t.Helper()
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	begin := time.Now()
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	for {
		resp, err := hc.Get("http://" + n.Direct + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("node %d start %d: exited before ready", n.Index, n.starts)
		case <-ctx.Done():
			t.Fatalf("node %d start %d: not ready after %v", n.Index, n.starts, time.Since(begin).Round(time.Millisecond))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// Status asks the node itself (directly, past the proxies) for its raft
// status.
func (n *Node) Status(ctx context.Context) (*tenurev1.StatusResponse, error) {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	cl := tenurev1connect.NewClusterServiceClient(hc, "http://"+n.Direct)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := cl.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// Leader returns the index of the node that says it leads and is ready,
// among the running ones not in except, or -1.
func (c *Cluster) Leader(ctx context.Context, except ...int) int {
	for _, n := range c.Nodes {
		if !n.Running() || contains(except, n.Index) {
			continue
		}
		if st, err := n.Status(ctx); err == nil && st.GetRole() == "leader" && st.GetReady() {
			return n.Index
		}
	}
	return -1
}

// WaitLeader polls until a node other than those in except leads and is
// ready, and returns its index.
func (c *Cluster) WaitLeader(ctx context.Context, except ...int) int {
	c.t.Helper()
	begin := time.Now()
	for {
		if i := c.Leader(ctx, except...); i >= 0 {
			return i
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("no leader (other than %v) after %v", except, time.Since(begin).Round(time.Millisecond))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// WaitCaughtUp polls until every running node has applied the leader's
// revision as of the call (stale reads on each then see every write
// acknowledged before it).
func (c *Cluster) WaitCaughtUp(ctx context.Context) {
	c.t.Helper()
	leader := c.WaitLeader(ctx)
	st, err := c.Nodes[leader].Status(ctx)
	if err != nil {
		c.t.Fatalf("status of leader %d: %v", leader, err)
	}
	want := st.GetRevision()
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		for {
			st, err := n.Status(ctx)
			if err == nil && st.GetRevision() >= want {
				break
			}
			select {
			case <-ctx.Done():
				c.t.Fatalf("node %d never caught up to revision %d: last status %v, err %v", n.Index, want, st, err)
			case <-time.After(25 * time.Millisecond):
			}
		}
	}
}

// --- partitions ---

// Isolate cuts node i off from every other node and from clients: its
// proxies refuse and close connections from anyone, and other nodes'
// proxies those its process opened. The test is skipped where a proxy
// cannot tell which process dialed it.
func (c *Cluster) Isolate(i int) {
	c.t.Helper()
	if !canIdentify {
		c.t.Skip("partitions need Linux's /proc to tell which node dialed a proxy")
	}
	c.mu.Lock()
	c.groups[i] = i + 1
	c.mu.Unlock()
	c.enforce()
}

// Heal puts every node back in one partition with the clients.
func (c *Cluster) Heal() {
	c.mu.Lock()
	for i := range c.groups {
		c.groups[i] = 0
	}
	c.mu.Unlock()
}

// enforce closes the connections the partition forbids, attributing
// the unattributed ones from one scan of /proc.
func (c *Cluster) enforce() {
	owners := c.owners()
	for _, n := range c.Nodes {
		n.apiProxy.enforce(owners)
		n.peerProxy.enforce(owners)
		n.etcdProxy.enforce(owners)
	}
}

// partitioned reports whether any node is cut off.
func (c *Cluster) partitioned() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range c.groups {
		if g != 0 {
			return true
		}
	}
	return false
}

// allowed reports whether a connection from (a node index, or external)
// to node to may be forwarded.
func (c *Cluster) allowed(from, to int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch from {
	case unknown:
		// Links are attributed before anything is cut off; until then
		// everything may pass.
		for _, g := range c.groups {
			if g != 0 {
				return false
			}
		}
		return true
	case external:
		return c.groups[to] == 0
	}
	return c.groups[from] == c.groups[to]
}

// dialer returns the index of the node whose process opened the
// connection from 127.0.0.1:remotePort to a proxy on proxyPort, or
// external.
func (c *Cluster) dialer(remotePort, proxyPort int) int {
	return c.owners()(remotePort, proxyPort)
}

// owners scans /proc once and returns a lookup of the node (or external)
// that opened a connection from 127.0.0.1:remotePort to proxyPort.
func (c *Cluster) owners() func(remotePort, proxyPort int) int {
	var pids []int
	index := map[int]int{}
	for _, n := range c.Nodes {
		if pid := n.PID(); pid != 0 {
			pids = append(pids, pid)
			index[pid] = n.Index
		}
	}
	sockets, err := socketOwners(pids)
	return func(remotePort, proxyPort int) int {
		if err != nil {
			return external
		}
		if pid, ok := sockets[[2]int{remotePort, proxyPort}]; ok {
			return index[pid]
		}
		return external
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Tail is the last n lines of the file at path, or why it cannot be read:
// for showing a node's log when a test fails.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
