package raftnode

import "errors"

var (
	// ErrNotLeader is returned by Propose, Read, Barrier and membership
	// changes when this node is not the leader. The error is a
	// *NotLeaderError naming the leader when one is known; the command was
	// not applied, so the caller may forward it to the leader.
	ErrNotLeader = errors.New("not leader")

	// ErrLeadershipLost is returned by Propose and Barrier when this node
	// stopped being leader while the entry was in flight. Unlike
	// ErrNotLeader the outcome is unknown: the next leader may still commit
	// the entry, so a caller must not blindly resend a non-idempotent
	// command.
	ErrLeadershipLost = errors.New("leadership lost while the entry was in flight")

	// ErrClosed is returned by every method that needs the log once Close
	// has been called.
	ErrClosed = errors.New("node closed")

	// ErrCorruptLog is returned by Open when a log segment fails its
	// checksums. The error is a *CorruptLogError naming the file and the
	// entries; nothing was applied from the log. Config.RepairLog cuts the
	// damaged entries off instead.
	ErrCorruptLog = errors.New("raft log is corrupt")

	// ErrDiskFull is returned by Propose while the data directory's file
	// system has less free space than Config.MinFreeBytes (or a write
	// failed for lack of space). Nothing was appended; writes resume by
	// themselves once space is freed. The error is a *DiskFullError.
	ErrDiskFull = errors.New("disk full")

	// ErrLogLost is what Node.Err returns once the leader has shown that
	// this node is a member whose log it no longer has: the leader knows
	// the node held entries up to an index past the end of its log, as
	// when its data dir was emptied or replaced while it stayed in the
	// configuration. Raft cannot go on with such a node (etcd's raft
	// panics: "tocommit(…) is out of range"); it takes no more raft
	// traffic, and Node.Failed is closed. The error is a *LogLostError.
	ErrLogLost = errors.New("raft log lost")

	// ErrLogDamaged is what Node.Err returns once the log, opened again
	// in place after a failed write, was found damaged on disk (a write
	// the disk acknowledged and then lost, or put somewhere else). The
	// node writes nothing more and Node.Failed is closed. Started again,
	// a member of a cluster cuts the damage off and catches up from the
	// others before it votes (catchup.go); a node alone needs
	// Config.RepairLog, as any start that finds damage does.
	ErrLogDamaged = errors.New("raft log damaged")
)

// NotLeaderError is returned when a call needs the leader and this node is
// not it. Leader and LeaderID are empty while no leader is known (during an
// election, or on a node that has not joined a cluster).
type NotLeaderError struct {
	// Leader is the leader's raft transport address (Config.Advertise),
	// not its API address; LeaderID names the node so that the caller can
	// look up the address it serves clients on.
	Leader   string
	LeaderID string
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "not leader (no leader known)"
	}
	return "not leader (leader is " + e.LeaderID + " at " + e.Leader + ")"
}

// Unwrap makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }
