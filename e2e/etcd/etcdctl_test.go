//go:build linux

package etcd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEtcdctl runs Debian's etcdctl, as a user would, against etcd and
// against Tenure, one scenario per subtest on a fresh server pair, and
// requires the same output from both once what must differ (cluster and
// member IDs, the lease IDs each server picks, raft term and index, db
// size, versions, addresses) is normalised.
func TestEtcdctl(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	if _, err := exec.LookPath("etcdctl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
		}
		t.Skipf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	for _, sc := range []struct {
		name string
		run  func(c *ctl)
	}{
		{"kv", ctlKV},
		{"txn", ctlTxn},
		{"watch", ctlWatch},
		{"lease", ctlLease},
		{"lock", ctlLock},
		{"elect", ctlElect},
		{"maintenance", ctlMaintenance},
		{"bytes", ctlBytes},
		{"auth", ctlAuth},
	} {
		t.Run(sc.name, func(t *testing.T) {
			ref, sut, ok := pair(t)
			want := transcript(t, ref, sc.run)
			if !ok {
				t.Logf("etcd's transcript:\n%s", want)
				return
			}
			got := transcript(t, sut, sc.run)
			compareTranscripts(t, want, got)
		})
	}
}

// compareTranscripts fails the test with the first differing lines and
// both transcripts.
func compareTranscripts(t *testing.T, want, got string) {
	t.Helper()
	if want == got {
		return
	}
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(wl) && i < len(gl) && wl[i] == gl[i] {
		i++
	}
	line := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end)"
	}
	t.Errorf("etcdctl output differs at line %d:\n  etcd:   %q\n  tenure: %q\n--- etcd:\n%s\n--- tenure:\n%s",
		i+1, line(wl), line(gl), want, got)
}

// transcript runs a scenario against one server and returns what it
// printed, normalised.
func transcript(t *testing.T, tg target, run func(c *ctl)) string {
	t.Helper()
	c := &ctl{t: t, tg: tg}
	defer c.stopAll()
	run(c)
	return normalise(c.out.String(), tg.addr)
}

// ctl runs etcdctl against one server and records what it prints.
type ctl struct {
	t   *testing.T
	tg  target
	out strings.Builder
	bgs []*bgCmd
}

func (c *ctl) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "etcdctl", append([]string{"--endpoints", c.tg.addr}, args...)...)
	// etcdctl's 5 s for a request is short for a real etcd on a machine
	// the whole test run keeps busy: one timed out on a bcrypt hash while
	// Tenure answered, and the transcripts differed (etcd's flake, not a
	// difference). Each test's own context still bounds the command.
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3", "ETCDCTL_COMMAND_TIMEOUT=30s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// run runs etcdctl to its end and records the command, its output (the
// client's own JSON log lines left out) and a non-zero exit status.
func (c *ctl) run(args ...string) { c.runIn("", args...) }

// runSorted is run for a command that lists in no particular order: its
// lines after the first are marked to be sorted once normalised.
func (c *ctl) runSorted(args ...string) {
	fmt.Fprintf(&c.out, "$ etcdctl %s\n", strings.Join(args, " "))
	out, code := c.exec("", args...)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i := 1; i < len(lines); i++ {
		lines[i] = sortMark + lines[i]
	}
	c.out.WriteString(strings.Join(lines, "\n") + "\n")
	if code != 0 {
		fmt.Fprintf(&c.out, "(exit %d)\n", code)
	}
}

// runIn is run with stdin.
func (c *ctl) runIn(stdin string, args ...string) {
	fmt.Fprintf(&c.out, "$ etcdctl %s\n", strings.Join(args, " "))
	out, code := c.exec(stdin, args...)
	c.out.WriteString(out)
	if code != 0 {
		fmt.Fprintf(&c.out, "(exit %d)\n", code)
	}
}

// exec runs etcdctl and returns its output, without recording it.
func (c *ctl) exec(stdin string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := c.command(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		c.t.Errorf("%s: etcdctl %s: still running after 20s", c.tg.name, strings.Join(args, " "))
	}
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return stdout.String() + dropLogLines(stderr.String()), code
}

