package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// clusterServer serves Cluster: MemberList from the raft configuration
// the Backend reports. Membership changes are Tenure's own commands,
// which the others' answers name: a node joins by starting with --join
// and is made a voter once it has caught up, without a client's
// MemberAdd or MemberPromote.
type clusterServer struct {
	b Backend
}

var _ pb.ClusterServer = (*clusterServer)(nil)

func newCluster(b Backend) *clusterServer { return &clusterServer{b: b} }

// MemberList lists every member of the raft configuration, with its
// etcd API address as its client URL when it serves one (a member that
// does not has none, as an etcd member that has not started yet). Its
// header carries no revision, as etcd's does not.
func (s *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	info, err := s.b.Node(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := &pb.MemberListResponse{Header: header(s.b, 0)}
	for _, m := range info.Members {
		resp.Members = append(resp.Members, &pb.Member{
			ID:         m.ID,
			Name:       m.Name,
			PeerURLs:   m.PeerURLs,
			ClientURLs: m.ClientURLs,
			IsLearner:  m.IsLearner,
		})
	}
	return resp, nil
}

func (s *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, unimplemented("Cluster.MemberAdd", "start the new node with `tenure serve --join ADDR` naming any member: it joins as a non-voter and becomes a voter once it has caught up")
}

func (s *clusterServer) MemberRemove(context.Context, *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, unimplemented("Cluster.MemberRemove", "remove a member with `tenure members remove ID` (`tenure members` lists the IDs)")
}

func (s *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, unimplemented("Cluster.MemberUpdate", "a member's addresses are its own flags: restart it with new ones, or remove it (`tenure members remove ID`) and join it again")
}

func (s *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, unimplemented("Cluster.MemberPromote", "a node that joins with `tenure serve --join` is made a voter by the cluster itself once it has caught up")
}
