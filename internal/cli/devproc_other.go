//go:build !linux

package cli

import "syscall"

// devNodeAttr puts a dev cluster node in a process group of its own, so
// that a Ctrl-C in the terminal reaches only tenure dev cluster, which
// forwards it once. Only Linux can also stop the nodes when tenure dev
// cluster is killed outright.
func devNodeAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
