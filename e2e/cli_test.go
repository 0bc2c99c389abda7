//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
)

// These tests drive the tenure binary, as a user would, against a real
// server process on 127.0.0.1. Every process a test starts carries a
// marker in its environment — tenure passes its environment on to the
// command it runs, and the command to its own children — so that cleanup
// finds and kills all of them, grandchildren included, whatever happened.

// cliEnv runs tenure against one server, in a temporary directory that
// the commands under test use for their files.
type cliEnv struct {
	t         *testing.T
	bin       string
	srv       *serverProc
	endpoints string // what TENURE_ENDPOINTS is set to
	dir       string
	mark      string

	mu    sync.Mutex // guards procs
	procs []*cliProc
}

const markVar = "TENURE_E2E_MARK"

// newCLIEnv starts a server of its own and returns an environment for
// running tenure against it. Cleanup kills every marked process before
// the server.
func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	bin := tenureBinary(t)
	srv := newServerProc(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv.start(ctx)
	e := &cliEnv{
		t: t, bin: bin, srv: srv, endpoints: srv.listen, dir: t.TempDir(),
		mark: fmt.Sprintf("%s-%d-%d", t.Name(), os.Getpid(), rand.Int64()),
	}
	t.Cleanup(e.cleanup)
	return e
}

func (e *cliEnv) env(endpoints string) []string {
	env := []string{markVar + "=" + e.mark, "TENURE_ENDPOINTS=" + endpoints}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") {
			env = append(env, kv)
		}
	}
	return env
}

// cleanup kills every process carrying the marker until none is left,
// then waits for the tenure processes it started.
func (e *cliEnv) cleanup() {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		pids := markedProcesses(e.mark)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.mu.Lock()
	procs := e.procs
	e.mu.Unlock()
	for _, p := range procs {
		<-p.done
	}
	if left := markedProcesses(e.mark); len(left) > 0 {
		e.t.Errorf("processes left running after cleanup: %v", left)
	}
}

// markedProcesses lists the live processes whose environment has the
// marker. Zombies have no environment left and are not listed.
func markedProcesses(mark string) []int {
	entries, _ := os.ReadDir("/proc")
	needle := []byte(markVar + "=" + mark + "\x00")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + ent.Name() + "/environ")
		if err == nil && bytes.Contains(env, needle) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// syncBuffer is a bytes.Buffer that a process writes while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// cliProc is one tenure process.
type cliProc struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{} // closed once cmd.Wait has returned
	code           int           // the exit code, 128+N if killed by signal N; set before done closes
}

// start runs tenure with args in the background.
func (e *cliEnv) start(args ...string) *cliProc {
	return e.startAt(e.endpoints, args...)
}

// startAt runs tenure against other endpoints.
func (e *cliEnv) startAt(endpoints string, args ...string) *cliProc {
	e.t.Helper()
	p := &cliProc{args: args, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(e.bin, args...)
	p.cmd.Dir = e.dir
	p.cmd.Env = e.env(endpoints)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		e.t.Fatalf("start tenure %s: %v", strings.Join(args, " "), err)
	}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	go func() {
		_ = p.cmd.Wait()
		ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		} else {
			p.code = ws.ExitStatus()
		}
		close(p.done)
	}()
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *cliProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		t.Fatalf("tenure %s: still running after %v; stdout %q, stderr %q", strings.Join(p.args, " "), timeout, p.stdout, p.stderr)
	}
	return -1
}

func (p *cliProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to tenure %s: %v", sig, strings.Join(p.args, " "), err)
	}
}

func (p *cliProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
}

// run runs tenure to completion.
func (e *cliEnv) run(args ...string) result {
	e.t.Helper()
	return e.runAt(e.endpoints, args...)
}

func (e *cliEnv) runAt(endpoints string, args ...string) result {
	e.t.Helper()
	p := e.startAt(endpoints, args...)
	code := p.wait(e.t, 20*time.Second)
	return result{p.stdout.String(), p.stderr.String(), code}
}

// expect runs tenure and checks its whole output and exit code.
func (e *cliEnv) expect(code int, stdout, stderr string, args ...string) result {
	e.t.Helper()
	r := e.run(args...)
	if r.code != code || r.stdout != stdout || r.stderr != stderr {
		e.t.Errorf("tenure %s: got = %v, expected: exit %d, stdout %q, stderr %q", strings.Join(args, " "), r, code, stdout, stderr)
	}
	return r
}

func (e *cliEnv) path(name string) string { return filepath.Join(e.dir, name) }

// waitFile waits until a command has written a whole line to name and
// returns the file without its final newline.
func (e *cliEnv) waitFile(name string, timeout time.Duration) string {
	e.t.Helper()
	var s string
	waitFor(e.t, timeout, "a line in "+name, func() bool {
		b, _ := os.ReadFile(e.path(name))
		s = string(b)
		return strings.HasSuffix(s, "\n")
	})
	return strings.TrimSuffix(s, "\n")
}

func (e *cliEnv) exists(name string) bool {
	_, err := os.Stat(e.path(name))
	return err == nil
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
	}
}

// leaseJSON is the part of `tenure get lease -o json` the tests read.
type leaseJSON struct {
	Spec struct {
		HolderIdentity *string `json:"holderIdentity"`
	} `json:"spec"`
	Status struct {
		FencingToken int64 `json:"fencingToken"`
		Waiters      []struct {
			HolderIdentity string `json:"holderIdentity"`
		} `json:"waiters"`
	} `json:"status"`
}

func (e *cliEnv) lease(name string) leaseJSON {
	e.t.Helper()
	r := e.run("get", "lease", name, "-o", "json")
	var l leaseJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &l) != nil {
		e.t.Fatalf("tenure get lease %s -o json: got = %v, expected: a lease document", name, r)
	}
	return l
}

// waitWaiter waits until identity is queued for the lease.
func (e *cliEnv) waitWaiter(name, identity string) {
	e.t.Helper()
	waitFor(e.t, 10*time.Second, identity+" waiting for "+name, func() bool {
		for _, w := range e.lease(name).Status.Waiters {
			if w.HolderIdentity == identity {
				return true
			}
		}
		return false
	})
}

// leaseEvent is a line of `tenure watch -o json`.
type leaseEvent struct {
	Revision int64     `json:"revision"`
	Time     time.Time `json:"time"`
	Type     string    `json:"type"`
	Name     string    `json:"name"`
	Holder   string    `json:"holder"`
	Token    int64     `json:"token"`
	Reason   string    `json:"reason"`
}

