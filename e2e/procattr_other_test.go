//go:build !linux

package e2e

import "os/exec"

// setDeathSignal does nothing where the kernel has no parent-death signal;
// t.Cleanup still kills the server.
func setDeathSignal(cmd *exec.Cmd) {}
