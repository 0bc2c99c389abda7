package raftnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/raft/v3/raftpb"
)

// Status is what a node knows about itself and its leader, for
// `tenure members` and for deciding when a joining node has caught up.
type Status struct {
	ID       string
	Addr     string // raft address
	Role     string // "leader", "follower", "candidate" or "shutdown"
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
func (n *Node) Term() uint64 {
	if n.etcd != nil {
		return n.etcd.term.Load()
	}
	return n.raft.CurrentTerm()
}

// Status reports this node's view of itself.
func (n *Node) Status() Status {
	if n.etcd != nil {
		return n.etcd.status()
	}
	addr, id := n.raft.LeaderWithID()
	st := Status{
		ID:           n.id,
		Addr:         n.Addr(),
		Role:         roleName(n.raft.State()),
		LeaderID:     string(id),
		Leader:       string(addr),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.AppliedIndex(),
		LastLogIndex: n.raft.LastIndex(),
	}
	if st.Role != "leader" {
		st.LastContact = n.raft.LastContact()
	}
	return st
}

func roleName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Follower:
		return "follower"
	default:
		return "shutdown"
	}
}

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
	if n.etcd != nil {
		return n.etcd.bootstrapCluster(voters)
	}
	conf, err := initialConfiguration(Config{NodeID: n.id, InitialVoters: voters}, n.trans.LocalAddr())
	if err != nil {
		return err
	}
	if err := n.raft.BootstrapCluster(conf).Error(); err != nil {
		if errors.Is(err, raft.ErrCantBootstrap) {
			return ErrAlreadyFormed
		}
		return fmt.Errorf("raftnode: bootstrap: %w", err)
	}
	return nil
}

// ErrAlreadyFormed is returned by BootstrapCluster on a node that already
// belongs to a cluster.
var ErrAlreadyFormed = errors.New("raftnode: this node already has cluster state")

// AddNonvoter adds a node that receives the log but does not vote, or
// updates its address. A joining node starts so, and is promoted with
// AddVoter once it has caught up, so that a slow newcomer never counts
// towards a quorum it cannot yet help make. It must be called on the
// leader.
func (n *Node) AddNonvoter(ctx context.Context, id, addr string) error {
	if n.etcd != nil {
		return n.etcdMembership(ctx, "add non-voter", raftpb.ConfChangeAddLearnerNode, id, addr)
	}
	return n.changeMembership(ctx, "add non-voter", func(timeout time.Duration) raft.Future {
		return n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout)
	})
}

// TransferLeadership hands leadership to voter id, or to the most
// up-to-date voter when id is empty, and returns once raft has done so
// or given up. It must be called on the leader. Proposals made during the
// transfer are refused with a *NotLeaderError, so they are never in doubt.
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	if n.etcd != nil {
		if err := n.enter(); err != nil {
			return err
		}
		defer n.inflight.Done()
		return n.etcd.transferLeadership(ctx, id)
	}
	if id == "" {
		return n.changeMembership(ctx, "transfer leadership", func(time.Duration) raft.Future {
			return n.raft.LeadershipTransfer()
		})
	}
	members, err := n.Members()
	if err != nil {
		return err
	}
	for _, m := range members {
		if m.ID != id {
			continue
		}
		if !m.Voter {
			return fmt.Errorf("raftnode: transfer leadership: %s does not vote, so it cannot lead", id)
		}
		return n.changeMembership(ctx, "transfer leadership", func(time.Duration) raft.Future {
			return n.raft.LeadershipTransferToServer(raft.ServerID(m.ID), raft.ServerAddress(m.Address))
		})
	}
	return fmt.Errorf("raftnode: transfer leadership: %w: %s", ErrUnknownMember, id)
}

// ErrUnknownMember is returned for a server ID the configuration does not
// list.
var ErrUnknownMember = errors.New("no such member")

// changeMembership runs one membership or leadership call on the leader.
func (n *Node) changeMembership(ctx context.Context, op string, call func(timeout time.Duration) raft.Future) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	timeout, err := enqueueTimeout(ctx)
	if err != nil {
		return fmt.Errorf("raftnode: %s: %w", op, err)
	}
	if err := n.await(ctx, call(timeout)); err != nil {
		return n.raftError(op, err)
	}
	return nil
}