// waitFor runs etcdctl until its output satisfies ok, without recording
// it: a scenario's way to wait for a background command's effect.
func (c *ctl) waitFor(what string, ok func(out string) bool, args ...string) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := c.exec("", args...)
		if ok(out) {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(&c.out, "(gave up waiting for %s; last output %q)\n", what, out)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dropLogLines removes clientv3's JSON log lines (timestamps, random
// target names) from etcdctl's stderr.
func dropLogLines(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if !strings.HasPrefix(l, `{"level":`) && l != "" {
			b.WriteString(l)
		}
	}
	return b.String()
}

// bgCmd is an etcdctl that runs in the background (watch, elect, lock
// without a command), its output lines read as they come.
type bgCmd struct {
	n      int
	cmd    *exec.Cmd
	lines  chan string
	exited chan struct{}
	cancel context.CancelFunc
}

// bg starts etcdctl in the background.
func (c *ctl) bg(args ...string) *bgCmd {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	b := &bgCmd{n: len(c.bgs) + 1, lines: make(chan string, 1024), exited: make(chan struct{}), cancel: cancel}
	fmt.Fprintf(&c.out, "$ etcdctl %s & (#%d)\n", strings.Join(args, " "), b.n)
	b.cmd = c.command(ctx, args...)
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := b.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.bgs = append(c.bgs, b)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			b.lines <- sc.Text()
		}
		close(b.lines)
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	return b
}

// expect records n lines of a background command's output, or what came
// before it stopped printing for 15 seconds.
func (c *ctl) expect(b *bgCmd, n int) {
	for range n {
		select {
		case l, ok := <-b.lines:
			if !ok {
				fmt.Fprintf(&c.out, "#%d exited\n", b.n)
				return
			}
			fmt.Fprintf(&c.out, "#%d: %s\n", b.n, l)
		case <-time.After(15 * time.Second):
			fmt.Fprintf(&c.out, "#%d: (no line within 15s)\n", b.n)
			return
		}
	}
}

// interrupt sends SIGINT, as a user's ^C, and waits for the command to
// exit, discarding what it prints meanwhile.
func (c *ctl) interrupt(b *bgCmd) {
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	go func() {
		for range b.lines {
		}
	}()
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(&c.out, "#%d: (still running 10s after SIGINT)\n", b.n)
		b.cancel()
		<-b.exited
	}
}

func (c *ctl) stopAll() {
	for _, b := range c.bgs {
		b.cancel()
		go func() {
			for range b.lines {
			}
		}()
		<-b.exited
	}
}

// --- normalisation ---

// sortMark starts the lines of one listing that normalise sorts.
const sortMark = "~ "

var (
	// etcdctl prints lease IDs as %016x; the concurrency recipes name
	// their keys PREFIX/%x of the lease.
	leaseHexRE  = regexp.MustCompile(`\b([0-9a-f]{16})\b`)
	recipeKeyRE = regexp.MustCompile(`\b((?:lk|el)[0-9]*)/([0-9a-f]+)\b`)
	jsonLeaseRE = regexp.MustCompile(`"(id|lease)":(\d+)`)
	// ID is a member's in member list; ttl, what a lease has left.
	jsonIDsRE   = regexp.MustCompile(`"(ID|cluster_id|member_id|raft_term|raftIndex|raftTerm|raftAppliedIndex|dbSize|dbSizeInUse|leader|ttl)":\d+`)
	jsonStrsRE  = regexp.MustCompile(`"(version|name)":"[^"]*"`)
	peerURLsRE  = regexp.MustCompile(`"peerURLs":\[[^\]]*\]`)
	remainingRE = regexp.MustCompile(`remaining\(-?\d+s\)`)
	tookRE      = regexp.MustCompile(`"took":"[^"]*"`)
	attachedRE  = regexp.MustCompile(`attached keys\(\[([^\]]*)\]\)`)
)

