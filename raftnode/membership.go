package raftnode

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/raft/v3/raftpb"
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
func (n *Node) Term() uint64 { return n.etcd.term.Load() }

// Status reports this node's view of itself.
func (n *Node) Status() Status { return n.etcd.status() }

// Formed reports whether this node belongs to a cluster yet: a node
// started without Bootstrap has no configuration until a leader adds it
// or BootstrapCluster forms one.
func (n *Node) Formed() bool {
	members, err := n.Members()
	return err == nil && len(members) > 0
}

// BootstrapCluster forms a cluster of the given voters on a node that has
// no state yet, as Config.InitialVoters does at Open, for nodes that
// learn their peers only after they start (--bootstrap-expect). Every
// voter must bootstrap with the same list; a node that already has state,
// its own or a leader's, returns ErrAlreadyFormed.
func (n *Node) BootstrapCluster(voters []Peer) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.etcd.bootstrapCluster(voters)
}

// ErrAlreadyFormed is returned by BootstrapCluster on a node that already
// belongs to a cluster.
var ErrAlreadyFormed = errors.New("raftnode: this node already has cluster state")

// AddNonvoter adds a node that receives the log but does not vote (a
// raft learner), or updates its address. A joining node starts so, and
// is promoted with AddVoter once it has caught up, so that a slow
// newcomer never counts towards a quorum it cannot yet help make. It must
// be called on the leader.
func (n *Node) AddNonvoter(ctx context.Context, id, addr string) error {
	return n.changeMembership(ctx, "add non-voter", raftpb.ConfChangeAddLearnerNode, id, addr)
}

// TransferLeadership hands leadership to voter id, or to the most
// up-to-date voter when id is empty, and returns once another node leads
// or an election's time has passed. It must be called on the leader.
// Proposals made during the transfer are refused with a *NotLeaderError,
// so they are never in doubt.
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.etcd.transferLeadership(ctx, id)
}

// ErrUnknownMember is returned for a server ID the configuration does not
// list.
var ErrUnknownMember = errors.New("no such member")
