package etcdapi

import (
	"cmp"
	"context"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// clusterServer serves Cluster: MemberList from the raft configuration
// the Backend reports, and the membership changes through
// Backend.Members, which the leader makes (a follower forwards them).
// docs/etcd.md, Membership, says how etcd's members map onto Tenure's
// nodes, and the runbook that grows a cluster with etcdctl.
type clusterServer struct {
	b Backend
}

var _ pb.ClusterServer = (*clusterServer)(nil)

func newCluster(b Backend) *clusterServer { return &clusterServer{b: b} }

// MemberList lists every member of the raft configuration, with its
// etcd API address as its client URL when it serves one (a member that
// does not has none, as an etcd member that has not started yet). Its
// header carries no revision, as etcd's does not. A linearizable list
// (clientv3's default) is of the configuration as of every change
// acknowledged before it: a follower first catches up with the leader.
func (s *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	if r.Linearizable {
		s.b.Sync(ctx)
	}
	members, err := s.members(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MemberListResponse{Header: header(s.b, 0), Members: members}, nil
}

// members is the configuration as MemberList and each change's answer
// list it: by member ID, as etcd lists them.
func (s *clusterServer) members(ctx context.Context) ([]*pb.Member, error) {
	info, err := s.b.Node(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*pb.Member, 0, len(info.Members))
	for _, m := range info.Members {
		out = append(out, protoMember(m))
	}
	slices.SortFunc(out, func(a, b *pb.Member) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

func protoMember(m Member) *pb.Member {
	return &pb.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner}
}

// MemberAdd adds a member that has not started yet, as etcd's does: the
// node that will listen at the one peer URL given, as a learner when
// IsLearner is set (it stays one until MemberPromote), and otherwise as
// a member that votes once its log has caught up with the leader's:
// Tenure never lets a member vote before it could help make a quorum,
// so MemberList shows it as a learner until then. The answer names the
// new member with its ID, and lists the members.
func (s *clusterServer) MemberAdd(ctx context.Context, r *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	m, err := s.b.Members().Add(ctx, r.PeerURLs, r.IsLearner)
	if err != nil {
		return nil, toGRPC(err)
	}
	members, err := s.members(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MemberAddResponse{Header: header(s.b, 0), Member: protoMember(m), Members: members}, nil
}

// MemberRemove removes a member, voter or learner, started or not, as
// etcd's does; etcd's "member not found" for an ID that is none.
func (s *clusterServer) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	if err := s.b.Members().Remove(ctx, r.ID); err != nil {
		return nil, toGRPC(err)
	}
	members, err := s.members(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MemberRemoveResponse{Header: header(s.b, 0), Members: members}, nil
}

// MemberUpdate changes the peer URL the cluster reaches a member at, as
// etcd's does: the member itself must then run with it (Tenure's node
// re-registers the address it runs with when it starts).
func (s *clusterServer) MemberUpdate(ctx context.Context, r *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	if err := s.b.Members().Update(ctx, r.ID, r.PeerURLs); err != nil {
		return nil, toGRPC(err)
	}
	members, err := s.members(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MemberUpdateResponse{Header: header(s.b, 0), Members: members}, nil
}

// MemberPromote makes a learner a voter, as etcd's does: only once its
// log is in sync with the leader's, with etcd's error until then and for
// a member that votes already.
func (s *clusterServer) MemberPromote(ctx context.Context, r *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	if err := s.b.Members().Promote(ctx, r.ID); err != nil {
		return nil, toGRPC(err)
	}
	members, err := s.members(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MemberPromoteResponse{Header: header(s.b, 0), Members: members}, nil
}
