//go:build !unix

package raftnode

import "os"

// tryLock cannot lock on this platform: a second process on the same
// data directory is not turned away here.
func tryLock(f *os.File) (bool, error) { return true, nil }
