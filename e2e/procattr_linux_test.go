package e2e

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the server if the test process dies
// first (a panic or a -timeout), so that no server outlives a test run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
