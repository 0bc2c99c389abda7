//go:build !linux

package proccluster

import "errors"

// canIdentify reports whether socketOwner works on this system.
const canIdentify = false

func socketOwner(localPort, remotePort int, pids []int) (int, error) {
	return 0, errors.New("finding a socket's process needs Linux's /proc")
}