// normalise replaces what must differ between two servers: the IDs and
// figures that name the server rather than the data, the endpoint address
// and the lease IDs, which become L1, L2, ... in order of appearance.
func normalise(s, addr string) string {
	s = strings.ReplaceAll(s, addr, "ENDPOINT")
	s = jsonIDsRE.ReplaceAllString(s, `"$1":N`)
	s = jsonStrsRE.ReplaceAllString(s, `"$1":"S"`)
	s = peerURLsRE.ReplaceAllString(s, `"peerURLs":[P]`)
	// How long a lease has left depends on when the command ran.
	s = remainingRE.ReplaceAllString(s, "remaining(Ns)")
	s = tookRE.ReplaceAllString(s, `"took":"T"`)
	// etcd lists a lease's keys in no particular order.
	s = attachedRE.ReplaceAllStringFunc(s, func(m string) string {
		keys := strings.Fields(attachedRE.FindStringSubmatch(m)[1])
		slices.Sort(keys)
		return "attached keys([" + strings.Join(keys, " ") + "])"
	})

	labels := map[uint64]string{}
	label := func(v uint64) string {
		if l, ok := labels[v]; ok {
			return l
		}
		l := fmt.Sprintf("L%d", len(labels)+1)
		labels[v] = l
		return l
	}
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		l = leaseHexRE.ReplaceAllStringFunc(l, func(m string) string {
			sub := leaseHexRE.FindStringSubmatch(m)
			v, _ := strconv.ParseUint(sub[1], 16, 64)
			return strings.TrimSuffix(m, sub[1]) + label(v)
		})
		l = recipeKeyRE.ReplaceAllStringFunc(l, func(m string) string {
			sub := recipeKeyRE.FindStringSubmatch(m)
			v, _ := strconv.ParseUint(sub[2], 16, 64)
			return sub[1] + "/" + label(v)
		})
		l = jsonLeaseRE.ReplaceAllStringFunc(l, func(m string) string {
			sub := jsonLeaseRE.FindStringSubmatch(m)
			v, _ := strconv.ParseUint(sub[2], 10, 64)
			return strings.TrimSuffix(m, sub[2]) + `"` + label(v) + `"`
		})
		lines = append(lines, l)
	}
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && strings.HasPrefix(lines[j], sortMark) {
			j++
		}
		slices.Sort(lines[i:j])
		i = max(j, i+1)
	}
	return strings.Join(lines, "\n")
}

// --- scenarios ---

func ctlKV(c *ctl) {
	for _, kv := range [][2]string{{"k/b", "2"}, {"k/a", "1"}, {"k/c", "3"}, {"k/a", "10"}, {"x", "out"}, {"k/d", "4"}} {
		c.run("put", kv[0], kv[1])
	}
	c.run("put", "--prev-kv", "k/b", "20")
	c.run("put", "--prev-kv", "-w", "json", "k/c", "30")
	c.run("get", "k/a")
	c.run("get", "nothing")
	c.run("get", "--prefix", "k/")
	c.run("get", "--prefix", "k/", "--sort-by", "MODIFY", "--order", "DESCEND")
	c.run("get", "--prefix", "k/", "--sort-by", "VALUE", "--order", "ASCEND")
	c.run("get", "--prefix", "k/", "--sort-by", "CREATE", "--order", "DESCEND", "--limit", "2")
	c.run("get", "--prefix", "k/", "--sort-by", "VERSION", "--order", "DESCEND")
	c.run("get", "--prefix", "k/", "--limit", "2", "-w", "json")
	c.run("get", "--prefix", "k/", "--rev", "4")
	c.run("get", "--prefix", "k/", "--rev", "4", "-w", "json")
	c.run("get", "--prefix", "k/", "--print-value-only")
	c.run("get", "--prefix", "k/", "--keys-only")
	c.run("get", "--from-key", "k/c")
	c.run("get", "k/a", "k/c")
	c.run("get", "--rev", "100", "k/a")
	c.run("get", "--consistency", "s", "k/a", "-w", "json")
	c.run("del", "--prefix", "--prev-kv", "k/")
	c.run("del", "--prev-kv", "x", "-w", "json")
	c.run("del", "k/none")
	c.run("get", "--prefix", "")
	c.run("get", "--prefix", "k/", "--rev", "7")
	c.run("put", "")
}

