//go:build !linux

package bench

import (
	"os/exec"
	"syscall"
)

func childAttr(cmd *exec.Cmd) {}

func signalGroup(pid int, sig syscall.Signal) error {
	return syscall.Kill(pid, sig)
}
