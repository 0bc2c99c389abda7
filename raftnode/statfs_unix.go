//go:build unix

package raftnode

import "golang.org/x/sys/unix"

// freeBytes is the space in dir's file system that this process may use.
func freeBytes(dir string) (uint64, bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true, nil
}
