package server

import (
	"context"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/statemachine"
)

type clusterService struct{ s *Server }

// Members answers from this node's view, leader or not, so an operator
// can ask any node what it believes the cluster is.
func (h *clusterService) Members(ctx context.Context, req *connect.Request[tenurev1.MembersRequest]) (*connect.Response[tenurev1.MembersResponse], error) {
	members, err := h.s.node.Members()
	if err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.MembersResponse{AppliedIndex: h.s.node.AppliedIndex()}
	for _, m := range members {
		out.Members = append(out.Members, &tenurev1.Member{
			Id: m.ID, PeerAddress: m.Address, Voter: m.Voter, Leader: m.Leader, Self: m.ID == h.s.node.ID(),
		})
	}
	_ = h.s.node.ReadLocal(func(m *statemachine.Machine) error {
		out.Revision = m.Revision()
		return nil
	})
	return connect.NewResponse(out), nil
}
