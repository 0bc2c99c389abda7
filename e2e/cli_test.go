//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}
