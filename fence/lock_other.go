//go:build !unix

package fence

import "os"

// lockFile opens path without locking it: on this platform FileStore
// cannot stop two stores from sharing a file.
func lockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

func unlockFile(f *os.File) error { return f.Close() }

// syncDir does nothing: directories cannot be fsynced on this platform.
func syncDir(string) error { return nil }