// events replays the lease's events with `tenure watch --rev 1 -o json`
// until enough returns true, then interrupts the watch, which must exit 0.
func (e *cliEnv) events(name string, enough func([]leaseEvent) bool) []leaseEvent {
	e.t.Helper()
	w := e.start("watch", "--rev", "1", "-o", "json")
	var evs []leaseEvent
	waitFor(e.t, 10*time.Second, "events of "+name+" from tenure watch", func() bool {
		evs = evs[:0]
		for _, line := range strings.Split(w.stdout.String(), "\n") {
			var ev leaseEvent
			if line == "" || !strings.HasSuffix(line, "}") {
				continue
			}
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				e.t.Fatalf("tenure watch -o json: line %q: %v", line, err)
			}
			if ev.Name == name {
				evs = append(evs, ev)
			}
		}
		return enough(evs)
	})
	w.signal(e.t, syscall.SIGINT)
	if code := w.wait(e.t, 10*time.Second); code != 0 {
		e.t.Errorf("tenure watch after SIGINT: exit code got = %d, expected: 0 (stderr %q)", code, w.stderr)
	}
	return evs
}

func findEvent(evs []leaseEvent, typ, holder string) (leaseEvent, bool) {
	for _, ev := range evs {
		if ev.Type == typ && (holder == "" || ev.Holder == holder) {
			return ev, true
		}
	}
	return leaseEvent{}, false
}

// readUnixTime parses `date +%s.%N`.
func readUnixTime(t *testing.T, s string) time.Time {
	t.Helper()
	sec, nsec, ok := strings.Cut(strings.TrimSpace(s), ".")
	secs, err1 := strconv.ParseInt(sec, 10, 64)
	nsecs, err2 := strconv.ParseInt(nsec, 10, 64)
	if !ok || err1 != nil || err2 != nil || len(nsec) != 9 {
		t.Fatalf("date +%%s.%%N: got = %q, expected: seconds.nanoseconds", s)
	}
	return time.Unix(secs, nsecs)
}

// groupWatch polls a process group and a grandchild in it, and records
// when the last of them is gone (reaped, not a zombie).
type groupWatch struct {
	pgid, grandchild int
	gone             chan struct{}
	at               time.Time // set before gone closes
}

// holdingScript is a command that starts a grandchild, writes
// "PGID GRANDCHILD" to pids and sleeps. With ignoreTerm the whole group
// ignores SIGTERM, so only the SIGKILL after --kill-grace stops it.
func holdingScript(ignoreTerm bool) string {
	s := `sleep 30 & echo "$$ $!" > pids; sleep 30; wait`
	if ignoreTerm {
		s = `trap "" TERM; ` + s
	}
	return s
}

