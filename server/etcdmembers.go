package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// etcd's membership and leadership calls over Tenure's. An etcd member
// is a Tenure node: its member ID is memberID of the node ID, and its
// peer URL names the node's raft address. etcd's MemberAdd comes before
// the new member starts, and names only its peer URL; Tenure's node ID
// defaults to its peer address (tenure serve: --peer-advertise, else
// --peer-listen), so the member added is the node whose ID is the URL's
// host:port, and the node started with that peer address joins as it.
// What was added as a learner stays one until MemberPromote (raftnode's
// held learner); a member added to vote votes at once, as in etcd.

// errLearnerHeld is Join's answer to a held learner that asks for its
// vote: only an operator's promotion gives it one.
var errLearnerHeld = errors.New("was added as a learner (etcdctl member add --learner): it votes once promoted (etcdctl member promote)")

// learnerReady is etcd's readiness rule for a promotion (readyPercent):
// the learner has 90% of the leader's log.
const learnerReady = 0.9

// Members is the cluster's membership as etcd's Cluster service changes
// it, on the leader; a follower answers ErrNotLeader, and its etcd API
// forwards the call.
func (b etcdBackend) Members() etcdapi.Membership { return etcdMembership{b.s} }

type etcdMembership struct{ s *Server }

// member finds the member with etcd ID id, on the leader.
func (m etcdMembership) member(id uint64) (raftnode.Member, error) {
	s := m.s
	if !s.leading.Load() {
		return raftnode.Member{}, nodeError(s.notLeader())
	}
	members, err := s.node.Members()
	if err != nil {
		return raftnode.Member{}, nodeError(err)
	}
	for _, mem := range members {
		if memberID(mem.ID) == id {
			return mem, nil
		}
	}
	return raftnode.Member{}, fmt.Errorf("%w: %x", etcdapi.ErrMemberNotFound, id)
}

// startedVoters counts the voters but except, and those of them that
// have started: registered their API address, which a node does once it
// runs (etcd counts the members that have published their name). etcd's
// strict reconfiguration check refuses a change that would leave fewer
// started voters than a quorum, and so does Tenure.
func (m etcdMembership) startedVoters(members []raftnode.Member, except string) (voters, started int) {
	_ = m.s.node.ReadLocal(func(st *statemachine.Machine) error {
		for _, mem := range members {
			if !mem.Voter || mem.ID == except {
				continue
			}
			voters++
			if _, ok := st.MemberAddress(mem.ID); ok || mem.ID == m.s.node.ID() {
				started++
			}
		}
		return nil
	})
	return voters, started
}

// quorumStarted is etcd's check: started of voters make a quorum.
func quorumStarted(voters, started int) error {
	if started < voters/2+1 {
		return fmt.Errorf("%w: %d of %d voters would have started", etcdapi.ErrNotEnoughStarted, started, voters)
	}
	return nil
}

