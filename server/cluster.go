package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

type clusterService struct{ s *Server }

// memberStatusTimeout bounds asking one member for its status: a member
// that does not answer in time is listed as unreachable.
const memberStatusTimeout = time.Second

// Members answers from this node's view, leader or not, so an operator
// can ask any node what it believes the cluster is. Each member is asked
// for its own status, all at once.
func (h *clusterService) Members(ctx context.Context, req *connect.Request[tenurev1.MembersRequest]) (*connect.Response[tenurev1.MembersResponse], error) {
	out, err := h.s.members(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

func (s *Server) members(ctx context.Context) (*tenurev1.MembersResponse, error) {
	members, err := s.node.Members()
	if err != nil {
		return nil, err
	}
	var addrs map[string]string
	out := &tenurev1.MembersResponse{AppliedIndex: s.node.AppliedIndex(), Engine: s.node.Engine()}
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		out.Revision = m.Revision()
		addrs = m.Members()
		return nil
	})
	var wg sync.WaitGroup
	for _, m := range members {
		mem := &tenurev1.Member{
			Id: m.ID, PeerAddress: m.Address, Voter: m.Voter, Leader: m.Leader,
			Self: m.ID == s.node.ID(), ApiAddress: addrs[m.ID],
		}
		out.Members = append(out.Members, mem)
		switch {
		case mem.Self:
			mem.ApiAddress = s.advertise
			mem.Status = s.status()
		case mem.ApiAddress == "":
			mem.Error = "has not advertised an API address yet"
		default:
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
				defer cancel()
				res, err := s.peers.to(mem.ApiAddress).cluster.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
				if err != nil {
					mem.Error = "unreachable: " + err.Error()
					return
				}
				mem.Status = res.Msg
			})
		}
	}
	wg.Wait()
	return out, nil
}

func (h *clusterService) Status(ctx context.Context, req *connect.Request[tenurev1.StatusRequest]) (*connect.Response[tenurev1.StatusResponse], error) {
	return connect.NewResponse(h.s.status()), nil
}

func (s *Server) status() *tenurev1.StatusResponse {
	st := s.node.Status()
	out := &tenurev1.StatusResponse{
		Id:           st.ID,
		ApiAddress:   s.advertise,
		PeerAddress:  st.Addr,
		Role:         st.Role,
		LeaderId:     st.LeaderID,
		Term:         st.Term,
		CommitIndex:  st.CommitIndex,
		AppliedIndex: st.AppliedIndex,
		LastLogIndex: st.LastLogIndex,
		Ready:        s.ready.Load(),
		Version:      statemachine.Version,
		Engine:       s.node.Engine(),
	}
	if addr, ok := s.leaderAddress(); ok {
		out.LeaderApiAddress = addr
	}
	if !st.LastContact.IsZero() {
		out.LastContact = durationpb.New(time.Since(st.LastContact))
	}
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		out.Revision = m.Revision()
		out.ClusterVersion = int32(m.ClusterVersion())
		return nil
	})
	return out
}

// Join adds or updates a member on the leader (a follower forwards it).
// It never demotes: voter false keeps a voter a voter, so a restarted
// node re-registering its address cannot lose its vote.
func (h *clusterService) Join(ctx context.Context, req *connect.Request[tenurev1.JoinRequest]) (*connect.Response[tenurev1.JoinResponse], error) {
	r := req.Msg
	if r.GetId() == "" {
		return nil, toConnect(invalid("id is required"))
	}
	if err := checkPeerAddress("peer_address", r.GetPeerAddress()); err != nil {
		return nil, toConnect(err)
	}
	if err := checkHostPort("api_address", r.GetApiAddress()); err != nil {
		return nil, toConnect(err)
	}
	if !h.s.leading.Load() {
		return nil, toConnect(h.s.notLeader())
	}
	if err := h.s.checkJoinVersion(r); err != nil {
		return nil, toConnect(err)
	}
	if err := h.s.join(ctx, r); err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.JoinResponse{CommitIndex: h.s.node.Status().CommitIndex}
	members, err := h.s.node.Members()
	if err != nil {
		return nil, toConnect(err)
	}
	for _, m := range members {
		out.Members = append(out.Members, &tenurev1.Member{Id: m.ID, PeerAddress: m.Address, Voter: m.Voter, Leader: m.Leader})
	}
	return connect.NewResponse(out), nil
}

// checkJoinVersion refuses a node whose build runs an older cluster
// version than the cluster's: it could not apply what the log now holds.
// (Builds before versions send none, which is version 1.)
func (s *Server) checkJoinVersion(r *tenurev1.JoinRequest) error {
	var cluster int
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		cluster = m.ClusterVersion()
		return nil
	})
	if v := max(int(r.GetVersion()), 1); v < cluster {
		return fmt.Errorf("%w: node %s runs a build of cluster version %d and the cluster runs %d: run a build at least as new as the cluster's on it", statemachine.ErrNotSupported, r.GetId(), v, cluster)
	}
	return nil
}

