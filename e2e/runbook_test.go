package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testnet"
)

// runbookBudget bounds the whole runbook; its steps take about 15 s.
const runbookBudget = 90 * time.Second

// TestRunbook runs the runbook of docs/operations.md as an operator on one
// machine would: every marked shell block, in order, in one bash session,
// with only the variables of the first block changed to free ports and
// temporary directories. After each step it checks what the step did, so
// the runbook cannot drift from the product.
func TestRunbook(t *testing.T) {
	t.Parallel() // its own processes, mostly waiting: it runs beside the package's other slow tests
	if testing.Short() {
		t.Skip("builds the server and runs a cluster of processes")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := runbookBlocks(t, string(doc))
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), runbookBudget)
	defer cancel()

	dir := t.TempDir()
	rb := &runbookRun{dir: dir, vars: map[string]string{"BACKUP": filepath.Join(dir, "tenure.snap")}}
	free := testnet.FreeN(t, 8)
	for i := 1; i <= 4; i++ {
		rb.vars[fmt.Sprintf("N%d", i)] = free[2*i-2]
		rb.vars[fmt.Sprintf("P%d", i)] = free[2*i-1]
		rb.vars[fmt.Sprintf("D%d", i)] = filepath.Join(dir, fmt.Sprintf("node%d", i))
	}

	// Each step of the doc, in the doc's order, with what it must achieve.
	// A block the test does not know, or one it misses, fails the test.
	steps := []struct {
		name   string
		before func(t *testing.T, ctx context.Context)
		check  func(t *testing.T, ctx context.Context, out string)
	}{
		{name: "vars"},
		{name: "start", check: rb.checkStart},
		{name: "grow", check: rb.checkGrow},
		{name: "monitor", check: rb.checkMonitor},
		{name: "upgrade-1", before: rb.startLoad, check: rb.checkUpgraded(1)},
		{name: "upgrade-2", check: rb.checkUpgraded(2)},
		{name: "upgrade-3", check: rb.checkUpgraded(3)},
		{name: "replace", check: rb.checkReplace},
		{name: "shrink", before: rb.leadFromALeavingNode, check: rb.checkShrink},
		{name: "backup", check: rb.checkBackup},
		{name: "restore", check: rb.checkRestore},
	}
	var names []string
	for _, b := range blocks {
		if b.name != "hosts" {
			names = append(names, b.name)
		}
	}
	var want []string
	for _, s := range steps {
		want = append(want, s.name)
	}
	if !slices.Equal(names, want) {
		t.Fatalf("runbook steps got = %v, expected: %v (a new step needs a check here)", names, want)
	}
	checkHostsBlock(t, blocks)

	sh := startShell(t, ctx, bin, dir)
	t.Cleanup(func() {
		if t.Failed() {
			rb.dumpLogs(t)
		}
	})
	for _, b := range blocks {
		if b.name == "hosts" {
			continue
		}
		i := slices.Index(want, b.name)
		script := b.script
		if b.name == "vars" {
			script = rb.substitute(t, script)
		}
		if steps[i].before != nil {
			steps[i].before(t, ctx)
		}
		began := time.Now()
		out := sh.run(t, ctx, b.name, script)
		t.Logf("step %s took %v and printed:\n%s", b.name, time.Since(began).Round(time.Millisecond), out)
		if steps[i].check != nil {
			steps[i].check(t, ctx, out)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}

// runbookBlock is one marked shell block of the runbook.
type runbookBlock struct {
	name, script string
	line         int
}

// runbookBlocks returns the blocks between <!-- runbook:NAME --> and
// <!-- /runbook --> in the doc's order, and fails the test if the
// "## Runbook" section holds a shell block that is not marked: every
// command of the runbook is run.
func runbookBlocks(t *testing.T, doc string) []runbookBlock {
	t.Helper()
	var blocks []runbookBlock
	lines := strings.Split(doc, "\n")
	inRunbook, shBlocks := false, 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "## ") {
			inRunbook = line == "## Runbook"
		}
		if inRunbook && line == "```sh" {
			shBlocks++
		}
		name, ok := strings.CutPrefix(line, "<!-- runbook:")
		if !ok {
			continue
		}
		name, ok = strings.CutSuffix(name, " -->")
		if !ok || i+1 >= len(lines) || lines[i+1] != "```sh" {
			t.Fatalf("operations.md:%d: %q must be followed by a ```sh line", i+1, line)
		}
		if !inRunbook {
			t.Fatalf("operations.md:%d: %q is outside the ## Runbook section", i+1, line)
		}
		shBlocks++
		b := runbookBlock{name: name, line: i + 1}
		var script []string
		for i += 2; i < len(lines) && lines[i] != "```"; i++ {
			script = append(script, lines[i])
		}
		if i+1 >= len(lines) || lines[i+1] != "<!-- /runbook -->" {
			t.Fatalf("operations.md:%d: block %s is not closed by <!-- /runbook --> after its ```", b.line, name)
		}
		b.script = strings.Join(script, "\n") + "\n"
		blocks = append(blocks, b)
	}
	if len(blocks) != shBlocks {
		t.Fatalf("operations.md's Runbook has %d sh blocks and %d marked ones, expected: every one marked <!-- runbook:NAME -->", shBlocks, len(blocks))
	}
	return blocks
}

