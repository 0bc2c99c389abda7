//go:build !linux

package proccluster

import "os/exec"

func setDeathSignal(cmd *exec.Cmd) {}