func (e *cliEnv) watchGroup(pidsFile string) *groupWatch {
	e.t.Helper()
	f := strings.Fields(e.waitFile(pidsFile, 10*time.Second))
	if len(f) != 2 {
		e.t.Fatalf("%s: got = %q, expected: PGID GRANDCHILD", pidsFile, f)
	}
	g := &groupWatch{gone: make(chan struct{})}
	g.pgid, _ = strconv.Atoi(f[0])
	g.grandchild, _ = strconv.Atoi(f[1])
	if g.isGone() {
		e.t.Fatalf("process group %d: got = gone already, expected: running", g.pgid)
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	e.t.Cleanup(func() {
		close(stop)
		<-finished
	})
	go func() {
		defer close(finished)
		for {
			if g.isGone() {
				g.at = time.Now()
				close(g.gone)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return g
}

func (g *groupWatch) isGone() bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(g.grandchild))
	return errors.Is(unix.Kill(-g.pgid, 0), unix.ESRCH) && errors.Is(err, os.ErrNotExist)
}

func (g *groupWatch) wait(t *testing.T, timeout time.Duration) time.Time {
	t.Helper()
	select {
	case <-g.gone:
		return g.at
	case <-time.After(timeout):
		t.Fatalf("process group %d (grandchild %d): still there after %v", g.pgid, g.grandchild, timeout)
	}
	return time.Time{}
}

// --- mutual exclusion ---

// TestCLILockExcludes runs two `tenure lock` loops on one lock at once.
// Each command appends start and end marks with its fencing token to one
// file and sleeps between them: the marks never interleave, and the
// tokens strictly increase from one command to the next.
func TestCLILockExcludes(t *testing.T) {
	e := newCLIEnv(t)
	const workers, iterations = 2, 4
	script := `echo start $TENURE_FENCING_TOKEN >> marks; sleep 0.2; echo end $TENURE_FENCING_TOKEN >> marks`
	began := time.Now()
	var wg sync.WaitGroup
	results := make([][]result, workers)
	for w := range workers {
		wg.Go(func() {
			for range iterations {
				p := e.start("lock", "--identity", fmt.Sprintf("worker-%d", w), "excl", "--", "sh", "-c", script)
				select {
				case <-p.done:
				case <-time.After(15 * time.Second):
				}
				results[w] = append(results[w], result{p.stdout.String(), p.stderr.String(), p.code})
				if !p.exited() {
					return // reported below; cleanup kills it
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	for w, rs := range results {
		if len(rs) != iterations {
			t.Fatalf("worker %d: got = %d runs, expected: %d (one did not finish within 15s)", w, len(rs), iterations)
		}
		for i, r := range rs {
			if r.code != 0 || r.stdout != "" || r.stderr != "" {
				t.Errorf("worker %d run %d: got = %v, expected: exit 0 and no output", w, i, r)
			}
		}
	}
	b, err := os.ReadFile(e.path("marks"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 2*workers*iterations {
		t.Fatalf("marks: got = %d lines, expected: %d:\n%s", len(lines), 2*workers*iterations, b)
	}
	var last int64
	for i := 0; i < len(lines); i += 2 {
		start, end := lines[i], lines[i+1]
		tok, err := strconv.ParseInt(strings.TrimPrefix(start, "start "), 10, 64)
		if err != nil || !strings.HasPrefix(start, "start ") || end != "end "+strconv.FormatInt(tok, 10) {
			t.Fatalf("marks %d-%d: got = %q, %q, expected: start N then end N, never interleaved:\n%s", i+1, i+2, start, end, b)
		}
		if tok <= last {
			t.Errorf("fencing token of run %d: got = %d, expected: above %d, the previous run's", i/2+1, tok, last)
		}
		last = tok
	}
	// Serialized critical sections take at least their sum.
	if least := time.Duration(workers*iterations) * 200 * time.Millisecond; took < least {
		t.Errorf("%d runs took %v, expected: at least %v if they ran one at a time", workers*iterations, took, least)
	}
	t.Logf("%d runs in %v; tokens up to %d", workers*iterations, took.Round(time.Millisecond), last)
}

// --- losing the lock ---

// TestCLILockRevokeStopsGroupFirst holds a lock with a command whose
// process group (a shell and a grandchild) ignores SIGTERM, queues a
// second `tenure lock`, and revokes the first grant. The first tenure
// must kill the whole group (SIGKILL after --kill-grace) before the
// second is granted, which the lease's lock-delay (--kill-grace + 1s by
// default) holds back.
func TestCLILockRevokeStopsGroupFirst(t *testing.T) {
	e := newCLIEnv(t)
	first := e.start("lock", "--identity", "first", "--kill-grace", "500ms", "revoked", "--", "sh", "-c", holdingScript(true))
	group := e.watchGroup("pids")
	second := e.start("lock", "--identity", "second", "revoked", "--", "sh", "-c", `date +%s.%N > granted`)
	e.waitWaiter("revoked", "second")
	token := e.lease("revoked").Status.FencingToken

	e.expect(0, fmt.Sprintf("revoked default/revoked token %d\n", token), "", "revoke", "revoked", "--reason", "e2e: wedged")
	goneAt := group.wait(t, 5*time.Second)
	if code := second.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("second tenure lock: exit code got = %d, expected: 0 (stderr %q)", code, second.stderr)
	}
	granted := readUnixTime(t, e.waitFile("granted", time.Second))
	code := first.wait(t, 10*time.Second)
	wantErr := fmt.Sprintf("Error: lost default/revoked (token %d) while the command ran; it was stopped:", token)
	if code == 0 || !strings.HasPrefix(first.stderr.String(), wantErr) {
		t.Errorf("first tenure lock: got = exit %d, stderr %q, expected: non-zero and %q...", code, first.stderr, wantErr)
	}

	evs := e.events("revoked", func(evs []leaseEvent) bool {
		_, ok := findEvent(evs, "acquired", "second")
		return ok
	})
	revoked, ok := findEvent(evs, "revoked", "first")
	if !ok || revoked.Token != token || revoked.Reason != "e2e: wedged" {
		t.Fatalf("events: got = %+v, expected: token %d revoked with the reason", evs, token)
	}
	acquired, _ := findEvent(evs, "acquired", "second")
	if !goneAt.Before(acquired.Time) || !goneAt.Before(granted) {
		t.Errorf("first's process group gone at %v, expected: before the second grant at %v (its command started at %v)",
			goneAt.Format(time.StampMicro), acquired.Time.Format(time.StampMicro), granted.Format(time.StampMicro))
	}
	if d := acquired.Time.Sub(revoked.Time); d < 1500*time.Millisecond {
		t.Errorf("second granted %v after the revoke, expected: at least the lock-delay of 1.5s (--kill-grace 500ms + 1s)", d)
	}
	if acquired.Token <= token {
		t.Errorf("second token: got = %d, expected: above %d", acquired.Token, token)
	}
	t.Logf("revoked at %s; group gone %v later; second granted %v after the group was gone",
		revoked.Time.Format(time.StampMilli), goneAt.Sub(revoked.Time).Round(time.Millisecond), acquired.Time.Sub(goneAt).Round(time.Millisecond))
}

// TestCLILockHeartbeatLossStopsGroupFirst runs `tenure lock --ttl 4s
// --kill-grace 500ms --lock-delay 0` through a TCP proxy, then makes the
// proxy stop forwarding: the CLI's heartbeats go unanswered, and the
// server expires the session a TTL after the last one it saw. With no
// lock-delay to hide behind, the CLI must stop the whole group (which
// ignores SIGTERM) by 0.75×TTL + kill-grace, before the server can expire
// the session and grant the queued second tenure.
func TestCLILockHeartbeatLossStopsGroupFirst(t *testing.T) {
	e := newCLIEnv(t)
	px := newProxy(t, e.srv.listen)
	first := e.startAt(px.addr(), "lock", "--identity", "partitioned", "--ttl", "4s", "--kill-grace", "500ms", "--lock-delay", "0",
		"partition", "--", "sh", "-c", holdingScript(true))
	group := e.watchGroup("pids")
	second := e.start("lock", "--identity", "second", "partition", "--", "sh", "-c", `date +%s.%N > granted`)
	e.waitWaiter("partition", "second")
	token := e.lease("partition").Status.FencingToken

	pausedAt := time.Now()
	px.pause()
	goneAt := group.wait(t, 8*time.Second)
	px.cut() // let the first tenure's last calls fail fast
	if code := second.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("second tenure lock: exit code got = %d, expected: 0 (stderr %q)", code, second.stderr)
	}
	granted := readUnixTime(t, e.waitFile("granted", time.Second))
	code := first.wait(t, 10*time.Second)
	wantErr := fmt.Sprintf("Error: lost default/partition (token %d) while the command ran; it was stopped:", token)
	if code == 0 || !strings.HasPrefix(first.stderr.String(), wantErr) {
		t.Errorf("first tenure lock: got = exit %d, stderr %q, expected: non-zero and %q...", code, first.stderr, wantErr)
	}

	evs := e.events("partition", func(evs []leaseEvent) bool {
		_, ok := findEvent(evs, "acquired", "second")
		return ok
	})
	if ev, ok := findEvent(evs, "expired", "partitioned"); !ok || ev.Token != token {
		t.Errorf("events: got = %+v, expected: token %d expired", evs, token)
	}
	acquired, _ := findEvent(evs, "acquired", "second")
	if !goneAt.Before(acquired.Time) || !goneAt.Before(granted) {
		t.Errorf("first's process group gone at %v, expected: before the second grant at %v (its command started at %v)",
			goneAt.Format(time.StampMicro), acquired.Time.Format(time.StampMicro), granted.Format(time.StampMicro))
	}
	// The last heartbeat acknowledged was sent before the pause, so the
	// group is stopped by 0.75×4s + 500ms after it at the latest.
	if d := goneAt.Sub(pausedAt); d > 3500*time.Millisecond+500*time.Millisecond {
		t.Errorf("group gone %v after heartbeats stopped, expected: within 0.75×TTL + kill-grace = 3.5s (plus scheduling slack)", d)
	}
	t.Logf("heartbeats stopped; group gone %v later; second granted %v after that",
		goneAt.Sub(pausedAt).Round(time.Millisecond), acquired.Time.Sub(goneAt).Round(time.Millisecond))
}

// proxy forwards TCP connections to a server until paused. Paused, it
// keeps every connection open but forwards nothing, in either direction:
// a network partition, not a refused connection. Cut closes everything.
type proxy struct {
	ln      net.Listener
	target  string
	paused  chan struct{}
	cutC    chan struct{}
	pauseMu sync.Once
	cutMu   sync.Once
	mu      sync.Mutex // guards conns
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln := testnet.Listen(t)
	p := &proxy{ln: ln, target: target, paused: make(chan struct{}), cutC: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.cutC:
		c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() {
			select {
			case <-p.paused:
				return // held open, never forwarded, until cut
			default:
			}
			up, err := net.DialTimeout("tcp", p.target, time.Second)
			if err != nil || !p.track(up) {
				c.Close()
				return
			}
			p.wg.Go(func() { p.copy(up, c) })
			p.copy(c, up)
		})
	}
}

// copy forwards from src to dst until either closes or the proxy is
// paused: whatever is read after the pause is dropped.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.paused:
			<-p.cutC
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if cw, ok := dst.(*net.TCPConn); ok {
					_ = cw.CloseWrite()
				}
			}
			return
		}
	}
}

func (p *proxy) pause() { p.pauseMu.Do(func() { close(p.paused) }) }

// cut closes the listener and every connection, and waits for the
// proxy's goroutines. It is safe to call more than once.
func (p *proxy) cut() {
	p.cutMu.Do(func() {
		p.mu.Lock()
		close(p.cutC)
		conns := p.conns
		p.mu.Unlock()
		p.ln.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	p.wg.Wait()
}

// --- signals and exit codes ---

func TestCLILockSignalsAndExitCodes(t *testing.T) {
	e := newCLIEnv(t)

	// A command that traps sig, writes its name to got and exits 3.
	trapping := func(sig string) string {
		return `trap "echo ` + sig + ` > got-` + sig + `; exit 3" ` + sig + `; echo ready > ready-` + sig + `; while :; do sleep 0.05; done`
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		name := strings.TrimPrefix(unix.SignalName(sig), "SIG")
		t.Run(name+" to tenure reaches the command, and tenure exits with its code", func(t *testing.T) {
			p := e.start("lock", "sig-"+name, "--", "sh", "-c", trapping(name))
			e.waitFile("ready-"+name, 10*time.Second)
			p.signal(t, sig)
			if code := p.wait(t, 10*time.Second); code != 3 {
				t.Errorf("exit code got = %d, expected: 3 from the command (stderr %q)", code, p.stderr)
			}
			if got := e.waitFile("got-"+name, time.Second); got != name {
				t.Errorf("the command's trap: got = %q, expected: %q", got, name)
			}
			// The lock was released on the way out.
			e.expect(0, "", "", "lock", "--try", "sig-"+name, "--", "true")
		})
	}

	t.Run("the command's exit code is tenure's", func(t *testing.T) {
		e.expect(7, "out\n", "err\n", "lock", "code", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		e.expect(0, "", "", "lock", "code", "--", "true")
	})

	t.Run("a command that cannot start exits 127", func(t *testing.T) {
		e.expect(127, "", "Error: start ./no-such-command: no such file or directory\n", "lock", "nocmd", "--", "./no-such-command")
	})

	t.Run("--try on a held lock exits 1, and so does running out of --wait", func(t *testing.T) {
		holder := e.start("lock", "--identity", "holder", "held", "--", "sh", "-c", `echo ready > ready-held; sleep 30`)
		e.waitFile("ready-held", 10*time.Second)
		e.expect(1, "", "Error: default/held is held by \"holder\"\n", "lock", "--try", "held", "--", "sh", "-c", "echo ran > ran-held")
		e.expect(1, "", "Error: gave up waiting for default/held after 300ms\n", "lock", "--wait", "300ms", "held", "--", "sh", "-c", "echo ran > ran-held")
		if e.exists("ran-held") {
			t.Errorf("the command of a lock not acquired ran")
		}
		holder.signal(t, syscall.SIGTERM)
		if code := holder.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
			t.Errorf("holder after SIGTERM: exit code got = %d, expected: %d, its command's", code, 128+int(syscall.SIGTERM))
		}
	})

	t.Run("lock without a command holds until interrupted", func(t *testing.T) {
		p := e.start("lock", "--identity", "bare", "bare")
		var token string
		waitFor(t, 10*time.Second, "tenure lock to print its grant", func() bool {
			m := regexp.MustCompile(`^default/bare held by bare with fencing token (\d+); interrupt to release\n$`).FindStringSubmatch(p.stdout.String())
			if m != nil {
				token = m[1]
			}
			return m != nil
		})
		e.expect(0, fmt.Sprintf("valid: token %s holds default/bare (holder bare)\n", token), "", "validate", "bare", "--token", token)
		p.signal(t, syscall.SIGINT)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Errorf("exit code after SIGINT: got = %d, expected: 0 (stderr %q)", code, p.stderr)
		}
		e.expect(1, "not valid: default/bare has no holder\n", "", "validate", "bare", "--token", token)
	})

	t.Run("a loss exits non-zero even when the command exits 0 on SIGTERM", func(t *testing.T) {
		p := e.start("lock", "--identity", "graceful", "--kill-grace", "500ms", "graceful", "--", "sh", "-c",
			`trap "echo stopped > stopped; exit 0" TERM; echo ready > ready-graceful; while :; do sleep 0.05; done`)
		e.waitFile("ready-graceful", 10*time.Second)
		token := e.lease("graceful").Status.FencingToken
		e.expect(0, fmt.Sprintf("revoked default/graceful token %d\n", token), "", "revoke", "graceful")
		code := p.wait(t, 10*time.Second)
		// The shell may say "Terminated" about its sleep first.
		if code != 1 || !strings.Contains(p.stderr.String(), fmt.Sprintf("Error: lost default/graceful (token %d)", token)) {
			t.Errorf("got = exit %d, stderr %q, expected: exit 1 and the loss", code, p.stderr)
		}
		if got := e.waitFile("stopped", time.Second); got != "stopped" {
			t.Errorf("the command's SIGTERM trap: got = %q, expected: stopped", got)
		}
	})

	t.Run("an unreachable server exits 3, saying what it was doing in words", func(t *testing.T) {
		dead := freePort(t)
		for _, tt := range []struct {
			args  []string
			doing string
		}{
			{[]string{"lock", "x", "--", "true"}, "open session"},
			{[]string{"kv", "get", "k"}, "get"},
			{[]string{"get", "leases"}, "list leases"},
		} {
			r := e.runAt(dead, tt.args...)
			want := "Error: " + tt.doing + ": dial tcp " + dead + ": connect: connection refused\n"
			if r.code != 3 || r.stdout != "" || r.stderr != want {
				t.Errorf("tenure %s with nothing at %s: got = %v, expected: exit 3 and %q", strings.Join(tt.args, " "), dead, r, want)
			}
		}
	})

	t.Run("usage errors exit 2", func(t *testing.T) {
		for _, tt := range []struct {
			args   []string
			stderr string
		}{
			{[]string{"lock"}, "Error: tenure lock: missing NAME\nUsage: tenure lock NAME [-- CMD [ARGS...]] [flags]\nSee 'tenure lock --help'.\n"},
			{[]string{"lock", "a", "b"}, "Error: lock takes one NAME; put the command after --\n"},
			{[]string{"lock", "--bogus", "a"}, "Error: unknown flag: --bogus\nSee 'tenure lock --help'.\n"},
			{[]string{"lock", "--ttl", "4s", "--kill-grace", "1s", "a", "--", "true"},
				"Error: --kill-grace 1s must be under 1s (a quarter of --ttl 4s): the command must be dead before the server can expire the session\n"},
			{[]string{"lock", "--wait", "-1s", "a", "--", "true"}, "Error: --wait -1s must not be negative\n"},
			// The server finds these; its message alone, no RPC name.
			{[]string{"lock", "-n", "Prod", "a", "--", "true"},
				"Error: namespace \"Prod\" must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit\n"},
			{[]string{"lock", "--ttl", "25h", "a", "--", "true"}, "Error: ttl 25h0m0s is outside 2s..24h0m0s (--min-ttl, --max-ttl)\n"},
			{[]string{"get", "leases", "-l", "!!!"},
				"Error: label selector \"!!!\": label key \"!!\" must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit\n"},
			{[]string{"kv", "get", ""}, "Error: key is empty\n"},
		} {
			e.expect(2, "", tt.stderr, tt.args...)
		}
	})
}

// TestCLIShortTTLNeedsNoOtherFlags: --kill-grace and --lock-delay left
// out follow --ttl, so a short TTL works on its own, and the lock-delay
// the server records is the derived one. A --kill-grace given that does
// not fit is still refused.
func TestCLIShortTTLNeedsNoOtherFlags(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "", "", "lock", "--ttl", "2s", "job", "--", "true")
	for _, tt := range []struct {
		ttl, lockDelay string
	}{
		{"2s", "1.4s"}, // kill-grace 400ms + 1s
		{"5s", "2s"},   // kill-grace 1s + 1s
		{"10s", "3s"},  // kill-grace 2s + 1s, as before
	} {
		name := "ttl-" + tt.ttl
		e.expect(0, "", "", "lock", "--ttl", tt.ttl, name, "--", "sh", "-c", e.bin+` get lease `+name+` -o json > `+name+`.json`)
		var l struct {
			Status struct {
				LockDelay string `json:"lockDelay"`
			} `json:"status"`
		}
		b, err := os.ReadFile(e.path(name + ".json"))
		if err != nil || json.Unmarshal(b, &l) != nil || l.Status.LockDelay != tt.lockDelay {
			t.Errorf("lock --ttl %s: lock-delay got = %q (%v, %s), expected: %q", tt.ttl, l.Status.LockDelay, err, b, tt.lockDelay)
		}
	}
	e.expect(0, "", "", "elect", "--ttl", "2s", "job", "--", "true")
	for _, cmd := range []string{"lock", "elect"} {
		e.expect(2, "", "Error: --kill-grace 2s must be under 500ms (a quarter of --ttl 2s): the command must be dead before the server can expire the session\n",
			cmd, "--kill-grace", "2s", "--ttl", "2s", "job", "--", "true")
	}
}

// --- keys ---

// TestCLIKVWalkthrough is the etcdctl lock walkthrough, line by line, on
// a fresh server: revisions count from 1, so the failure messages are
// exact.
func TestCLIKVWalkthrough(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "unlocked\n", "", "kv", "set", "my-lock", "unlocked")                            // rev 2 (a new store is at 1)
	e.expect(0, "alice\n", "", "kv", "set", "my-lock", "alice", "--swap-with-value", "unlocked") // rev 3
	e.expect(1, "", "Error: compare failed ([unlocked != alice]) [3]\n", "kv", "set", "my-lock", "bob", "--swap-with-value", "unlocked")
	e.expect(0, "alice\n", "", "kv", "get", "my-lock")
	e.expect(0, "unlocked\n", "", "kv", "set", "my-lock", "unlocked", "--swap-with-value", "alice") // rev 4
	e.expect(0, "unlocked\n", "", "kv", "get", "my-lock")

	// The leased form: a TTL, renewed by the holder.
	e.expect(0, "alice\n", "", "kv", "mk", "my-lock2", "alice", "--ttl", "10") // rev 5
	e.expect(1, "", "Error: key already exists (my-lock2) [5]\n", "kv", "mk", "my-lock2", "bob", "--ttl", "10")
	e.expect(0, "alice\n", "", "kv", "set", "my-lock2", "alice", "--ttl", "10", "--swap-with-value", "alice") // rev 6
	e.expect(1, "", "Error: compare failed ([bob != alice]) [6]\n", "kv", "set", "my-lock2", "bob", "--ttl", "10", "--swap-with-value", "bob")
	e.expect(0, "alice\n", "", "kv", "get", "my-lock2")
}

func TestCLIKVBasics(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "OK\n", "", "kv", "put", "jobs/a", "1")
	e.expect(0, "OK\n", "", "kv", "put", "jobs/b", "2")
	e.expect(0, "OK\n", "", "kv", "put", "other", "x")
	e.expect(0, "1\n", "", "kv", "get", "jobs/a")
	e.expect(1, "", "Error: key not found (jobs/c)\n", "kv", "get", "jobs/c")
	e.expect(0, "jobs/a\n1\njobs/b\n2\n", "", "kv", "range", "jobs/")
	e.expect(0, "jobs/a\n1\n", "", "kv", "range", "jobs/", "--limit", "1")
	e.expect(0, "", "", "kv", "range", "none/")
	// Keys have etcd's clock: a new store is at revision 1, so the three
	// puts were revisions 2, 3 and 4.
	e.expect(1, "", "Error: key not found (jobs/c) [4]\n", "kv", "set", "jobs/c", "3", "--swap-with-value", "x")
	// jobs/b was written at revision 3.
	e.expect(1, "", "Error: compare failed ([1 != 3]) [4]\n", "kv", "set", "jobs/b", "3", "--swap-with-revision", "1")
	e.expect(0, "3\n", "", "kv", "set", "jobs/b", "3", "--swap-with-revision", "3") // rev 5
	e.expect(0, "1\n", "", "kv", "del", "jobs/a")                                   // rev 6
	e.expect(0, "0\n", "", "kv", "del", "jobs/a")
	e.expect(0, "1\n", "", "kv", "del", "--prefix", "jobs/") // rev 7
	e.expect(0, "", "", "kv", "range", "jobs/")
	e.expect(0, "x\n", "", "kv", "get", "other")

	// A watch replays from a revision, then follows live changes, a key
	// expiring included, until interrupted.
	w := e.start("kv", "watch", "--prefix", "jobs/", "--rev", "1")
	replay := "PUT\njobs/a\n1\nPUT\njobs/b\n2\nPUT\njobs/b\n3\nDELETE\njobs/a\n\nDELETE\njobs/b\n\n"
	waitFor(t, 10*time.Second, "the watch to replay history", func() bool { return w.stdout.String() == replay })
	e.expect(0, "OK\n", "", "kv", "put", "jobs/t", "short-lived", "--ttl", "2")
	live := replay + "PUT\njobs/t\nshort-lived\nEXPIRE\njobs/t\n\n"
	waitFor(t, 10*time.Second, "the watch to see the put and the expiry", func() bool { return w.stdout.String() == live })
	e.expect(1, "", "Error: key not found (jobs/t)\n", "kv", "get", "jobs/t")
	w.signal(t, syscall.SIGINT)
	if code := w.wait(t, 10*time.Second); code != 0 || w.stderr.String() != "" {
		t.Errorf("kv watch after SIGINT: got = exit %d, stderr %q, expected: exit 0 and no error", code, w.stderr)
	}

	// A single-key watch sees only that key.
	k := e.start("kv", "watch", "other", "--rev", "1")
	waitFor(t, 10*time.Second, "the single-key watch", func() bool { return k.stdout.String() == "PUT\nother\nx\n" })
	k.signal(t, syscall.SIGTERM)
	if code := k.wait(t, 10*time.Second); code != 0 {
		t.Errorf("kv watch after SIGTERM: exit code got = %d, expected: 0", code)
	}
}

