//go:build !unix

package raftnode

// freeBytes cannot tell free space on this platform: the reserve is not
// enforced, and only a failed write reports a full disk.
func freeBytes(dir string) (uint64, bool, error) { return 0, false, nil }