func ctlTxn(c *ctl) {
	c.run("put", "t/a", "1")
	c.run("put", "t/b", "2")
	txn := func(s string) {
		c.runIn(s, "txn")
		c.runIn(s, "txn", "-w", "json")
	}
	txn("value(\"t/a\") = \"1\"\n\nput t/a 11\nget t/b\n\nput t/a 0\n\n")
	txn("value(\"t/a\") = \"1\"\nmod(\"t/b\") > \"0\"\n\nput t/a 12\n\nput t/c created\nget --prefix t/\ndel t/b\n\n")
	txn("version(\"t/c\") = \"0\"\ncreate(\"t/a\") < \"100\"\n\nget --prefix t/ --sort-by=CREATE --order=DESCEND\n\n\n")
	txn("\nput t/d 4\n\n\n")
	txn("version(\"t/zz\") = \"0\"\n\nput t/a 1\nput t/a 2\n\n\n")
	// (etcdctl 3.4 panics on a lease("k") compare: clientv3 wants a
	// number, etcdctl hands it the string; the differential test has them.)
	txn("create(\"t/a\") > \"1\"\n\ndel --prefix t/\n\n\n")
	c.run("get", "--prefix", "t/")
}

func ctlWatch(c *ctl) {
	c.run("put", "w/a", "1")
	c.run("put", "w/b", "2")
	c.run("put", "w/a", "3")
	c.run("del", "w/b")
	c.run("put", "other", "x")
	c.run("put", "w/end", "done")
	w := c.bg("watch", "--rev", "2", "--prefix", "w/")
	c.expect(w, 3*5)
	c.interrupt(w)
	w = c.bg("watch", "--rev", "3", "--prev-kv", "w/a")
	c.expect(w, 5)
	c.interrupt(w)
	// A live watch: events that happen after it starts.
	w = c.bg("watch", "--prefix", "w/", "-w", "json", "--rev", "7")
	c.expect(w, 1)
	c.run("put", "w/live", "4")
	c.expect(w, 1)
	c.interrupt(w)
}

func ctlLease(c *ctl) {
	c.run("lease", "grant", "600")
	c.run("lease", "grant", "300")
	lease := func(i int) string {
		out, _ := c.exec("", "lease", "list")
		ids := leaseIDs(out)
		if i < len(ids) {
			return ids[i]
		}
		return "none"
	}
	l1, l2 := lease(0), lease(1)
	c.runSorted("lease", "list")
	c.run("put", "--lease", l1, "l/a", "1")
	c.run("put", "--lease", l1, "l/b", "2")
	c.run("put", "--lease", l2, "l/c", "3")
	c.run("get", "--prefix", "l/", "-w", "json")
	c.run("lease", "keep-alive", "--once", l1)
	c.run("lease", "timetolive", l1)
	c.run("lease", "timetolive", "--keys", l1)
	c.run("lease", "timetolive", "--keys", "-w", "json", l2)
	c.run("lease", "revoke", l1)
	c.run("get", "--prefix", "l/")
	c.run("lease", "timetolive", l1)
	c.run("lease", "revoke", l1)
	c.run("lease", "keep-alive", "--once", l1)
	c.run("put", "--lease", l1, "l/d", "4")
	c.runSorted("lease", "list")
	c.run("lease", "revoke", l2)
	c.runSorted("lease", "list")
	c.run("get", "--prefix", "l/", "-w", "json")
}

