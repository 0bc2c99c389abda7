//go:build linux

package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childRun is one child.run in a temporary directory. Its output goes to
// files, not pipes, as the binary's does: a pipe would keep cmd.Wait
// waiting for any grandchild that holds it.
type childRun struct {
	t            *testing.T
	dir          string
	stdout, errs *os.File
}

func newChildRun(t *testing.T) *childRun {
	t.Helper()
	dir := t.TempDir()
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	r := &childRun{t: t, dir: dir, stdout: open("stdout"), errs: open("stderr")}
	// Whatever happens to the test, nothing the command started outlives
	// it: every script first writes its process group.
	t.Cleanup(func() {
		if pgid, err := strconv.Atoi(strings.TrimSpace(r.read(".pgid"))); err == nil && pgid > 1 {
			_ = unix.Kill(-pgid, syscall.SIGKILL)
		}
	})
	return r
}

func (r *childRun) child(script string, killGrace time.Duration) *child {
	return &child{
		args:      []string{"sh", "-c", "cd " + r.dir + " || exit 99\necho $$ > .pgid\n" + script},
		env:       []string{"TENURE_FENCING_TOKEN=42", "TENURE_LEASE=default/x"},
		killGrace: killGrace,
		stdout:    r.stdout,
		stderr:    r.errs,
	}
}

func (r *childRun) read(name string) string {
	b, _ := os.ReadFile(filepath.Join(r.dir, name))
	return string(b)
}

// waitFile waits until the command has written name.
func (r *childRun) waitFile(name string) string {
	r.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s := r.read(name); strings.HasSuffix(s, "\n") {
			return strings.TrimSpace(s)
		}
	}
	r.t.Fatalf("%s: got = nothing after 5s, expected: the command to write it", name)
	return ""
}

// pids reads "PGID GRANDCHILD" written by the scripts below.
func (r *childRun) pids() (pgid, grandchild int) {
	r.t.Helper()
	f := strings.Fields(r.waitFile("pids"))
	if len(f) != 2 {
		r.t.Fatalf("pids: got = %q, expected: two numbers", f)
	}
	pgid, _ = strconv.Atoi(f[0])
	grandchild, _ = strconv.Atoi(f[1])
	return pgid, grandchild
}

type runResult struct {
	code int
	lost bool
	err  error
	took time.Duration
}

func (r *childRun) start(c *child, lost <-chan struct{}) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		began := time.Now()
		code, lostFirst, err := c.run(lost)
		done <- runResult{code, lostFirst, err, time.Since(began)}
	}()
	return done
}

func (r *childRun) wait(done <-chan runResult) runResult {
	r.t.Helper()
	select {
	case res := <-done:
		return res
	case <-time.After(15 * time.Second):
		r.t.Fatalf("child.run: still running after 15s")
	}
	return runResult{}
}

// gone reports whether nothing of the process group and the grandchild
// is left, zombies included.
func gone(pgid, grandchild int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(grandchild))
	return errors.Is(unix.Kill(-pgid, 0), unix.ESRCH) && errors.Is(err, os.ErrNotExist)
}

func TestChildExitCodes(t *testing.T) {
	tests := []struct {
		name   string
		script string
		code   int
	}{
		{"a command that succeeds exits 0", "true", 0},
		{"the command's exit code is passed on", "exit 7", 7},
		{"a command killed by a signal exits 128+N, as in a shell", "kill -TERM $$", 128 + int(syscall.SIGTERM)},
		{"a command killed by SIGKILL exits 137", "kill -KILL $$", 137},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newChildRun(t)
			res := r.wait(r.start(r.child(tt.script, time.Second), nil))
			if res.err != nil || res.lost || res.code != tt.code {
				t.Errorf("got = code %d, lost %v, err %v, expected: code %d, not lost, no error", res.code, res.lost, res.err, tt.code)
			}
		})
	}
}

// A command that cannot start exits 127, and the error names it once.
func TestChildCannotStart(t *testing.T) {
	r := newChildRun(t)
	missing := filepath.Join(r.dir, "no-such-command")
	for _, tt := range []struct{ name, want string }{
		{missing, "start " + missing + ": no such file or directory"},
		{"no-such-command-on-the-path", "start no-such-command-on-the-path: executable file not found in $PATH"},
	} {
		c := r.child("", time.Second)
		c.args = []string{tt.name}
		res := r.wait(r.start(c, nil))
		if res.code != 127 || res.err == nil || res.err.Error() != tt.want {
			t.Errorf("%s: got = code %d, err %v, expected: code 127 and %q", tt.name, res.code, res.err, tt.want)
		}
	}
}

func TestChildEnvironment(t *testing.T) {
	r := newChildRun(t)
	res := r.wait(r.start(r.child(`echo "$TENURE_LEASE $TENURE_FENCING_TOKEN $HOME" > env`, time.Second), nil))
	if res.code != 0 {
		t.Fatalf("exit code got = %d, expected: 0", res.code)
	}
	if got, want := r.read("env"), "default/x 42 "+os.Getenv("HOME")+"\n"; got != want {
		t.Errorf("environment got = %q, expected: %q (the grant added to tenure's own environment)", got, want)
	}
}

