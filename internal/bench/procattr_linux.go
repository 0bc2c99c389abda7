package bench

import (
	"os/exec"
	"syscall"
)

// childAttr puts a server in a process group of its own, so that a
// Ctrl-C in the terminal reaches only the harness, which stops its
// servers itself, and so that stopping one kills whatever it spawned;
// and has the kernel kill it should the harness die first (kill -9, a
// test's -timeout), so that no server outlives a run.
func childAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) error {
	return syscall.Kill(-pid, sig)
}
