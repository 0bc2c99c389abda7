package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// child runs a command in its own process group under a grant: signals
// to tenure are forwarded to the whole group, and when the grant may be
// lost the whole group — grandchildren started by `sh -c` included — is
// stopped before anyone else can be granted.
type child struct {
	args      []string
	env       []string // added to tenure's own environment
	unset     []string // names of tenure's own variables the command does not get
	killGrace time.Duration
	stdin     io.Reader
	stdout    io.Writer
	stderr    io.Writer
}

// forwarded are the signals passed on to the child's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// run starts the command and waits for it. When lost is closed first, the
// group gets SIGTERM, then SIGKILL after killGrace, and run returns
// lostFirst = true. Either way, every process left in the group is killed
// and reaped before run returns, so nothing the command started outlives
// the grant. The exit code follows the shell's convention: 128+N for a
// command killed by signal N.
func (c *child) run(lost <-chan struct{}) (code int, lostFirst bool, err error) {
	becomeSubreaper()

	cmd := exec.Command(c.args[0], c.args[1:]...)
	cmd.Env = append(withoutVars(os.Environ(), c.unset), c.env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.stdin, c.stdout, c.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	if err := cmd.Start(); err != nil {
		return 127, false, fmt.Errorf("start %s: %w", c.args[0], startCause(err))
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var waitErr error
	killed := false
	var graceTimer <-chan time.Time
loop:
	for {
		select {
		case waitErr = <-exited:
			break loop
		case s := <-sigs:
			_ = unix.Kill(-pgid, s.(syscall.Signal))
		case <-lost:
			lost = nil
			lostFirst = true
			_ = unix.Kill(-pgid, syscall.SIGTERM)
			graceTimer = time.After(c.killGrace)
		case <-graceTimer:
			killed = true
			_ = unix.Kill(-pgid, syscall.SIGKILL)
		}
	}
	stragglers := c.reapGroup(pgid, lostFirst || killed)
	if stragglers > 0 && !lostFirst {
		fmt.Fprintf(c.stderr, "tenure: stopped %d process(es) the command left running in its group\n", stragglers)
	}
	return exitCode(waitErr), lostFirst, nil
}

// reapGroup kills whatever is left of the process group and waits until
// it is gone. Without a grace (the grant is lost, or its time ran out)
// the stragglers get SIGKILL at once.
func (c *child) reapGroup(pgid int, now bool) int {
	if unix.Kill(-pgid, 0) != nil {
		return 0
	}
	stragglers := 0
	if !now {
		_ = unix.Kill(-pgid, syscall.SIGTERM)
		deadline := time.Now().Add(c.killGrace)
		for time.Now().Before(deadline) && c.groupAlive(pgid, &stragglers) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = unix.Kill(-pgid, syscall.SIGKILL)
	// SIGKILL cannot be ignored; the bound only guards against zombies
	// whose parent is not us and never reaps them.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && c.groupAlive(pgid, &stragglers); {
		time.Sleep(5 * time.Millisecond)
	}
	return max(stragglers, 1)
}

// groupAlive reaps what it can of the group and reports whether any of
// it is still there.
func (c *child) groupAlive(pgid int, reaped *int) bool {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-pgid, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
		*reaped++
	}
	return !errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}

// withoutVars is env ("NAME=value" entries) without the variables named.
func withoutVars(env, names []string) []string {
	return slices.DeleteFunc(env, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}

// startCause is why a command could not start, without the command's
// name, which exec's errors repeat ("exec: \"./x\": stat ./x: no such
// file or directory") after the one start already gives.
func startCause(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}
