package proccluster

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill a node if the test process dies
// first (a panic or a -timeout), so that no node outlives a test run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
