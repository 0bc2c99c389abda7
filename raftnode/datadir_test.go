//go:build unix

package raftnode

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tenurehq/tenure/statemachine"
)

func TestLockDataDirTurnsASecondHolderAway(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lock, err := LockDataDir(dir)
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	// flock locks belong to an open file, so a second open in this
	// process conflicts as another process's would.
	_, err = LockDataDir(dir)
	var inUse *DataDirInUseError
	if !errors.Is(err, ErrDataDirInUse) || !errors.As(err, &inUse) || inUse.PID != os.Getpid() || inUse.Dir != dir {
		t.Fatalf("got = %v, expected: a *DataDirInUseError naming %s and pid %d", err, dir, os.Getpid())
	}
	want := "data dir " + dir + " is in use by another tenure (pid " + strconv.Itoa(os.Getpid()) + ")"
	if err.Error() != want {
		t.Fatalf("got = %q, expected: %q", err, want)
	}
	var state bytes.Buffer
	if err := statemachine.New().Snapshot(&state); err != nil {
		t.Fatal(err)
	}
	if _, err := Seed(testConfig(dir, "wal"), &state); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("Seed on a locked dir: got = %v, expected: ErrDataDirInUse", err)
	}
	if err := lock.Unlock(); err != nil {
		t.Fatal(err)
	}
	// The pid left behind does not hold the directory: the lock does.
	if pid, _ := os.ReadFile(filepath.Join(dir, "LOCK")); len(pid) == 0 {
		t.Fatalf("got = an empty LOCK file, expected: the holder's pid")
	}
	again, err := LockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: got = %v, expected: taken", err)
	}
	again.Unlock()
}

// TestLockDataDirFailsWhenThePIDCannotBeWritten: a LOCK that can be
// opened and locked but not truncated (here a FIFO, which ftruncate
// refuses) must fail the lock with the path named, not hand out a lock
// whose file names nobody.
func TestLockDataDirFailsWhenThePIDCannotBeWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "LOCK")
	if err := unix.Mkfifo(path, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	lock, err := LockDataDir(dir)
	if err == nil {
		lock.Unlock()
		t.Fatalf("got = a lock on a LOCK file that cannot hold the pid, expected: an error naming %s", path)
	}
	if !strings.Contains(err.Error(), "write "+path) {
		t.Fatalf("got = %q, expected: an error naming the write of %s", err, path)
	}
}