// peerAddress is the raft address of etcd peer URLs: one http or https
// URL naming a host and a port, and nothing else.
func peerAddress(urls []string) (string, error) {
	if len(urls) != 1 {
		return "", fmt.Errorf("%w: a Tenure node listens for raft at one address, not %d", etcdapi.ErrBadMemberURLs, len(urls))
	}
	u, err := url.Parse(urls[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" && u.Path != "/" || u.Host == "" {
		return "", fmt.Errorf("%w: %q: want http://host:port", etcdapi.ErrBadMemberURLs, urls[0])
	}
	if err := checkHostPort("peer URL", u.Host); err != nil {
		return "", fmt.Errorf("%w: %v", etcdapi.ErrBadMemberURLs, err)
	}
	return u.Host, nil
}

// Add adds the node whose ID is the peer URL's host:port, before it
// starts, as etcd's MemberAdd: a held learner, or a voter, as etcd adds
// them. A voter added so counts towards the quorum at once, as in etcd:
// until it runs, the cluster needs one more of its other voters.
func (m etcdMembership) Add(ctx context.Context, peerURLs []string, learner bool) (etcdapi.Member, error) {
	s := m.s
	addr, err := peerAddress(peerURLs)
	if err != nil {
		return etcdapi.Member{}, err
	}
	if !s.leading.Load() {
		return etcdapi.Member{}, nodeError(s.notLeader())
	}
	members, err := s.node.Members()
	if err != nil {
		return etcdapi.Member{}, nodeError(err)
	}
	id := addr
	for _, mem := range members {
		if mem.Address == addr || mem.ID == id {
			return etcdapi.Member{}, fmt.Errorf("%w: member %s has %s", etcdapi.ErrPeerURLExist, mem.ID, addr)
		}
	}
	if !learner {
		// The new voter has not started. As etcd, a one-member cluster
		// may take a second voter all the same (its restore runbook).
		voters, started := m.startedVoters(members, "")
		if voters != 1 || started != 1 {
			if err := quorumStarted(voters+1, started); err != nil {
				return etcdapi.Member{}, err
			}
		}
	}
	if learner {
		err = s.node.AddLearner(ctx, id, addr, true)
	} else {
		err = s.node.AddVoter(ctx, id, addr)
	}
	if err != nil {
		return etcdapi.Member{}, nodeError(err)
	}
	s.log.Info("member added through the etcd API", "id", id, "peer", addr, "learner", learner)
	return etcdapi.Member{ID: memberID(id), PeerURLs: peerURLs, IsLearner: learner}, nil
}

// Remove removes a member, as the native RemoveMember does.
func (m etcdMembership) Remove(ctx context.Context, id uint64) error {
	s := m.s
	mem, err := m.member(id)
	if err != nil {
		return err
	}
	if mem.Voter {
		members, err := s.node.Members()
		if err != nil {
			return nodeError(err)
		}
		if err := quorumStarted(m.startedVoters(members, mem.ID)); err != nil {
			return err
		}
	}
	if err := s.node.RemoveServer(ctx, mem.ID); err != nil {
		return nodeError(err)
	}
	s.log.Info("member removed through the etcd API", "id", mem.ID)
	if _, err := s.node.Propose(ctx, statemachine.SetMember{ID: mem.ID}); err != nil {
		s.log.Warn("removed member's API address not forgotten", "id", mem.ID, "err", err)
	}
	return nil
}

// Update gives a member a new raft address, keeping its vote, or its
// learner's wait for one.
func (m etcdMembership) Update(ctx context.Context, id uint64, peerURLs []string) error {
	s := m.s
	addr, err := peerAddress(peerURLs)
	if err != nil {
		return err
	}
	mem, err := m.member(id)
	if err != nil {
		return err
	}
	if mem.Address == addr {
		return nil
	}
	members, err := s.node.Members()
	if err != nil {
		return nodeError(err)
	}
	for _, o := range members {
		if o.Address == addr {
			return fmt.Errorf("%w: member %s has %s", etcdapi.ErrPeerURLExist, o.ID, addr)
		}
	}
	if mem.Voter {
		err = s.node.AddVoter(ctx, mem.ID, addr)
	} else {
		err = s.node.AddLearner(ctx, mem.ID, addr, mem.Held)
	}
	if err != nil {
		return nodeError(err)
	}
	s.log.Info("member's peer address changed through the etcd API", "id", mem.ID, "from", mem.Address, "to", addr)
	return nil
}

// Promote gives a learner its vote once its log is in sync with the
// leader's, as etcd's MemberPromote.
func (m etcdMembership) Promote(ctx context.Context, id uint64) error {
	s := m.s
	mem, err := m.member(id)
	if err != nil {
		return err
	}
	if mem.Voter {
		return fmt.Errorf("%w: %s votes already", etcdapi.ErrMemberNotLearner, mem.ID)
	}
	match, leader, err := s.node.Progress(mem.ID)
	if err != nil {
		return nodeError(err)
	}
	if float64(match) < float64(leader)*learnerReady {
		return fmt.Errorf("%w: %s has %d of the leader's %d entries", etcdapi.ErrLearnerNotReady, mem.ID, match, leader)
	}
	members, err := s.node.Members()
	if err != nil {
		return nodeError(err)
	}
	// The learner, in sync, counts as started.
	voters, started := m.startedVoters(members, "")
	if err := quorumStarted(voters+1, started+1); err != nil {
		return err
	}
	if err := s.node.AddVoter(ctx, mem.ID, mem.Address); err != nil {
		return nodeError(err)
	}
	s.log.Info("learner promoted through the etcd API", "id", mem.ID)
	return nil
}

// MoveLeader is TransferLeadership to member target, as etcd's: refused
// for a member that does not vote, and answered once target leads.
func (b etcdBackend) MoveLeader(ctx context.Context, target uint64) error {
	s := b.s
	mem, err := etcdMembership{s}.member(target)
	switch {
	case errors.Is(err, etcdapi.ErrMemberNotFound):
		return fmt.Errorf("%w: no member %x", etcdapi.ErrBadLeaderTransferee, target)
	case err != nil:
		return err
	case !mem.Voter:
		return fmt.Errorf("%w: %s is a learner", etcdapi.ErrBadLeaderTransferee, mem.ID)
	case mem.ID == s.node.ID():
		return nil
	}
	err = s.node.TransferLeadership(ctx, mem.ID)
	switch {
	case errors.Is(err, raftnode.ErrNotLeader), errors.Is(err, raftnode.ErrLeadershipLost), errors.Is(err, raftnode.ErrClosed):
		return nodeError(err)
	case err != nil:
		// The target did not take over in time (or the call's time
		// ran out first), as etcd's ErrTimeoutLeaderTransfer.
		return fmt.Errorf("%w: %w", etcdapi.ErrLeaderTransferTimeout, err)
	}
	// The transfer is done when this node has stepped down; etcd answers
	// once the target leads.
	for {
		if _, leader := s.node.Leader(); leader == mem.ID {
			s.log.Info("leadership moved through the etcd API", "to", mem.ID)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s has not been heard from as the leader: %w", etcdapi.ErrLeaderTransferTimeout, mem.ID, ctx.Err())
		case <-s.stopC:
			return nodeError(raftnode.ErrClosed)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Arm raises member's alarm through the log, as etcd's ACTIVATE: for
// one of the cluster's members, which the log names by node ID.
func (b etcdBackend) Arm(ctx context.Context, member uint64, alarm pb.AlarmType) error {
	members, err := b.s.node.Members()
	if err != nil {
		return nodeError(err)
	}
	for _, mem := range members {
		if memberID(mem.ID) == member {
			_, err := b.Propose(ctx, statemachine.SetAlarm{Member: mem.ID, Alarm: statemachine.AlarmType(alarm), Active: true})
			if err == nil {
				b.s.log.Warn("alarm raised through the etcd API", "member", mem.ID, "alarm", alarm.String())
			}
			return err
		}
	}
	return fmt.Errorf("%w: %x", etcdapi.ErrMemberNotFound, member)
}
