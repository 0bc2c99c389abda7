package raftnode

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/types"
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
// free space against the reserve, measured every DiskCheckInterval, on
// every append and around every new log segment, and any append that
// failed for lack of space. A burst of writes fills a segment in well
// under the interval, and a new segment takes its whole size at once, so
// the interval alone would notice the reserve gone only after the log
// had run out.
type spaceCheck struct {
	dir     string
	reserve uint64 // 0: no reserve
	free    func(dir string) (uint64, bool, error)
	metrics *metrics
	log     *slog.Logger

	low      atomic.Pointer[DiskFullError] // free space below the reserve
	writeErr atomic.Pointer[DiskFullError] // an append failed; cleared when the log works again
	// rotateErr is why the last new segment was not created: the cause
	// of the "segment is sealed" the next append fails with. It refuses
	// nothing itself, since only an append that fails makes raft step
	// down, elect again and so retry the log, which reopens it.
	rotateErr atomic.Pointer[DiskFullError]
}

func newSpaceCheck(dir string, cfg Config, m *metrics, log *slog.Logger) *spaceCheck {
	c := &spaceCheck{dir: dir, free: freeBytes, metrics: m, log: log}
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

// hasRoom measures free space and reports whether need bytes, and the
// reserve, are free. A file system that cannot tell always has room.
func (c *spaceCheck) hasRoom(need uint64) bool {
	free, known := c.measure()
	return !known || free >= max(need, c.reserve)
}

// measure reads the free space, records whether it is below the
// reserve and logs when that changes. It is a statfs, a few µs: cheap
// beside the fsync of the append it runs before.
func (c *spaceCheck) measure() (free uint64, known bool) {
	free, known, err := c.free(c.dir)
	var low *DiskFullError
	if err == nil && known {
		c.metrics.diskFree.Set(float64(free))
		if c.reserve > 0 && free < c.reserve {
			low = &DiskFullError{Dir: c.dir, Free: free, Reserve: c.reserve}
		}
	}
	was := c.low.Swap(low)
	c.publish()
	switch {
	case low != nil && was == nil:
		c.log.Error("writes refused: low on disk space", "err", low)
	case low == nil && was != nil:
		c.log.Info("disk space is back; writes resume", "free", bytesString(free))
	}
	return free, err == nil && known
}

// room returns a *DiskFullError, which errors.Is syscall.ENOSPC, when
// less than need bytes are free: a new log segment, preallocated whole,
// would not fit. It is called before one is created, so that the log
// stops at a clean end of segment rather than halfway through
// preallocating one.
func (c *spaceCheck) room(need uint64) error {
	free, known := c.measure()
	if !known || free >= need {
		return nil
	}
	return &DiskFullError{Dir: c.dir, Free: free, Err: fmt.Errorf("the log preallocates segments of %s (WALSegmentSize) and %s is free: %w", bytesString(need), bytesString(free), syscall.ENOSPC)}
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

// failed records an append that failed for lack of space, naming the
// failed rotation behind it when there was one.
func (c *spaceCheck) failed(err error) {
	full := c.rotateErr.Load()
	if full == nil || !errors.Is(err, types.ErrSealed) {
		free, _, _ := c.free(c.dir)
		full = &DiskFullError{Dir: c.dir, Free: free, Err: err}
	}
	c.writeErr.Store(full)
	c.publish()
}

// rotationFailed records why a new segment was not created.
func (c *spaceCheck) rotationFailed(err error) {
	var full *DiskFullError
	if !errors.As(err, &full) {
		free, _, _ := c.free(c.dir)
		full = &DiskFullError{Dir: c.dir, Free: free, Err: err}
	}
	c.rotateErr.Store(full)
}

// recovered clears a failed append once the log takes writes again.
func (c *spaceCheck) recovered() {
	c.writeErr.Store(nil)
	c.rotateErr.Store(nil)
	c.publish()
}

// DiskFull reports whether writes should be refused for lack of space:
// nil, or a *DiskFullError (errors.Is ErrDiskFull) naming the directory
// and the free space. Reads and Close are unaffected.
func (n *Node) DiskFull() error { return n.space.err() }

// LogFull returns a *DiskFullError while an append to this node's log
// has failed for lack of space and the log has not been reopened since,
// else nil. Meanwhile the node cannot lead (raft steps down when its
// log fails), so a caller that finds no leader should name the disk
// rather than tell its client to wait for an election.
func (n *Node) LogFull() error {
	if e := n.space.writeErr.Load(); e != nil {
		return e
	}
	return nil
}

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
			n.space.measure()
		case <-n.shutdownCh:
			return
		}
	}
}

// unmeasuredSpace is the space check of a node given its stores: there
// are no files of its own to measure, so it never refuses a write.
func unmeasuredSpace(m *metrics, log *slog.Logger) *spaceCheck {
	return &spaceCheck{
		free:    func(string) (uint64, bool, error) { return 0, false, nil },
		metrics: m,
		log:     log,
	}
}