// leaseIDs are the IDs `lease list` prints, sorted: etcd lists them in no
// particular order.
func leaseIDs(out string) []string {
	var ids []string
	for _, l := range strings.Split(out, "\n") {
		if len(l) == 16 {
			if _, err := strconv.ParseUint(l, 16, 64); err == nil {
				ids = append(ids, l)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

func ctlLock(c *ctl) {
	c.run("put", "before", "x")
	// A lock running a command: the command sees the lock's key and
	// revision in its environment, and the lock is released after it.
	c.run("lock", "lk1", "--", "sh", "-c", `echo "key=$ETCD_LOCK_KEY rev=$ETCD_LOCK_REV"`)
	c.run("get", "--prefix", "lk1")
	// A held lock: the second locker waits until the first lets go.
	h := c.bg("lock", "lk2")
	c.expect(h, 1)
	w := c.bg("lock", "lk2", "--", "sh", "-c", `echo "second key=$ETCD_LOCK_KEY rev=$ETCD_LOCK_REV"`)
	c.waitFor("two lk2 keys", func(out string) bool { return strings.Contains(out, `"count":2`) },
		"get", "--prefix", "lk2", "-w", "json")
	c.run("get", "--prefix", "lk2", "--keys-only")
	c.interrupt(h)
	c.expect(w, 1)
	c.expect(w, 1)
	c.waitFor("no lk2 keys", func(out string) bool { return strings.TrimSpace(out) == "" }, "get", "--prefix", "lk2")
	c.run("get", "--prefix", "lk")
}

func ctlElect(c *ctl) {
	p1 := c.bg("elect", "el", "p1")
	c.expect(p1, 2)
	obs := c.bg("elect", "-l", "el")
	c.expect(obs, 2)
	p2 := c.bg("elect", "el", "p2")
	c.waitFor("two candidates", func(out string) bool { return strings.Contains(out, `"count":2`) },
		"get", "--prefix", "el/", "-w", "json")
	c.run("get", "--prefix", "el/", "--sort-by", "CREATE")
	c.interrupt(p1)
	c.expect(p2, 2)
	c.expect(obs, 2)
	c.run("get", "--prefix", "el/")
	c.interrupt(p2)
	c.waitFor("no candidates", func(out string) bool { return strings.TrimSpace(out) == "" }, "get", "--prefix", "el/")
	c.interrupt(obs)
}

func ctlMaintenance(c *ctl) {
	for _, v := range []string{"1", "2", "3", "4"} {
		c.run("put", "m", v)
	}
	c.run("endpoint", "status", "-w", "json")
	c.run("endpoint", "health", "-w", "json")
	c.run("member", "list", "-w", "json")
	c.run("compaction", "3")
	c.run("get", "--rev", "2", "m")
	c.run("get", "--rev", "3", "m")
	c.run("compaction", "2")
	c.run("compaction", "100")
	c.run("watch", "--rev", "2", "m")
	c.run("endpoint", "status", "-w", "json")
}

// ctlAuth is etcd's user, role and auth runbook, verbatim: each answer,
// each refusal and what the users may then do, as etcd prints them.
// (etcdctl's auth enable adds the root role and grants it to root when
// it is missing, on either server.)
func ctlAuth(c *ctl) {
	c.run("auth", "enable")
	c.run("role", "add", "app")
	c.run("role", "add", "app")
	c.run("role", "grant-permission", "app", "readwrite", "app/", "--prefix")
	c.run("role", "grant-permission", "app", "read", "config")
	c.run("role", "get", "app")
	c.run("user", "add", "root", "--new-user-password", "root-pw", "--interactive=false")
	c.run("user", "add", "carol", "--new-user-password", "carol-pw", "--interactive=false")
	c.run("user", "grant-role", "carol", "app")
	c.run("user", "grant-role", "carol", "none")
	c.run("user", "list")
	c.run("role", "list")
	c.run("auth", "enable")
	c.run("user", "get", "root")
	c.run("put", "app/x", "1")
	c.run("--user", "carol:carol-pw", "put", "app/x", "1")
	c.run("--user", "carol:carol-pw", "get", "app/x")
	c.run("--user", "carol:carol-pw", "put", "other", "1")
	c.run("--user", "carol:carol-pw", "put", "config", "1")
	c.run("--user", "carol:carol-pw", "get", "config")
	c.run("--user", "carol:wrong", "get", "app/x")
	c.run("--user", "carol:carol-pw", "user", "add", "mallory", "--new-user-password", "pw", "--interactive=false")
	c.run("--user", "root:root-pw", "user", "get", "carol")
	c.run("--user", "root:root-pw", "user", "delete", "root")
	c.run("--user", "root:root-pw", "user", "revoke-role", "root", "root")
	c.runIn("new-pw\n", "--user", "root:root-pw", "user", "passwd", "carol", "--interactive=false")
	c.run("--user", "carol:carol-pw", "get", "app/x")
	c.run("--user", "carol:new-pw", "get", "app/x")
	c.run("--user", "root:root-pw", "user", "revoke-role", "carol", "app")
	c.run("--user", "carol:new-pw", "get", "app/x")
	c.run("--user", "root:root-pw", "role", "revoke-permission", "app", "config")
	c.run("--user", "root:root-pw", "role", "revoke-permission", "app", "config")
	c.run("--user", "root:root-pw", "role", "delete", "app")
	c.run("--user", "root:root-pw", "auth", "disable")
	c.run("put", "app/x", "2")
	c.run("user", "delete", "carol")
	c.run("user", "list")
}