func TestChildRunsInItsOwnProcessGroup(t *testing.T) {
	r := newChildRun(t)
	res := r.wait(r.start(r.child(`ps -o pgid= -p $$ | tr -d ' ' > pgid; echo $$ > pid`, time.Second), nil))
	if res.code != 0 {
		t.Fatalf("exit code got = %d, expected: 0", res.code)
	}
	if pgid, pid := r.read("pgid"), r.read("pid"); pgid != pid {
		t.Errorf("process group got = %q, expected: its own, %q", pgid, pid)
	}
}

func TestChildStopsItsGroupOnLoss(t *testing.T) {
	tests := []struct {
		name      string
		script    string
		killGrace time.Duration
		code      int
		minTook   time.Duration // after the loss
		maxTook   time.Duration
	}{
		{"a command that stops on SIGTERM is stopped at once, its grandchild too",
			`sleep 1000 & echo "$$ $!" > pids; sleep 1000; wait`,
			5 * time.Second, 128 + int(syscall.SIGTERM), 0, 2 * time.Second},
		{"a command that ignores SIGTERM is killed after the grace, its grandchild too",
			`trap "" TERM; sleep 1000 & echo "$$ $!" > pids; sleep 1000; wait`,
			300 * time.Millisecond, 128 + int(syscall.SIGKILL), 300 * time.Millisecond, 2 * time.Second},
		{"a command that exits cleanly on SIGTERM but leaves a grandchild ignoring it still loses the grandchild",
			`trap "exit 0" TERM; (trap "" TERM; exec sleep 1000) & echo "$$ $!" > pids; while :; do sleep 0.05; done`,
			300 * time.Millisecond, 0, 0, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newChildRun(t)
			lost := make(chan struct{})
			done := r.start(r.child(tt.script, tt.killGrace), lost)
			pgid, grandchild := r.pids()
			if gone(pgid, grandchild) {
				t.Fatalf("process group %d: got = gone before the loss, expected: running", pgid)
			}
			lostAt := time.Now()
			close(lost)
			res := r.wait(done)
			took := time.Since(lostAt)
			if res.err != nil || !res.lost || res.code != tt.code {
				t.Errorf("got = code %d, lost %v, err %v, expected: code %d, lost, no error", res.code, res.lost, res.err, tt.code)
			}
			if took < tt.minTook || took > tt.maxTook {
				t.Errorf("run returned %v after the loss, expected: between %v and %v", took, tt.minTook, tt.maxTook)
			}
			// run returns only once the whole group is gone and reaped.
			if !gone(pgid, grandchild) {
				t.Errorf("process group %d and grandchild %d: got = still there when run returned, expected: gone", pgid, grandchild)
			}
		})
	}
}

func TestChildStragglersAreStoppedAndReported(t *testing.T) {
	r := newChildRun(t)
	res := r.wait(r.start(r.child(`sleep 1000 & echo "$$ $!" > pids; exit 5`, 2*time.Second), nil))
	pgid, grandchild := r.pids()
	if res.err != nil || res.lost || res.code != 5 {
		t.Errorf("got = code %d, lost %v, err %v, expected: code 5, not lost, no error", res.code, res.lost, res.err)
	}
	if !gone(pgid, grandchild) {
		t.Errorf("grandchild %d: got = still running after run returned, expected: stopped", grandchild)
	}
	if got := r.read("stderr"); got != "tenure: stopped 1 process(es) the command left running in its group\n" {
		t.Errorf("stderr got = %q, expected: a note on the stopped process", got)
	}
	if res.took > 2*time.Second {
		t.Errorf("run took %v, expected: well under the 2s grace, since the straggler stops on SIGTERM", res.took)
	}
}

func TestChildForwardsSignalsToItsGroup(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			r := newChildRun(t)
			// The grandchild reports the signal too: it goes to the whole group.
			n := strconv.Itoa(int(sig))
			script := `trap "echo child >> got; wait; exit 3" ` + n + `
(trap "echo grandchild >> got; exit 0" ` + n + `; echo > trapped; while :; do sleep 0.05; done) &
while [ ! -e trapped ]; do sleep 0.01; done
echo "$$ $!" > pids
while :; do sleep 0.05; done`
			done := r.start(r.child(script, time.Second), nil)
			r.pids()
			// tenure itself receives the signal; run passes it on.
			if err := unix.Kill(os.Getpid(), sig); err != nil {
				t.Fatal(err)
			}
			res := r.wait(done)
			if res.err != nil || res.lost || res.code != 3 {
				t.Errorf("got = code %d, lost %v, err %v, expected: code 3 from the trap", res.code, res.lost, res.err)
			}
			got := strings.Fields(r.read("got"))
			if len(got) != 2 || !strings.Contains(r.read("got"), "child") || !strings.Contains(r.read("got"), "grandchild") {
				t.Errorf("who got %v: got = %q, expected: the child and the grandchild", sig, got)
			}
		})
	}
}
