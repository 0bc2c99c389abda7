package etcdapi

import (
	"context"
	"slices"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func TestMemberListShowsEachMembersEtcdAddressAsItsClientURL(t *testing.T) {
	b := threeNodes(t)
	put(t, b.fakeBackend, "a")
	c := serve(t, b)
	resp, err := c.MemberList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h := resp.Header; h.ClusterId != 1 || h.MemberId != 2 || h.Revision != 0 {
		t.Errorf("header: got = %v, expected: cluster 1, member 2, no revision (as etcd's)", h)
	}
	if len(resp.Members) != len(b.info.Members) {
		t.Fatalf("members: got = %v, expected: %d", resp.Members, len(b.info.Members))
	}
	for i, m := range resp.Members {
		w := b.info.Members[i]
		if m.ID != w.ID || m.Name != w.Name || !slices.Equal(m.PeerURLs, w.PeerURLs) || !slices.Equal(m.ClientURLs, w.ClientURLs) || m.IsLearner != w.IsLearner {
			t.Errorf("member %d: got = %v, expected: %+v", i, m, w)
		}
	}
}

func TestMembershipChangesPointAtTenuresCommands(t *testing.T) {
	c := serve(t, threeNodes(t))
	cc := pb.NewClusterClient(c.ActiveConnection())
	checkUnimplemented(t, map[string]unimplementedCase{
		"MemberAdd": {func(ctx context.Context) error {
			_, err := cc.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"http://127.0.0.1:9"}})
			return err
		}, []string{"Cluster.MemberAdd", "tenure serve --join"}},
		"MemberRemove": {func(ctx context.Context) error {
			_, err := cc.MemberRemove(ctx, &pb.MemberRemoveRequest{ID: 3})
			return err
		}, []string{"Cluster.MemberRemove", "tenure members remove"}},
		"MemberUpdate": {func(ctx context.Context) error {
			_, err := cc.MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: 3})
			return err
		}, []string{"Cluster.MemberUpdate"}},
		"MemberPromote": {func(ctx context.Context) error {
			_, err := cc.MemberPromote(ctx, &pb.MemberPromoteRequest{ID: 4})
			return err
		}, []string{"Cluster.MemberPromote", "tenure serve --join"}},
	})
}