// --- elections ---

func TestCLIElect(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(1, "", "Error: default/sched has no leader\n", "elect", "sched", "--leader")

	obs := e.start("elect", "sched", "--observe")
	candidate := func(id, value string) *cliProc {
		return e.start("elect", "--identity", id, "--value", value, "sched", "--", "sh", "-c",
			`echo "$TENURE_FENCING_TOKEN $TENURE_HOLDER $TENURE_LEASE" > leader-`+id+`; sleep 30`)
	}
	a := candidate("cand-a", "a:1")
	fa := strings.Fields(e.waitFile("leader-cand-a", 10*time.Second))
	if len(fa) != 3 || fa[1] != "cand-a" || fa[2] != "default/sched" {
		t.Fatalf("cand-a's command environment: got = %q, expected: TOKEN cand-a default/sched", fa)
	}
	tokA := fa[0]
	leaderA := regexp.MustCompile(`^revision=\d+ leader=cand-a value="a:1" token=` + tokA + `\n$`)
	if r := e.run("elect", "sched", "--leader"); r.code != 0 || !leaderA.MatchString(r.stdout) {
		t.Errorf("elect --leader: got = %v, expected: cand-a with value a:1 and token %s", r, tokA)
	}

	b := candidate("cand-b", "b:2")
	e.waitWaiter("sched", "cand-b")
	if e.exists("leader-cand-b") {
		t.Fatalf("cand-b's command ran while cand-a leads")
	}
	if r := e.run("elect", "sched", "--leader"); !leaderA.MatchString(r.stdout) {
		t.Errorf("elect --leader with cand-b waiting: got = %v, expected: still cand-a", r)
	}

	// cand-a stops: cand-b is elected at once and runs its command.
	a.signal(t, syscall.SIGTERM)
	if code := a.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("cand-a after SIGTERM: exit code got = %d, expected: %d", code, 128+int(syscall.SIGTERM))
	}
	fb := strings.Fields(e.waitFile("leader-cand-b", 10*time.Second))
	if tb, _ := strconv.ParseInt(fb[0], 10, 64); len(fb) != 3 || fb[1] != "cand-b" || tb <= mustInt(t, tokA) {
		t.Errorf("cand-b's command environment: got = %q, expected: a token above %s and cand-b", fb, tokA)
	}
	leaderB := regexp.MustCompile(`^revision=\d+ leader=cand-b value="b:2" token=` + fb[0] + `\n$`)
	if r := e.run("elect", "sched", "--leader"); r.code != 0 || !leaderB.MatchString(r.stdout) {
		t.Errorf("elect --leader: got = %v, expected: cand-b with value b:2 and token %s", r, fb[0])
	}

	// The observer saw the election as it happened: no leader (if it
	// started first), cand-a, then (perhaps after a moment with none)
	// cand-b.
	var lines []string
	waitFor(t, 10*time.Second, "the observer to see cand-b", func() bool {
		lines = strings.Split(strings.TrimSuffix(obs.stdout.String(), "\n"), "\n")
		return strings.Contains(lines[len(lines)-1], "leader=cand-b")
	})
	var leaders []string
	for _, l := range lines {
		m := regexp.MustCompile(`^revision=\d+ leader=(\S+)`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("elect --observe line: got = %q, expected: revision=N leader=...", l)
		}
		leaders = append(leaders, m[1])
	}
	if got := strings.Join(leaders, " "); !regexp.MustCompile(`^(<none> )?cand-a (<none> )?cand-b$`).MatchString(got) {
		t.Errorf("elect --observe: got = %q, expected: [<none>] cand-a [<none>] cand-b:\n%s", got, obs.stdout)
	}
	if !strings.Contains(obs.stdout.String(), `leader=cand-a value="a:1" token=`+tokA+"\n") {
		t.Errorf("elect --observe: got = %q, expected: cand-a's value and token", obs.stdout)
	}

	b.signal(t, syscall.SIGINT)
	if code := b.wait(t, 10*time.Second); code != 128+int(syscall.SIGINT) {
		t.Errorf("cand-b after SIGINT: exit code got = %d, expected: %d", code, 128+int(syscall.SIGINT))
	}
	obs.signal(t, syscall.SIGINT)
	if code := obs.wait(t, 10*time.Second); code != 0 {
		t.Errorf("elect --observe after SIGINT: exit code got = %d, expected: 0 (stderr %q)", code, obs.stderr)
	}
	e.expect(1, "", "Error: default/sched has no leader\n", "elect", "sched", "--leader")

	// The command's exit code is elect's too.
	e.expect(4, "", "", "elect", "sched", "--", "sh", "-c", "exit 4")

	// Losing leadership stops the command and exits non-zero; with
	// --retry, elect campaigns again and runs the command anew.
	for _, retry := range []bool{false, true} {
		name := fmt.Sprintf("loss-retry-%v", retry)
		args := []string{"elect", "--identity", name, "--kill-grace", "500ms", name}
		if retry {
			args = append(args, "--retry")
		}
		p := e.start(append(args, "--", "sh", "-c", `echo $TENURE_FENCING_TOKEN >> tokens-$TENURE_HOLDER; sleep 30`)...)
		tokens := func(n int) []string {
			var toks []string
			waitFor(t, 10*time.Second, fmt.Sprintf("%d runs of %s's command", n, name), func() bool {
				b, _ := os.ReadFile(e.path("tokens-" + name))
				toks = strings.Fields(string(b))
				return len(toks) >= n
			})
			return toks
		}
		tok := tokens(1)[0]
		e.expect(0, fmt.Sprintf("revoked default/%s token %s\n", name, tok), "", "revoke", name)
		if !retry {
			code := p.wait(t, 10*time.Second)
			if want := fmt.Sprintf("Error: lost leadership of default/%s; the command was stopped\n", name); code != 128+int(syscall.SIGTERM) || p.stderr.String() != want {
				t.Errorf("elect after a revoke: got = exit %d, stderr %q, expected: exit %d, %q", code, p.stderr, 128+int(syscall.SIGTERM), want)
			}
			continue
		}
		toks := tokens(2)
		if mustInt(t, toks[1]) <= mustInt(t, tok) {
			t.Errorf("elect --retry after a revoke: tokens got = %v, expected: a second, higher one", toks)
		}
		if want := fmt.Sprintf("tenure: lost leadership of default/%s; the command was stopped; campaigning again\n", name); p.stderr.String() != want {
			t.Errorf("elect --retry after a revoke: stderr got = %q, expected: %q", p.stderr, want)
		}
		p.signal(t, syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
			t.Errorf("elect --retry after SIGTERM: exit code got = %d, expected: %d", code, 128+int(syscall.SIGTERM))
		}
	}
}

