package raftnode

import (
	"cmp"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	raftwal "github.com/hashicorp/raft-wal"
)

// walSegmentSize is the size each raft-wal segment preallocates.
func (c Config) walSegmentSize() int { return cmp.Or(c.WALSegmentSize, raftwal.DefaultSegmentSize) }

// DiskFullError is returned by Propose while the data directory's file
// system has less free space than the node's reserve, and by Open when
// the log cannot even be created. errors.Is(err, ErrDiskFull) matches it.
type DiskFullError struct {
	Dir     string // the data directory
	Free    uint64 // bytes available, when known
	Reserve uint64 // the free space the node keeps, when that is the reason
	Err     error  // the failed write, when that is the reason
}

func (e *DiskFullError) Error() string {
	switch {
	case e.Reserve > 0:
		return fmt.Sprintf("disk full: %s has %s free, less than the %s the node keeps in reserve; writes are refused until space is freed", e.Dir, bytesString(e.Free), bytesString(e.Reserve))
	case e.Err != nil:
		return fmt.Sprintf("disk full: writing to %s failed: %v", e.Dir, e.Err)
	}
	return fmt.Sprintf("disk full: %s", e.Dir)
}

func (e *DiskFullError) Is(target error) bool { return target == ErrDiskFull }

func (e *DiskFullError) Unwrap() error { return e.Err }

// isNoSpace reports whether err is the file system saying it is full (or
// the user's quota is).
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// bytesString prints a size in the largest binary unit that keeps it
// above one.
func bytesString(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// spaceCheck tracks whether the data directory has room for writes: the
// free space against the reserve, measured every DiskCheckInterval and
// when a write fails, and any append that failed for lack of space.
type spaceCheck struct {
	dir     string
	reserve uint64 // 0: no reserve
	free    func(dir string) (uint64, bool, error)
	metrics *metrics

	low      atomic.Pointer[DiskFullError] // free space below the reserve
	writeErr atomic.Pointer[DiskFullError] // an append failed; cleared when the log works again
}

func newSpaceCheck(dir string, cfg Config, m *metrics) *spaceCheck {
	c := &spaceCheck{dir: dir, free: freeBytes, metrics: m}
	if cfg.FreeSpace != nil {
		c.free = func(dir string) (uint64, bool, error) {
			free, err := cfg.FreeSpace(dir)
			return free, err == nil, err
		}
	}
	switch {
	case cfg.MinFreeBytes > 0:
		c.reserve = uint64(cfg.MinFreeBytes)
	case cfg.MinFreeBytes == 0:
		c.reserve = 2 * uint64(cfg.walSegmentSize())
	}
	return c
}

// check measures free space now and returns a *DiskFullError if it is
// below the reserve (or an append failed). A file system that cannot
// tell is never low.
func (c *spaceCheck) check() error {
	c.measure()
	return c.err()
}

// hasRoom measures free space and reports whether need bytes, and the
// reserve, are free. A file system that cannot tell always has room.
func (c *spaceCheck) hasRoom(need uint64) bool {
	free, known := c.measure()
	return !known || free >= max(need, c.reserve)
}

// measure reads the free space and records whether it is below the
// reserve.
func (c *spaceCheck) measure() (free uint64, known bool) {
	free, known, err := c.free(c.dir)
	if err != nil || !known {
		c.low.Store(nil)
		c.publish()
		return 0, false
	}
	c.metrics.diskFree.Set(float64(free))
	if c.reserve > 0 && free < c.reserve {
		c.low.Store(&DiskFullError{Dir: c.dir, Free: free, Reserve: c.reserve})
	} else {
		c.low.Store(nil)
	}
	c.publish()
	return free, true
}

// err is the current condition: nil while writes have room. It is on
// every write's path, so it only loads.
func (c *spaceCheck) err() error {
	if e := c.low.Load(); e != nil {
		return e
	}
	if e := c.writeErr.Load(); e != nil {
		return e
	}
	return nil
}

// publish sets the disk-full gauge from the current condition.
func (c *spaceCheck) publish() {
	if c.err() != nil {
		c.metrics.diskFull.Set(1)
	} else {
		c.metrics.diskFull.Set(0)
	}
}

// failed records an append that failed for lack of space.
func (c *spaceCheck) failed(err error) {
	free, _, _ := c.free(c.dir)
	c.writeErr.Store(&DiskFullError{Dir: c.dir, Free: free, Err: err})
	c.publish()
}

// recovered clears a failed append once the log takes writes again.
func (c *spaceCheck) recovered() {
	c.writeErr.Store(nil)
	c.publish()
}

// DiskFull reports whether writes should be refused for lack of space:
// nil, or a *DiskFullError (errors.Is ErrDiskFull) naming the directory
// and the free space. Reads and Close are unaffected.
func (n *Node) DiskFull() error { return n.space.err() }

// watchSpace measures free space every interval until Close.
func (n *Node) watchSpace(interval time.Duration) {
	defer n.wg.Done()
	if interval <= 0 {
		interval = time.Second
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			was := n.space.err()
			now := n.space.check()
			switch {
			case now != nil && was == nil:
				n.log.Error("writes refused: low on disk space", "err", now)
			case now == nil && was != nil:
				n.log.Info("disk space is back; writes resume")
			}
		case <-n.shutdownCh:
			return
		}
	}
}

// unmeasuredSpace is the space check of a node given its stores: there
// are no files of its own to measure, so it never refuses a write.
func unmeasuredSpace(m *metrics) *spaceCheck {
	return &spaceCheck{
		free:    func(string) (uint64, bool, error) { return 0, false, nil },
		metrics: m,
	}
}
