package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one server process the harness started. Stop ends it; every
// proc is stopped by the Server that owns it.
type proc struct {
	thread    *forkThread // started it, and starts it again
	name      string
	bin       string
	args, env []string // as started, for restart
	cmd       *exec.Cmd
	logPath   string
	exited    chan struct{} // closed once cmd.Wait has returned
	waitErr   error         // set before exited is closed
	// traced: the process is strace, and the server its child
	// (etcdsync.go); signals go to the group, which holds both.
	traced bool
}

// startProc runs bin with args and env added to the harness's
// environment, its output appended to logPath, forked on thread.
func startProc(thread *forkThread, name, bin string, args, env []string, logPath string) (*proc, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("%s: open its log: %w", name, err)
	}
	defer log.Close() // the child has its own descriptor
	fmt.Fprintf(log, "=== %s %s %s\n", time.Now().Format(time.RFC3339), strings.Join(append(slices.Clone(env), bin), " "), strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	childAttr(cmd)
	if err := thread.run(cmd.Start); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &proc{thread: thread, name: name, bin: bin, args: args, env: env, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// serverPid is the server's own process, whose CPU and memory are
// measured: the process started, or its child when it is strace. 0 when
// a traced server has not started yet.
func (p *proc) serverPid() int {
	if !p.traced {
		return p.pid()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.pid(), p.pid()))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group and waits up to grace for the
// process to exit, then kills the group. It returns once the process has
// been reaped. Safe to call twice.
func (p *proc) stop(grace time.Duration) {
	if p.running() {
		_ = signalGroup(p.pid(), syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(grace):
		}
	}
	// Also after a clean exit: a grandchild may still hold the group.
	_ = signalGroup(p.pid(), syscall.SIGKILL)
	<-p.exited
}

// kill sends SIGKILL to the process group, as a crash or kill -9 would
// end it, and returns once the process has been reaped.
func (p *proc) kill() {
	_ = signalGroup(p.pid(), syscall.SIGKILL)
	<-p.exited
}

// restart starts the process again as it was started, on the same data
// and log.
func (p *proc) restart() (*proc, error) {
	np, err := startProc(p.thread, p.name, p.bin, p.args, p.env, p.logPath)
	if err == nil {
		np.traced = p.traced
	}
	return np, err
}

// forkThread is an OS thread that servers are started from, locked to
// a goroutine of its own until close. The kernel sends a child's
// parent-death signal (childAttr) when the *thread* that forked it ends,
// not the process, and the Go runtime ends a thread whose goroutine
// exits locked to it, as delayline's sleepers do when a link closes: a
// server forked on a thread that later served such a goroutine was
// killed with it (all three nodes at once, when a failover's kill
// closed the links). Threads locked here serve nothing else.
type forkThread struct {
	calls chan func()
	done  chan struct{} // closed when the goroutine has ended
}

func newForkThread() *forkThread {
	t := &forkThread{calls: make(chan func()), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		runtime.LockOSThread() // never unlocked: the thread ends with close
		for f := range t.calls {
			f()
		}
	}()
	return t
}

// run runs f on the thread and returns its error.
func (t *forkThread) run(f func() error) error {
	errc := make(chan error, 1)
	t.calls <- func() { errc <- f() }
	return <-errc
}

// close ends the thread; the processes forked on it that still run get
// their parent-death signal. The caller must have stopped them first.
func (t *forkThread) close() {
	close(t.calls)
	<-t.done
}

// usage is a process's CPU time (user and system) and resident memory.
type usage struct {
	CPU time.Duration
	RSS int64 // bytes
}

// clockTick is the kernel's USER_HZ, the unit of /proc/PID/stat's CPU
// times: 100 on every Linux that Go supports.
const clockTick = 100

// readUsage reads pid's CPU time from /proc/PID/stat (utime + stime) and
// its resident set from /proc/PID/status (VmRSS).
func readUsage(pid int) (usage, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return usage{}, fmt.Errorf("read CPU time: %w", err)
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return usage{}, err
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return usage{}, fmt.Errorf("read memory: %w", err)
	}
	rss, err := parseStatusRSS(status)
	if err != nil {
		return usage{}, err
	}
	return usage{CPU: cpu, RSS: rss}, nil
}

// harnessCPU is this process's CPU time, 0 if /proc cannot say.
func harnessCPU() time.Duration {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	cpu, _ := parseStatCPU(stat)
	return cpu
}

// machineBusy is the CPU time all the machine's CPUs have spent on
// anything but idling and waiting for I/O since boot, 0 if /proc cannot
// say.
func machineBusy() time.Duration {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	busy, _ := parseBusy(stat)
	return busy
}

// parseBusy returns the busy time in the "cpu" line of /proc/stat: every
// field but idle (4th) and iowait (5th), in clock ticks. Guest time is
// already counted in user, and is not added twice.
func parseBusy(stat []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q, want \"cpu\" and at least 8 counters", line)
	}
	var busy int64
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTick, nil
}

// parseStatCPU returns utime + stime from the text of /proc/PID/stat.
// The command name (field 2) is in parentheses and may hold spaces, so
// the fields are counted from the last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no ')' after the command name")
	}
	// After ')': state(3) ppid(4) ... utime(14) stime(15).
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the command name, want at least 13", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/PID/stat: %w", err)
	}
	return time.Duration(utime+stime) * time.Second / clockTick, nil
}

// parseStatusRSS returns VmRSS in bytes from the text of /proc/PID/status.
func parseStatusRSS(status []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc/PID/status: VmRSS %q, want \"N kB\"", rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/status: VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("/proc/PID/status: no VmRSS line (the process has exited?)")
}

// waitFor polls ok every 20ms until it returns nil, the process exits,
// or ctx ends, and returns ok's last error in the last two cases.
func waitFor(ctx context.Context, procs []*proc, ok func(ctx context.Context) error) error {
	for {
		err := ok(ctx)
		if err == nil {
			return nil
		}
		for _, p := range procs {
			if !p.running() {
				return fmt.Errorf("%s exited (%v) before it was ready; its log is %s:\n%s", p.name, p.waitErr, p.logPath, tail(p.logPath, 20))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last: %w)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tail is the last n lines of the file at path, for an error message.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
