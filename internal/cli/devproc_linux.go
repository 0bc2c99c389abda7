package cli

import "syscall"

// devNodeAttr puts a dev cluster node in a process group of its own, so
// that a Ctrl-C in the terminal reaches only tenure dev cluster, which
// forwards it once; and has the kernel send it SIGTERM if tenure dev
// cluster dies without doing so (kill -9), so that no node outlives it.
func devNodeAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