// TestCLIElectRetryOutlivesItsSessionWhileWaiting: with --retry, a
// candidate whose session is lost while it waits — here the server
// closes it — campaigns on with a new session, and runs its command once
// the leader steps down. Without --retry the loss ends the wait, as for
// tenure lock.
func TestCLIElectRetryOutlivesItsSessionWhileWaiting(t *testing.T) {
	e := newCLIEnv(t)
	leader := e.start("elect", "--identity", "leader", "gap", "--", "sh", "-c", `echo ready > ready-leader; sleep 30`)
	e.waitFile("ready-leader", 10*time.Second)
	waiter := e.start("elect", "--identity", "waiter", "--retry", "--ttl", "3s", "--kill-grace", "500ms", "gap", "--", "sh", "-c",
		`echo $TENURE_FENCING_TOKEN > ran-waiter; sleep 30`)
	e.waitWaiter("gap", "waiter")
	first := e.sessionOf("waiter")

	sessions := tenurev1connect.NewSessionServiceClient(http.DefaultClient, "http://"+e.endpoints)
	if _, err := sessions.Close(context.Background(), connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: first})); err != nil {
		t.Fatalf("close the waiter's session %d: %v", first, err)
	}
	waitFor(t, 10*time.Second, "the waiter to wait again with a new session", func() bool {
		id := e.sessionOf("waiter")
		return id != 0 && id != first && len(e.lease("gap").Status.Waiters) == 1
	})
	if waiter.exited() || e.exists("ran-waiter") {
		t.Fatalf("elect --retry after its session was closed: got = exited %v, ran %v (stderr %q), expected: still waiting", waiter.exited(), e.exists("ran-waiter"), waiter.stderr)
	}

	// A signal ends a wait of --retry, too.
	quitter := e.start("elect", "--identity", "quitter", "--retry", "gap", "--", "sh", "-c", `echo ran > ran-quitter`)
	e.waitWaiter("gap", "quitter")
	quitter.signal(t, syscall.SIGINT)
	if code := quitter.wait(t, 10*time.Second); code != 1 || quitter.stderr.String() != "Error: interrupted while campaigning for default/gap\n" || e.exists("ran-quitter") {
		t.Errorf("elect --retry interrupted while waiting: got = exit %d, stderr %q, expected: exit 1, \"Error: interrupted while campaigning for default/gap\", and no run", code, quitter.stderr)
	}

	leader.signal(t, syscall.SIGTERM)
	if code := leader.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("leader after SIGTERM: exit code got = %d, expected: %d", code, 128+int(syscall.SIGTERM))
	}
	e.waitFile("ran-waiter", 10*time.Second)
	waiter.signal(t, syscall.SIGTERM)
	if code := waiter.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) || strings.Contains(waiter.stderr.String(), "Error:") {
		t.Errorf("waiter after SIGTERM: got = exit %d, stderr %q, expected: exit %d and no error", code, waiter.stderr, 128+int(syscall.SIGTERM))
	}
}