func (s *Server) join(ctx context.Context, r *tenurev1.JoinRequest) error {
	// Before anything else: a member of the other engine could neither
	// send nor take raft traffic, and as a voter it would count towards
	// every quorum it can never help make.
	if e := engineOf(r.GetEngine()); e != s.node.Engine() {
		return connect.NewError(connect.CodeFailedPrecondition, otherEngine(r.GetId(), e, "this cluster", s.node.Engine()))
	}
	members, err := s.node.Members()
	if err != nil {
		return err
	}
	var self *raftnode.Member
	for i, m := range members {
		switch {
		case m.ID == r.GetId():
			self = &members[i]
		case m.Address == r.GetPeerAddress():
			return invalid("peer address %s is already member %s's: remove %s first (tenure members remove %s)", m.Address, m.ID, m.ID, m.ID)
		}
	}
	if self == nil || self.Address != r.GetPeerAddress() {
		if err := s.node.CheckPeer(ctx, r.GetPeerAddress()); err != nil {
			return connect.NewError(connect.CodePermissionDenied, err)
		}
	}
	switch {
	case self == nil:
		// New nodes start without a vote: one that has not caught up
		// could not help make a quorum, and would count towards one.
		if err := s.node.AddNonvoter(ctx, r.GetId(), r.GetPeerAddress()); err != nil {
			return err
		}
		s.log.Info("member added as a non-voter", "id", r.GetId(), "peer", r.GetPeerAddress(), "api", r.GetApiAddress())
	case r.GetVoter() && !self.Voter && self.Held:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("member %s %w", self.ID, errLearnerHeld))
	case r.GetVoter() && !self.Voter, self.Voter && self.Address != r.GetPeerAddress():
		if err := s.node.AddVoter(ctx, r.GetId(), r.GetPeerAddress()); err != nil {
			return err
		}
		s.log.Info("member is a voter", "id", r.GetId(), "peer", r.GetPeerAddress())
	case self.Address != r.GetPeerAddress():
		if err := s.node.AddLearner(ctx, r.GetId(), r.GetPeerAddress(), self.Held); err != nil {
			return err
		}
	}
	return s.register(ctx, r.GetId(), r.GetApiAddress(), r.GetEtcdAddress(), int(r.GetVersion()))
}

// exitOnFailedLog ends serving, with the way out, once raft has stopped
// the node for its log. Either the cluster counts this node as a member
// with a log it no longer has (raftnode.ErrLogLost: a voter started again
// on an empty data dir under its old ID, say), and nothing it could do
// would make it that member again, and as a new one it must first be
// removed; or the log was found damaged while the node ran
// (raftnode.ErrLogDamaged), which a start repairs. It returns when the
// server stops or after it has reported the failure (Server.Err).
func (s *Server) exitOnFailedLog() {
	select {
	case <-s.stopC:
		return
	case <-s.node.Failed():
	}
	err := s.node.Err()
	switch id := s.node.ID(); {
	case errors.Is(err, raftnode.ErrLogLost):
		err = fmt.Errorf("node %s cannot take part in the cluster: %w; the cluster still counts it as a member with the log it had: remove it (tenure members remove %s), then start it again on an empty data dir to join as a new member", id, err, id)
	case errors.Is(err, raftnode.ErrLogDamaged):
		err = fmt.Errorf("node %s stopped: %w; start it again: a member of a cluster cuts the damage off as it starts and catches up from the other members; a node alone refuses to start until --repair-log accepts the loss", id, err)
	}
	select {
	case s.serveErr <- err:
	default:
	}
}

// register records a member's API address and the cluster version its
// build runs in the log, unless they are already there.
func (s *Server) register(ctx context.Context, id, api, etcdAPI string, version int) error {
	var known, knownEtcd string
	var knownVersion int
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		known, _ = m.MemberAddress(id)
		knownEtcd, _ = m.MemberEtcdAddress(id)
		knownVersion = m.MemberVersion(id)
		return nil
	})
	if known == api && knownEtcd == etcdAPI && knownVersion == max(version, 1) {
		return nil
	}
	_, err := s.node.Propose(ctx, statemachine.SetMember{ID: id, APIAddress: api, Version: version, EtcdAddress: etcdAPI})
	return err
}

// raiseClusterVersion, on the leader, raises the cluster version to this
// build's once every member of the raft configuration has registered a
// build that runs it. Until then, commands an older replica would apply
// differently are refused or postponed: a rolling upgrade runs the old
// behaviour until its last node is done.
func (s *Server) raiseClusterVersion(ctx context.Context) error {
	members, err := s.node.Members()
	if err != nil {
		return err
	}
	var current int
	lowest := statemachine.Version
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		current = m.ClusterVersion()
		for _, mem := range members {
			lowest = min(lowest, m.MemberVersion(mem.ID))
		}
		return nil
	})
	if lowest <= current {
		return nil
	}
	if _, err := s.node.Propose(ctx, statemachine.SetVersion{Version: lowest}); err != nil {
		return err
	}
	s.log.Info("cluster version raised", "from", current, "to", lowest)
	return nil
}

