//go:build !linux

package proccluster

import "errors"

// canIdentify reports whether socketOwner works on this system.
const canIdentify = false

func socketOwners(pids []int) (map[[2]int]int, error) {
	return nil, errors.New("finding a socket's process needs Linux's /proc")
}
