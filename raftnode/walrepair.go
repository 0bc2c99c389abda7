package raftnode

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// repairWAL cuts damage out of a WAL opened with repair. When a snapshot
// covers every damaged entry, only the log's head up to the damage goes
// and nothing is lost; otherwise the damaged entries and everything after
// them go, and the node has lost them unless another member still has
// them (a follower then gets them again from the leader).
//
// Damage past the last entry raft-wal reads (bytes after the newest
// segment's last intact batch, or that segment cut off inside a frame)
// is in no entry raft-wal holds, so deleting entries cannot remove it:
// repairWAL then returns cut, which the caller runs once w is closed, to
// cut the file back to its last intact batch.
//
// lostTo is the last index of the entries lost (0: none), which the
// node then owes its cluster (catchup.go).
func repairWAL(w *raftwal.WAL, fsys WALFS, damage *CorruptLogError, snaps raft.SnapshotStore, log *slog.Logger) (cut func() (lostTo uint64, err error), lostTo uint64, err error) {
	first, err := w.FirstIndex()
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	last, err := w.LastIndex()
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	var snapshot uint64
	metas, err := snaps.List()
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: repair log: list snapshots: %w", err)
	}
	if len(metas) > 0 {
		snapshot = metas[0].Index // newest first
	}
	if damage.cutAt >= 0 && damage.FirstIndex > last {
		return func() (uint64, error) { return cutSegment(fsys, damage, snapshot, log) }, 0, nil
	}
	end := damage.LastIndex
	if end == 0 || end > last {
		end = last // where the damage ends is unknown: assume the end
	}
	var lo, hi, lostFrom uint64
	switch {
	case end <= snapshot:
		lo, hi = first, end
	case damage.FirstIndex <= snapshot+1:
		lo, hi, lostFrom = first, last, snapshot+1
	default:
		lo, hi, lostFrom = damage.FirstIndex, last, damage.FirstIndex
	}
	if lo <= hi {
		if err := w.DeleteRange(lo, hi); err != nil {
			return nil, 0, fmt.Errorf("raftnode: repair log: delete entries %d..%d: %w", lo, hi, err)
		}
	}
	if lostFrom == 0 || lostFrom > last {
		// raft-wal's scan may have stopped at the damage with synced
		// entries after it, past what the snapshot holds: deleting its
		// entries drops those too, and they are owed (internal/sim seed
		// 950820, five voters: a copy over a segment's first batches, the
		// snapshot at 300, raft-wal's log ending at 281, and 301..334
		// gone without a debt).
		if beyond := max(damage.seen, damage.owe); beyond > max(last, snapshot) {
			from := max(last, snapshot) + 1
			log.Error("repaired the raft log: removed damaged entries a snapshot covers, and with them synced entries after the damage that it does not; they are lost on this node unless another member has them",
				"damage", damage.Error(), "removed_from", lo, "removed_to", hi, "lost_from", from, "lost_to", damage.seen, "owed_to", beyond, "snapshot_index", snapshot)
			return nil, beyond, nil
		}
		log.Warn("repaired the raft log: removed damaged entries a snapshot covers; nothing was lost",
			"damage", damage.Error(), "removed_from", lo, "removed_to", hi, "snapshot_index", snapshot)
		return nil, 0, nil
	}
	// raft-wal's scan may stop at the damage in the newest segment,
	// before synced batches that follow it: the verifying reader saw
	// them (seen), and they are lost too.
	lostTo = max(last, damage.seen, damage.owe, damage.LastIndex)
	log.Error("repaired the raft log: removed damaged entries and all after them; acknowledged writes in that range are lost on this node unless another member has them",
		"damage", damage.Error(), "lost_from", lostFrom, "lost_to", lostTo, "snapshot_index", snapshot)
	return nil, lostTo, nil
}

// cutSegment cuts the newest segment back to the end of its last intact
// batch, keeping the file's size: what follows reads as zeros, as in a
// preallocated segment never written that far. Entries whose frames
// started in the cut-off bytes are lost, unless the snapshot holds them.
// A torn batch never gets here (clearTornWrite drops it), so the cut
// batch was synced, and may have been acknowledged.
func cutSegment(fsys WALFS, damage *CorruptLogError, snapshot uint64, log *slog.Logger) (lostTo uint64, err error) {
	if err := fsys.ZeroFrom(filepath.Dir(damage.File), filepath.Base(damage.File), damage.cutAt); err != nil {
		return 0, fmt.Errorf("raftnode: repair log: %w", err)
	}
	// What is owed may reach past what was seen to be lost: bytes after
	// the damage that no longer read as frames may have been entries.
	// A member owes them (it votes again only once its log is past
	// them); the log line says what was seen, and what is owed.
	lostFrom, lostTo, owed := max(damage.FirstIndex, snapshot+1), damage.seen, max(damage.seen, damage.owe)
	if owed < lostFrom {
		owed = 0
	}
	if lostFrom > lostTo {
		log.Warn("repaired the raft log: cut the damage after the newest segment's last intact batch off; no entry was lost",
			"damage", damage.Error(), "file", damage.File, "cut_at", damage.cutAt, "last_index", damage.FirstIndex-1, "owed_to", owed, "snapshot_index", snapshot)
		return owed, nil
	}
	log.Error("repaired the raft log: cut the newest segment back to its last intact batch; the entries of the damaged batch, which were synced and may have been acknowledged, are lost on this node unless another member has them",
		"damage", damage.Error(), "file", damage.File, "cut_at", damage.cutAt, "lost_from", lostFrom, "lost_to", lostTo, "owed_to", owed, "last_index", damage.FirstIndex-1, "snapshot_index", snapshot)
	return owed, nil
}