func (h *clusterService) RemoveMember(ctx context.Context, req *connect.Request[tenurev1.RemoveMemberRequest]) (*connect.Response[tenurev1.RemoveMemberResponse], error) {
	id := req.Msg.GetId()
	if id == "" {
		return nil, toConnect(invalid("id is required"))
	}
	if !h.s.leading.Load() {
		return nil, toConnect(h.s.notLeader())
	}
	members, err := h.s.node.Members()
	if err != nil {
		return nil, toConnect(err)
	}
	found := false
	for _, m := range members {
		found = found || m.ID == id
	}
	if !found {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no member %s: tenure members lists them", id))
	}
	if err := h.s.node.RemoveServer(ctx, id); err != nil {
		return nil, toConnect(err)
	}
	h.s.log.Info("member removed", "id", id)
	// Forgetting the address is tidiness: an address left behind names
	// a node nobody forwards to, since it can never lead.
	if _, err := h.s.node.Propose(ctx, statemachine.SetMember{ID: id}); err != nil {
		h.s.log.Warn("removed member's API address not forgotten", "id", id, "err", err)
	}
	return connect.NewResponse(&tenurev1.RemoveMemberResponse{}), nil
}

func (h *clusterService) TransferLeadership(ctx context.Context, req *connect.Request[tenurev1.TransferLeadershipRequest]) (*connect.Response[tenurev1.TransferLeadershipResponse], error) {
	if !h.s.leading.Load() {
		return nil, toConnect(h.s.notLeader())
	}
	id := req.Msg.GetId()
	if id == h.s.node.ID() {
		return connect.NewResponse(&tenurev1.TransferLeadershipResponse{LeaderId: id}), nil
	}
	if err := h.s.node.TransferLeadership(ctx, id); err != nil {
		if errors.Is(err, raftnode.ErrUnknownMember) {
			return nil, connect.NewError(connect.CodeNotFound, err)
		}
		if errors.Is(err, raftnode.ErrNotLeader) || errors.Is(err, raftnode.ErrLeadershipLost) || errors.Is(err, raftnode.ErrClosed) {
			return nil, toConnect(err)
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	// The transfer is done when this node has stepped down, which can be
	// before the new leader's first heartbeat has named it here: wait for
	// that, so the answer names the new leader, never "".
	for {
		if _, leader := h.s.node.Leader(); leader != "" && leader != h.s.node.ID() {
			return connect.NewResponse(&tenurev1.TransferLeadershipResponse{LeaderId: leader}), nil
		}
		select {
		case <-ctx.Done():
			return nil, toConnect(fmt.Errorf("leadership was handed over, but the new leader is not known yet: %w", ctx.Err()))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// snapshotChunk is the size of the pieces a snapshot is streamed in.
const snapshotChunk = 256 << 10

// Snapshot streams the state as of a linearizable read on the leader. A
// follower refuses it with "not leader", naming the leader: a stream is
// redirected, not forwarded.
func (h *clusterService) Snapshot(ctx context.Context, req *connect.Request[tenurev1.SnapshotRequest], stream *connect.ServerStream[tenurev1.SnapshotChunk]) error {
	var buf bytes.Buffer
	var revision int64
	err := h.s.read(ctx, false, func(m *statemachine.Machine) error {
		revision = m.Revision()
		return m.Snapshot(&buf)
	})
	if err != nil {
		return toConnect(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	data := buf.Bytes()
	for {
		n := min(len(data), snapshotChunk)
		chunk := &tenurev1.SnapshotChunk{Data: data[:n], Revision: revision}
		data = data[n:]
		if len(data) == 0 {
			chunk.Sha256 = hex.EncodeToString(sum[:])
		}
		if err := stream.Send(chunk); err != nil {
			return err
		}
		if len(data) == 0 {
			return nil
		}
	}
}

// checkHostPort checks a "host:port" address given for a node.
func checkHostPort(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return invalid("%s %q: want host:port: %v", field, addr, err)
	}
	if host == "" {
		return invalid("%s %q: the host is missing", field, addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return invalid("%s %q: the port must be a number from 1 to 65535", field, addr)
	}
	return nil
}

// checkPeerAddress checks a raft address: host:port for raft's TCP
// transport, but any name for a transport given in raftnode.Config (the
// in-process test cluster's are "n0", "n1", ...), so only its presence.
func checkPeerAddress(field, addr string) error {
	if addr == "" {
		return invalid("%s is required", field)
	}
	return nil
}

// checkAdvertise refuses an API address other nodes could not dial.
func checkAdvertise(addr string) error {
	if err := checkHostPort("advertise address", addr); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("server: advertise address %s is not one other nodes can dial: give the address they reach this node at (--advertise)", addr)
	}
	return nil
}
