package raftnode

// Opening what a node keeps on disk under DataDir/raft: the WAL
// (raft-wal segments, or boltdb), its meta store for the hard state, and
// the snapshot files, or the ones Config.Stores gives. It is apart from
// storage.go, which reads and writes raft's records in them, because
// opening is where the full-disk and repair rules meet the files.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"go.etcd.io/raft/v3/raftpb"
)

// stores are the WAL, its meta store and the snapshot files, as the
// node uses them.
type stores struct {
	wal       raft.LogStore // wrapped to time StoreLogs
	meta      raft.StableStore
	snapshots raft.SnapshotStore
	space     *spaceCheck
	tail      *walTail     // the WAL's tail segment; nil but for raft-wal
	kind      string       // for the log: Config.LogStore, or "given"
	dir       string       // the directory they live in; empty when given
	close     func() error // closes what openStores opened, nothing when given
}

// openStores opens the stores under DataDir/raft, or takes cfg.Stores.
func openStores(cfg Config, m *metrics, log *slog.Logger) (stores, error) {
	if cfg.Stores.given() > 0 {
		return stores{
			wal:       timedWAL{LogStore: cfg.Stores.Log, hist: m.storeLogs},
			meta:      cfg.Stores.Stable,
			snapshots: cfg.Stores.Snapshots,
			space:     unmeasuredSpace(m, log), // not the node's files to watch
			kind:      "given",
			close:     func() error { return nil },
		}, nil
	}
	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return stores{}, fmt.Errorf("raftnode: %w", err)
	}
	space := newSpaceCheck(dir, cfg, m, log)
	space.measure()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, retainSnapshots, newHCLogger(log, "snapshot"))
	if err != nil {
		return stores{}, fmt.Errorf("raftnode: snapshot files: %w", err)
	}
	tail := &walTail{}
	logs, stable, closeLogs, err := openDiskWAL(dir, cfg, DiskFiles{}, snaps, space, tail, log)
	if err != nil {
		return stores{}, err
	}
	return stores{
		wal:       timedWAL{LogStore: logs, hist: m.storeLogs},
		meta:      stable,
		snapshots: snaps,
		space:     space,
		tail:      tail,
		kind:      cfg.LogStore,
		dir:       dir,
		close:     closeLogs,
	}, nil
}

