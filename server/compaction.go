package server

import (
	"context"
	"fmt"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// Compaction configures automatic compaction, as etcd's
// --auto-compaction-mode and --auto-compaction-retention do.
type Compaction struct {
	// Mode is "revision" (keep the last Revisions KV revisions),
	// "periodic" (keep the revisions of the last Period), or "" (none:
	// history grows until a client compacts).
	Mode      string
	Revisions int64
	Period    time.Duration
	// Interval is how often the leader checks (default: a minute, or a
	// tenth of Period in periodic mode).
	Interval time.Duration
}

// DefaultCompaction keeps the last 10,000 KV revisions: etcd keeps
// everything unless told otherwise, but Tenure keeps its history in
// memory, so the default bounds it.
func DefaultCompaction() Compaction { return Compaction{Mode: "revision", Revisions: 10000} }

// Validate checks a Compaction.
func (c Compaction) Validate() error {
	switch c.Mode {
	case "":
	case "revision":
		if c.Revisions <= 0 {
			return fmt.Errorf("--auto-compaction-retention %d: revision mode keeps a positive number of revisions", c.Revisions)
		}
	case "periodic":
		if c.Period <= 0 {
			return fmt.Errorf("--auto-compaction-retention %v: periodic mode keeps a positive duration", c.Period)
		}
	default:
		return fmt.Errorf(`--auto-compaction-mode %q: must be "revision" or "periodic"`, c.Mode)
	}
	return nil
}

// compactionLoop, on the leader, compacts the keys' history as the
// configured mode says, every minute.
func (s *Server) compactionLoop(c Compaction) {
	if c.Mode == "" {
		return
	}
	every := time.Minute
	if c.Mode == "periodic" {
		// etcd checks a periodic retention ten times over its length,
		// at most hourly.
		every = min(max(c.Period/10, time.Second), time.Hour)
	}
	if c.Interval > 0 {
		every = c.Interval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	type sample struct {
		at  time.Time
		rev int64
	}
	var samples []sample // periodic: the KV revision as time went by
	for {
		select {
		case <-s.stopC:
			return
		case now := <-tick.C:
			if !s.leading.Load() {
				samples = nil
				continue
			}
			var rev, compacted int64
			_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
				rev, compacted = m.KVRevision(), m.CompactRevision()
				return nil
			})
			if rev == 0 {
				continue // the cluster version has not reached 5
			}
			target := int64(0)
			switch c.Mode {
			case "revision":
				target = rev - c.Revisions
			case "periodic":
				samples = append(samples, sample{now, rev})
				i := 0
				for i < len(samples) && now.Sub(samples[i].at) >= c.Period {
					target = samples[i].rev
					i++
				}
				samples = samples[max(i-1, 0):]
			}
			if target <= compacted {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := s.node.Propose(ctx, statemachine.Compact{Revision: target})
			cancel()
			if err != nil {
				s.log.Warn("automatic compaction failed; trying again at the next tick", "revision", target, "err", err)
				continue
			}
			s.log.Info("compacted the keys' history", "revision", target, "mode", c.Mode)
		}
	}
}

// compactByBytes, on the leader, compacts the keys' history when it
// holds more than a quarter of the storage quota, oldest versions first,
// down to an eighth of it (StorageQuota.historyCompactionBytes): the compaction by revisions bounds how many versions
// are kept, and this how many bytes, so that values of 64 KiB cannot
// fill the quota with the 10,000 revisions the default keeps. It runs
// whatever the mode, as the quota does: an operator who wants more
// history raises --quota-backend-bytes.
func (s *Server) compactByBytes(q StorageQuota) {
	start, target := q.historyCompactionBytes()
	if start <= 0 {
		return
	}
	var history, rev, compacted int64
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		history, compacted = m.Usage().History, m.CompactRevision()
		if history > start {
			rev = m.CompactionTarget(target)
		}
		return nil
	})
	// rev is 0 while the history is under its share: nothing to do. (A
	// Compact at 0 on a fresh store, whose compact revision is -1, would
	// apply, and refuse a client's own Compact 0, which etcd takes.)
	if rev <= 0 || rev <= compacted {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.node.Propose(ctx, statemachine.Compact{Revision: rev}); err != nil {
		s.log.Warn("compaction by bytes failed; trying again at the next look", "revision", rev, "history_bytes", history, "err", err)
		return
	}
	s.log.Info("compacted the keys' history by bytes", "revision", rev, "history_bytes", history, "threshold", start)
}