// checkHostsBlock checks that the real-machines block, which is not run,
// names the same variables as the one-machine block, which is.
func checkHostsBlock(t *testing.T, blocks []runbookBlock) {
	t.Helper()
	var vars, hosts []string
	for _, b := range blocks {
		switch b.name {
		case "vars":
			vars = assignedNames(b.script)
		case "hosts":
			hosts = assignedNames(b.script)
		}
	}
	if !slices.Equal(vars, hosts) {
		t.Errorf("variables of the hosts block got = %v, expected: those of the vars block, %v", hosts, vars)
	}
}

var assignment = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$`)

// assignedNames lists the variables a block assigns, in order.
func assignedNames(script string) []string {
	var names []string
	for _, line := range strings.Split(script, "\n") {
		line = strings.TrimPrefix(line, "export ")
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, word := range strings.Fields(line) {
			if m := assignment.FindStringSubmatch(word); m != nil {
				names = append(names, m[1])
			}
		}
	}
	return names
}

// runbookRun holds what the steps share: the variables given to the
// shell, and what earlier steps saw that later checks compare with.
type runbookRun struct {
	dir  string
	vars map[string]string

	load struct {
		cancel context.CancelFunc
		wg     sync.WaitGroup
		ok     atomic.Int64
		failed atomic.Int64
		mu     sync.Mutex // guards first
		first  error
	}
	backupRevision int64
}

// substitute gives the variables of the vars block the test's values;
// lines that assign nothing (export TENURE_ENDPOINTS=$N1,...) stay as
// written.
func (rb *runbookRun) substitute(t *testing.T, script string) string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "export ") {
			out = append(out, line)
			continue
		}
		var words []string
		for _, word := range strings.Fields(line) {
			m := assignment.FindStringSubmatch(word)
			if m == nil {
				t.Fatalf("vars block: %q is not NAME=VALUE", word)
			}
			v, ok := rb.vars[m[1]]
			if !ok {
				t.Fatalf("vars block: the test has no value for %s", m[1])
			}
			words = append(words, m[1]+"="+v)
		}
		out = append(out, strings.Join(words, " "))
	}
	return strings.Join(out, "\n")
}

// members asks the node at endpoint alone for the cluster's members.
func (rb *runbookRun) members(ctx context.Context, endpoint string) ([]client.Member, error) {
	c, err := client.New(ctx, []string{endpoint})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.Members(ctx)
}

// expectMembers waits up to 10 s until the node at endpoint lists exactly
// the members ids, every one a reachable voter, one of them the leader,
// and each having applied what the leader had committed when first seen.
// It returns the leader's ID.
func (rb *runbookRun) expectMembers(t *testing.T, ctx context.Context, endpoint string, ids ...string) string {
	t.Helper()
	slices.Sort(ids)
	var commit uint64
	var last error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ms, err := rb.members(ctx, endpoint)
		last = err
		if err == nil {
			last = nil
			var got []string
			leader := ""
			for _, m := range ms {
				got = append(got, m.ID)
				switch {
				case !m.Voter:
					last = fmt.Errorf("member %s is not a voter", m.ID)
				case !m.Reachable():
					last = fmt.Errorf("member %s is unreachable: %s", m.ID, m.Err)
				case m.Role == "leader":
					leader = m.ID
					if commit == 0 {
						commit = m.CommitIndex
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, ids) {
				last = fmt.Errorf("members got = %v, expected: %v", got, ids)
			} else if last == nil && leader == "" {
				last = errors.New("no member leads")
			}
			for _, m := range ms {
				if last == nil && m.AppliedIndex < commit {
					last = fmt.Errorf("member %s applied %d, expected: at least the leader's commit index %d", m.ID, m.AppliedIndex, commit)
				}
			}
			if last == nil {
				return leader
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("asking %s: %v", endpoint, last)
	return ""
}

func (rb *runbookRun) checkStart(t *testing.T, ctx context.Context, out string) {
	leader := rb.expectMembers(t, ctx, rb.vars["N1"], rb.vars["P1"])
	if leader != rb.vars["P1"] {
		t.Errorf("leader got = %s, expected: %s", leader, rb.vars["P1"])
	}
	expectLines(t, out, "ok", "OK")
}

func (rb *runbookRun) checkGrow(t *testing.T, ctx context.Context, out string) {
	// Asked of the newest node, which must know the key written before it
	// joined.
	rb.expectMembers(t, ctx, rb.vars["N3"], rb.vars["P1"], rb.vars["P2"], rb.vars["P3"])
	rb.expectKey(t, ctx, rb.vars["N3"], "runbook/hello", "world")
}

func (rb *runbookRun) expectKey(t *testing.T, ctx context.Context, endpoint, key, value string) {
	t.Helper()
	c, err := client.New(ctx, []string{endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kv, err := c.KV().Get(ctx, key)
	if err != nil || kv.Value != value {
		t.Errorf("get %s from %s: got = %q, %v, expected: %q", key, endpoint, kv.Value, err, value)
	}
}

func (rb *runbookRun) checkMonitor(t *testing.T, ctx context.Context, out string) {
	for _, n := range []string{"N1", "N2", "N3"} {
		expectLines(t, out, rb.vars[n]+" ok")
	}
	leaders, followers := 0, 0
	for _, line := range strings.Split(out, "\n") {
		switch line {
		case "tenure_raft_is_leader 1":
			leaders++
		case "tenure_raft_is_leader 0":
			followers++
		}
	}
	if leaders != 1 || followers != 2 {
		t.Errorf("tenure_raft_is_leader got = %d nodes at 1 and %d at 0, expected: 1 and 2\n%s", leaders, followers, out)
	}
	for _, series := range []string{"tenure_raft_applied_index", "tenure_raft_disk_full", "tenure_forwarded_calls_total", "tenure_lessor_sessions", "tenure_lessor_heartbeats_total"} {
		if n := strings.Count(out, "\n"+series+" "); n != 3 {
			t.Errorf("series %s got = on %d nodes, expected: on 3\n%s", series, n, out)
		}
	}
}

// startLoad writes a key through the three nodes until checkUpgrade stops
// it: a rolling upgrade must cost these calls nothing.
func (rb *runbookRun) startLoad(t *testing.T, ctx context.Context) {
	c, err := client.New(ctx, []string{rb.vars["N1"], rb.vars["N2"], rb.vars["N3"]})
	if err != nil {
		t.Fatal(err)
	}
	ctx, rb.load.cancel = context.WithCancel(ctx)
	t.Cleanup(rb.stopLoad)
	rb.load.wg.Go(func() {
		defer c.Close()
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := c.KV().Put(context.WithoutCancel(ctx), "runbook/load", strconv.Itoa(i)); err != nil {
				if rb.load.failed.Add(1) == 1 {
					rb.load.mu.Lock()
					rb.load.first = err
					rb.load.mu.Unlock()
				}
			} else {
				rb.load.ok.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

// stopLoad stops the load and waits for it; safe to call twice.
func (rb *runbookRun) stopLoad() {
	if rb.load.cancel != nil {
		rb.load.cancel()
		rb.load.wg.Wait()
	}
}

// checkUpgraded returns the check of the upgrade step that restarts node
// n: it was stopped and started again, and is back as a voter that has
// caught up, before the next is stopped. After the last node, the load
// must have seen no error.
func (rb *runbookRun) checkUpgraded(n int) func(t *testing.T, ctx context.Context, out string) {
	return func(t *testing.T, ctx context.Context, out string) {
		d := fmt.Sprintf("D%d", n)
		log, err := os.ReadFile(rb.vars[d] + ".log")
		if err != nil {
			t.Fatal(err)
		}
		if starts := strings.Count(string(log), `msg="tenure serving"`); starts != 2 {
			t.Errorf("%s.log: starts got = %d, expected: 2", d, starts)
		}
		rb.expectMembers(t, ctx, rb.vars[fmt.Sprintf("N%d", n)], rb.vars["P1"], rb.vars["P2"], rb.vars["P3"])
		if n == 1 {
			expectLines(t, out, "ops/upgrade-canary held by")
		}
		if n < 3 {
			return
		}
		rb.stopLoad()
		if failed := rb.load.failed.Load(); failed > 0 {
			rb.load.mu.Lock()
			defer rb.load.mu.Unlock()
			t.Errorf("%d of %d puts failed during the upgrade, the first: %v", failed, failed+rb.load.ok.Load(), rb.load.first)
		}
		if ok := rb.load.ok.Load(); ok < 50 {
			t.Errorf("puts during the upgrade got = %d, expected: at least 50", ok)
		}
	}
}

func (rb *runbookRun) checkReplace(t *testing.T, ctx context.Context, out string) {
	rb.expectMembers(t, ctx, rb.vars["N4"], rb.vars["P1"], rb.vars["P2"], rb.vars["P4"])
	expectLines(t, out, "removed member "+rb.vars["P3"])
	if !strings.Contains(out, "unreachable") {
		t.Errorf("tenure members after kill -9: got =\n%s\nexpected: node 3 unreachable", out)
	}
}

// leadFromALeavingNode makes node 4, which the shrink step removes, the
// leader, so that the step's transfer-leadership has work to do.
func (rb *runbookRun) leadFromALeavingNode(t *testing.T, ctx context.Context) {
	c, err := client.New(ctx, []string{rb.vars["N1"]})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if leader, err := c.TransferLeadership(ctx, rb.vars["P4"]); err != nil || leader != rb.vars["P4"] {
		t.Fatalf("transfer leadership to node 4: got = %q, %v, expected: %s", leader, err, rb.vars["P4"])
	}
}

func (rb *runbookRun) checkShrink(t *testing.T, ctx context.Context, out string) {
	leader := rb.expectMembers(t, ctx, rb.vars["N1"], rb.vars["P1"])
	if leader != rb.vars["P1"] {
		t.Errorf("leader got = %s, expected: %s", leader, rb.vars["P1"])
	}
	expectLines(t, out, "leader is now "+rb.vars["P1"], "removed member "+rb.vars["P4"], "removed member "+rb.vars["P2"])
}

var savedRevision = regexp.MustCompile(`(?m)^saved revision (\d+) to (\S+) \(\d+ bytes\)$`)

func (rb *runbookRun) checkBackup(t *testing.T, ctx context.Context, out string) {
	m := savedRevision.FindStringSubmatch(out)
	if m == nil || m[2] != rb.vars["BACKUP"] {
		t.Fatalf("snapshot save printed %q, expected: saved revision R to %s (N bytes)", out, rb.vars["BACKUP"])
	}
	rb.backupRevision, _ = strconv.ParseInt(m[1], 10, 64)
	if fi, err := os.Stat(rb.vars["BACKUP"]); err != nil || fi.Size() == 0 {
		t.Errorf("backup file: %v, expected: a non-empty file", err)
	}
}

var grantedToken = regexp.MustCompile(`(?m)^granted with token (\d+)$`)

func (rb *runbookRun) checkRestore(t *testing.T, ctx context.Context, out string) {
	leader := rb.expectMembers(t, ctx, rb.vars["N1"], rb.vars["P1"])
	if leader != rb.vars["P1"] {
		t.Errorf("leader got = %s, expected: %s", leader, rb.vars["P1"])
	}
	rb.expectKey(t, ctx, rb.vars["N1"], "runbook/hello", "world")
	expectLines(t, out, "world")
	if !regexp.MustCompile(`(?m)^ops +upgrade-canary `).MatchString(out) {
		t.Errorf("tenure get leases -A after the restore: got =\n%s\nexpected: ops/upgrade-canary listed", out)
	}
	m := grantedToken.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("tenure lock after the restore printed no token:\n%s", out)
	}
	if tok, _ := strconv.ParseInt(m[1], 10, 64); tok <= rb.backupRevision {
		t.Errorf("token after the restore got = %d, expected: above the backup's revision %d", tok, rb.backupRevision)
	}
}

// dumpLogs prints every node's log, for a failed run.
func (rb *runbookRun) dumpLogs(t *testing.T) {
	logs, _ := filepath.Glob(filepath.Join(rb.dir, "*.log"))
	for _, path := range logs {
		b, _ := os.ReadFile(path)
		t.Logf("%s:\n%s", filepath.Base(path), b)
	}
}

// expectLines fails the test unless out has a line starting with each of
// prefixes.
func expectLines(t *testing.T, out string, prefixes ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, p := range prefixes {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, p) }) {
			t.Errorf("output got =\n%s\nexpected: a line starting with %q", out, p)
		}
	}
}

// runbookShell is one bash session that runs the steps in turn, as an
// operator's terminal would: the background jobs of one step (the nodes)
// are still its children in the next.
type runbookShell struct {
	stdin interface {
		Write([]byte) (int, error)
	}
	lines chan string // the session's stdout and stderr; closed at their end
	exit  chan error  // bash's exit, once
}

// startShell starts bash -euo pipefail in dir with bin's directory first
// on PATH, in a process group of its own. A cleanup kills the whole group
// — bash and every node it started — and waits for it.
func startShell(t *testing.T, ctx context.Context, bin, dir string) *runbookShell {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-euo", "pipefail")
	cmd.Dir = dir
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	setDeathSignal(cmd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	lines := make(chan string, 1024)
	sh := &runbookShell{stdin: stdin, lines: lines, exit: make(chan error, 1)}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	})
	wg.Go(func() { sh.exit <- cmd.Wait() })
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		stdin.Close()
		pr.Close() // in case a process left the group and holds the pipe
		for range lines {
		}
		wg.Wait()
	})
	return sh
}

// run runs one step's script and returns what it printed. It fails the
// test if the script fails (bash -e then exits) or ctx ends first.
func (sh *runbookShell) run(t *testing.T, ctx context.Context, name, script string) string {
	t.Helper()
	done := "@@runbook step " + name + " done"
	if _, err := fmt.Fprintf(sh.stdin, "%s\nprintf '\\n%%s\\n' '%s'\n", script, done); err != nil {
		t.Fatalf("step %s: write to bash: %v", name, err)
	}
	var out []string
	lines := sh.lines
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				lines = nil // the output ended; bash's exit follows
				continue
			}
			if line == done {
				return strings.TrimSuffix(strings.Join(out, "\n"), "\n")
			}
			out = append(out, line)
		case err := <-sh.exit:
			// What it printed last may still be in the pipe.
			for drain := time.After(200 * time.Millisecond); lines != nil; {
				select {
				case line, ok := <-lines:
					if !ok {
						lines = nil
						break
					}
					out = append(out, line)
				case <-drain:
					lines = nil
				}
			}
			t.Fatalf("step %s failed: bash exited (%v); it printed:\n%s\nthe step:\n%s", name, err, strings.Join(out, "\n"), script)
		case <-ctx.Done():
			t.Fatalf("step %s: still running after the runbook's budget of %v; it printed:\n%s", name, runbookBudget, strings.Join(out, "\n"))
		}
	}
}
