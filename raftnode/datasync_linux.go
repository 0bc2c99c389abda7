package raftnode

import "golang.org/x/sys/unix"

const haveFdatasync = true

func fdatasync(fd int) error {
	for {
		err := unix.Fdatasync(fd)
		if err != unix.EINTR {
			return err
		}
	}
}