// openDiskWAL opens the WAL, which is also the meta store (term,
// vote): both kinds implement the two interfaces in one durable file set.
// files puts raft-wal's segments and meta store elsewhere than under dir,
// whose path then only names them.
func openDiskWAL(dir string, cfg Config, files DiskFiles, snaps raft.SnapshotStore, space *spaceCheck, tail *walTail, log *slog.Logger) (raft.LogStore, raft.StableStore, func() error, error) {
	walDir := filepath.Join(dir, "wal")
	boltPath := filepath.Join(dir, "raft.db")
	kind := cfg.LogStore
	// Opening the other kind on an existing directory would look like an
	// empty log and, with Bootstrap, silently start a new cluster.
	switch kind {
	case "wal":
		if files.WAL == nil {
			if _, err := os.Stat(boltPath); err == nil {
				return nil, nil, nil, fmt.Errorf("raftnode: %s holds a boltdb WAL, but LogStore is %q", dir, kind)
			}
			if err := os.MkdirAll(walDir, 0o750); err != nil {
				return nil, nil, nil, fmt.Errorf("raftnode: %w", err)
			}
		}
		// The log is opened to find damage, not to refuse it at once:
		// whether damage is cut off depends on RepairLog and on whether
		// other members hold the entries (catchup.go).
		o := walOptions{segmentSize: cfg.WALSegmentSize, repair: true, logger: log, space: space, tail: tail, files: files}
		w, damage, err := openWAL(walDir, o)
		var members uint64
		if err == nil {
			members, _ = w.GetUint64(membersKey)
		}
		if err == nil && damage != nil {
			if !CutDamage(members, cfg.RepairLog) {
				w.Close()
				return nil, nil, nil, damage
			}
			if !cfg.RepairLog {
				log.Warn("raft: the log is damaged; cutting the damage off, to catch up on it from the other members", "damage", damage.Error(), "members", members)
			}
		}
		// Each repair cuts at the earliest damage; open again until the
		// log verifies, in case a cut left later damage in place.
		var owed uint64
		for tries := 0; err == nil && damage != nil; tries++ {
			var cut func() (uint64, error)
			var lostTo uint64
			if cut, lostTo, err = repairWAL(w, files.wal(), damage, snaps, log); err == nil {
				owed = max(owed, lostTo)
				if err = w.Close(); err == nil && cut != nil {
					lostTo, err = cut()
					owed = max(owed, lostTo)
				}
				if err == nil {
					w, damage, err = openWAL(walDir, o)
				}
			}
			if err == nil && damage != nil && tries == 10 {
				err = fmt.Errorf("raftnode: repair log: still damaged after %d cuts: %w", tries, damage)
			}
		}
		if err != nil {
			if w != nil {
				w.Close()
			}
			return nil, nil, nil, walOpenError(walDir, cfg, err)
		}
		// Entries lost that the other members hold: the node owes them
		// until it has them again (CatchUpAfterCut).
		if owed > 0 {
			var had CatchUp
			had.Index, _ = w.GetUint64(catchUpKey)
			had.Term, _ = w.GetUint64(catchUpTermKey)
			var hs raftpb.HardState
			if v, err := w.Get(hardStateKey); err == nil && len(v) > 0 && hs.Unmarshal(v) != nil {
				hs.Term = 0 // unreadable: refuse every vote until caught up
			}
			if point, record := CatchUpAfterCut(had, owed, members, hs.Term); record {
				if err := recordCatchUp(w, point); err != nil {
					w.Close()
					return nil, nil, nil, err
				}
			}
		}
		o.repair = false // what is left must verify
		s := &walStore{
			dir:   walDir,
			w:     w,
			open:  func() (*raftwal.WAL, error) { w, _, err := openWAL(walDir, o); return w, err },
			space: space,
			log:   log,

			segmentSize: uint64(cfg.walSegmentSize()),
		}
		return s, s, s.Close, nil
	case "boltdb":
		if files.injected() {
			return nil, nil, nil, errors.New("raftnode: LogStore \"boltdb\" keeps its own files; only raft-wal's can be given")
		}
		if _, err := os.Stat(walDir); err == nil {
			return nil, nil, nil, fmt.Errorf("raftnode: %s holds a raft-wal WAL, but LogStore is %q", dir, kind)
		}
		b, err := raftboltdb.NewBoltStore(boltPath)
		if err != nil {
			if isNoSpace(err) {
				return nil, nil, nil, &DiskFullError{Dir: dir, Err: err}
			}
			return nil, nil, nil, fmt.Errorf("raftnode: open boltdb: %w", err)
		}
		return b, b, b.Close, nil
	default:
		return nil, nil, nil, fmt.Errorf("raftnode: unknown LogStore %q (want \"wal\" or \"boltdb\")", kind)
	}
}

// walOpenError explains a failure to open the WAL: a full disk names the
// segment size, since each segment is preallocated whole.
func walOpenError(dir string, cfg Config, err error) error {
	var ce *CorruptLogError
	var full *DiskFullError
	if errors.As(err, &ce) || errors.As(err, &full) {
		return err
	}
	if isNoSpace(err) {
		free, _, _ := freeBytes(dir)
		return &DiskFullError{Dir: dir, Free: free, Err: fmt.Errorf("the log preallocates segments of %s (WALSegmentSize) and %s is free: %w", bytesString(uint64(cfg.walSegmentSize())), bytesString(free), err)}
	}
	return fmt.Errorf("raftnode: open wal: %w", err)
}
