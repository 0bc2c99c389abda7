package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DataDirInUseError is returned by LockDataDir when another process holds
// the data directory. errors.Is(err, ErrDataDirInUse) matches it.
type DataDirInUseError struct {
	Dir string
	PID int // the holder's process ID, as it wrote it in the lock file; 0 when unknown
}

func (e *DataDirInUseError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("data dir %s is in use by another tenure (pid unknown; see %s)", e.Dir, filepath.Join(e.Dir, lockFileName))
	}
	return fmt.Sprintf("data dir %s is in use by another tenure (pid %d)", e.Dir, e.PID)
}

func (e *DataDirInUseError) Is(target error) bool { return target == ErrDataDirInUse }

// ErrDataDirInUse is returned by LockDataDir when another process holds
// the data directory; the error is a *DataDirInUseError.
var ErrDataDirInUse = errors.New("data dir in use")

// lockFileName is the file in the data directory that LockDataDir locks
// and writes its process ID in. It is never removed: removing it on exit
// would let two processes lock two different files of the same name.
const lockFileName = "LOCK"

// DataDirLock is a held lock on a data directory.
type DataDirLock struct{ f *os.File }

// LockDataDir takes an exclusive lock on dir for this process, without
// waiting, and writes the process ID into dir/LOCK. The WAL locks
// its own files too, but waits for them forever: a second process on the
// same directory must be turned away before it binds ports or opens the
// stores. The kernel drops the lock when the process ends, however it
// ends, so a LOCK file left by a killed process does not block a restart.
// The caller calls Unlock once the node is closed.
func LockDataDir(dir string) (*DataDirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("raftnode: lock data dir: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("raftnode: lock data dir: %s: %w", path, err)
	}
	if !held {
		data, _ := os.ReadFile(path)
		f.Close()
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		return nil, &DataDirInUseError{Dir: dir, PID: pid}
	}
	// One err for both steps: a truncate or pid write that fails must
	// fail the lock, not leave a file that names nobody or someone else.
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close() // also drops the lock
		return nil, fmt.Errorf("raftnode: lock data dir: write %s: %w", path, err)
	}
	return &DataDirLock{f: f}, nil
}

// Unlock releases the lock. The pid stays in the file; the lock, not the
// file, says whether the directory is in use.
func (l *DataDirLock) Unlock() error { return l.f.Close() }
