package raftnode

// Status: what a node reports of itself and its leader, for `tenure
// members`, Stats and a joining node's catch-up check. It only reads:
// the atomics the Ready loop publishes, the configuration under its read
// lock, and the MemoryStorage's snapshot index, so a status call never
// waits on raft or on apply.

import (
	"strconv"
	"time"

	etcdraft "go.etcd.io/raft/v3"
)

// Status is what a node knows about itself and its leader, for
// `tenure members` and for deciding when a joining node has caught up.
type Status struct {
	ID       string
	Addr     string // raft address
	Role     string // "leader", "follower" or "candidate"
	LeaderID string // empty while no leader is known
	Leader   string // the leader's raft address
	Term     uint64
	// CommitIndex is the last entry this node knows to be committed;
	// AppliedIndex the last reflected in its state; LastLogIndex the last
	// in its log, committed or not.
	CommitIndex, AppliedIndex, LastLogIndex uint64
	// LastContact is when this follower last heard from a leader; zero on
	// the leader and on a node that never heard from one.
	LastContact time.Time
}

// Term is the raft term this node knows: cheap, without Status's other
// reads.
func (n *Node) Term() uint64 { return n.engine.term.Load() }

// Status reports this node's view of itself.
func (n *Node) Status() Status { return n.engine.status() }

func (e *engine) status() Status {
	addr, id := e.leaderInfo()
	st := Status{
		ID:           e.self.ID,
		Addr:         e.self.Addr,
		Role:         roleName(etcdraft.StateType(e.role.Load())),
		LeaderID:     id,
		Leader:       addr,
		Term:         e.term.Load(),
		CommitIndex:  e.commit.Load(),
		AppliedIndex: e.n.applier.applied.Load(),
		LastLogIndex: e.lastIndex.Load(),
	}
	if st.Role != "leader" {
		if t := e.lastContact.Load(); t != 0 {
			st.LastContact = time.Unix(0, t)
		}
	}
	return st
}

func roleName(s etcdraft.StateType) string {
	switch s {
	case etcdraft.StateLeader:
		return "leader"
	case etcdraft.StateCandidate, etcdraft.StatePreCandidate:
		return "candidate"
	default:
		return "follower"
	}
}

func (e *engine) stats() map[string]string {
	st := e.status()
	return map[string]string{
		"engine":            engineEtcdRaft,
		"state":             st.Role,
		"term":              strconv.FormatUint(st.Term, 10),
		"commit_index":      strconv.FormatUint(st.CommitIndex, 10),
		"last_log_index":    strconv.FormatUint(st.LastLogIndex, 10),
		"last_snapshot_idx": strconv.FormatUint(e.snapshotIndex(), 10),
		"leader":            st.LeaderID,
		"num_peers":         strconv.Itoa(max(len(e.membersList())-1, 0)),
	}
}