// sessionOf returns the ID of identity's open session, 0 if it has none.
func (e *cliEnv) sessionOf(identity string) int64 {
	e.t.Helper()
	r := e.run("get", "sessions", "-o", "json")
	var list struct {
		Items []struct {
			ID       int64  `json:"id"`
			Identity string `json:"identity"`
		} `json:"items"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil {
		e.t.Fatalf("tenure get sessions -o json: got = %v, expected: a list of sessions", r)
	}
	for _, s := range list.Items {
		if s.Identity == identity {
			return s.ID
		}
	}
	return 0
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// --- inspecting ---

func TestCLIInspect(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "No leases found.\n", "", "get", "leases")
	e.expect(0, "No sessions found.\n", "", "get", "sessions")

	holder := e.start("lock", "--identity", "inspector", "-n", "ops", "report", "--", "sh", "-c", `echo $TENURE_FENCING_TOKEN > token; sleep 30`)
	token := e.waitFile("token", 10*time.Second)

	// Leases: kubectl's columns, NAMESPACE only across namespaces.
	e.expect(0, "No leases found.\n", "", "get", "leases")
	r := e.run("get", "leases", "-n", "ops")
	if !regexp.MustCompile(`^NAME +HOLDER +STATUS +AGE\nreport +inspector +Held +\d+s\n$`).MatchString(r.stdout) || r.code != 0 {
		t.Errorf("get leases -n ops: got = %v, expected: a row for report held by inspector", r)
	}
	r = e.run("get", "leases", "-A", "-o", "wide")
	wide := `^NAMESPACE +NAME +HOLDER +STATUS +AGE +TOKEN +TTL +EXPIRES-IN +MAX-HOLD +WAITERS +TRANSITIONS +VALUE\nops +report +inspector +Held +\d+s +` + token + ` +10s +\d+s +<none> +0 +0 +<none>\n$`
	if !regexp.MustCompile(wide).MatchString(r.stdout) || r.code != 0 {
		t.Errorf("get leases -A -o wide: got = %v, expected: to match %q", r, wide)
	}
	r = e.run("get", "lease", "report", "-n", "ops", "-o", "yaml")
	for _, want := range []string{"kind: Lease\n", "  holderIdentity: inspector\n", "  leaseDurationSeconds: 10\n", "  fencingToken: " + token + "\n", "  namespace: ops\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get lease report -o yaml: got = %v, expected: %q in it", r, want)
		}
	}
	r = e.run("get", "leases", "-A", "-o", "json")
	var list struct {
		Kind  string      `json:"kind"`
		Items []leaseJSON `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 1 || strconv.FormatInt(list.Items[0].Status.FencingToken, 10) != token {
		t.Errorf("get leases -A -o json: got = %v (%v), expected: a List with the one lease", r, err)
	}
	e.expect(0, "No leases found.\n", "", "get", "leases", "-A", "-l", "app=none")
	if r := e.run("get", "lease", "nope"); r.code != 1 || !strings.HasPrefix(r.stderr, "Error: ") {
		t.Errorf("get lease nope: got = %v, expected: exit 1 and an error", r)
	}

	// Sessions: the holder's session, with its lease.
	r = e.run("get", "sessions")
	sessions := `^ID +IDENTITY +TTL +AGE +LAST-HEARTBEAT +LEASES +WAITING\n\d+ +inspector +10s +\d+s +(<none>|\d+s ago) +ops/report +<none>\n$`
	if !regexp.MustCompile(sessions).MatchString(r.stdout) || r.code != 0 {
		t.Errorf("get sessions: got = %v, expected: to match %q", r, sessions)
	}
	r = e.run("get", "sessions", "-o", "json")
	var sl struct {
		Items []struct {
			Identity string   `json:"identity"`
			Leases   []string `json:"leases"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sl); err != nil || len(sl.Items) != 1 || sl.Items[0].Identity != "inspector" || strings.Join(sl.Items[0].Leases, ",") != "ops/report" {
		t.Errorf("get sessions -o json: got = %v (%v), expected: inspector holding ops/report", r, err)
	}

	// Validate: the holder's token is valid, an older one is not.
	e.expect(0, "valid: token "+token+" holds ops/report (holder inspector)\n", "", "validate", "-n", "ops", "report", "--token", token)
	e.expect(1, "not valid: the current holder of ops/report is inspector with token "+token+"\n", "", "validate", "-n", "ops", "report", "--token", "1")

	// Watch, in its table form: the grant, then its end.
	w := e.start("watch", "-A", "--rev", "1")
	acquired := regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  acquired +ops/report holder=inspector token=` + token + ` revision=` + token + `$`)
	waitFor(t, 10*time.Second, "tenure watch to print the grant", func() bool { return acquired.MatchString(w.stdout.String()) })
	holder.signal(t, syscall.SIGTERM)
	holder.wait(t, 10*time.Second)
	released := regexp.MustCompile(`(?m)^\S+  released +ops/report holder=inspector token=` + token + `( reason="[^"]*")? revision=\d+$`)
	waitFor(t, 10*time.Second, "tenure watch to print the release", func() bool { return released.MatchString(w.stdout.String()) })
	w.signal(t, syscall.SIGINT)
	if code := w.wait(t, 10*time.Second); code != 0 {
		t.Errorf("watch after SIGINT: exit code got = %d, expected: 0 (stderr %q)", code, w.stderr)
	}
	e.expect(0, "No sessions found.\n", "", "get", "sessions")
	r = e.run("get", "leases", "-n", "ops")
	if !regexp.MustCompile(`^NAME +HOLDER +STATUS +AGE\nreport +<none> +Released \d+s ago +<none>\n$`).MatchString(r.stdout) {
		t.Errorf("get leases -n ops after the release: got = %v, expected: report with no holder, released", r)
	}
}

// --- help and completion ---

func TestCLIHelpAndCompletion(t *testing.T) {
	bin := tenureBinary(t)
	run := func(args ...string) result {
		cmd := exec.Command(bin, args...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return result{out.String(), errOut.String(), cmd.ProcessState.ExitCode()}
	}
	r := run("completion", "bash")
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "__start_tenure") {
		t.Errorf("completion bash: got = exit %d, stderr %q, %d bytes, expected: a bash completion script", r.code, r.stderr, len(r.stdout))
	}
	// The script loads in bash and completes the command names.
	if _, err := exec.LookPath("bash"); err == nil {
		script := filepath.Join(t.TempDir(), "tenure.bash")
		if err := os.WriteFile(script, []byte(r.stdout), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("bash", "-c", `source "$1" && complete -p tenure`, "bash", script).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "__start_tenure") {
			t.Errorf("bash: source the completion script: got = %v, %q, expected: complete -p tenure to show it", err, out)
		}
	}
	r = run("__complete", "k")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "kv\t") {
		t.Errorf("__complete k: got = %v, expected: kv", r)
	}

	for _, args := range [][]string{
		{}, {"serve"}, {"lock"}, {"elect"}, {"get"}, {"get", "leases"}, {"get", "sessions"}, {"validate"}, {"revoke"}, {"watch"},
		{"kv"}, {"kv", "get"}, {"kv", "range"}, {"kv", "put"}, {"kv", "del"}, {"kv", "mk"}, {"kv", "set"}, {"kv", "watch"},
	} {
		r := run(append(args, "--help")...)
		if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Examples:\n  ") || !strings.Contains(r.stdout, "Usage:\n  tenure") {
			t.Errorf("tenure %s --help: got = exit %d, stderr %q, expected: exit 0 with usage and examples:\n%s", strings.Join(args, " "), r.code, r.stderr, r.stdout)
		}
	}
	r = run("--help")
	for _, group := range []string{"Run under a lock or leadership:", "Inspect and administer:", "Keys:", "Server:"} {
		if !strings.Contains(r.stdout, group) {
			t.Errorf("tenure --help: got = %q, expected: the group %q", r.stdout, group)
		}
	}
}

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
