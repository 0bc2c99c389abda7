package etcdapi

import (
	"context"
	"errors"
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

func TestMembershipChangesAnswerEtcdsErrors(t *testing.T) {
	c := serve(t, threeNodes(t))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"MemberAdd with bad URLs", func() error { _, err := c.MemberAdd(ctx, []string{"http://h:1", "http://h:2"}); return err }, rpctypes.ErrMemberBadURLs},
		{"MemberRemove of no member", func() error { _, err := c.MemberRemove(ctx, 9); return err }, rpctypes.ErrMemberNotFound},
		{"MemberUpdate of no member", func() error { _, err := c.MemberUpdate(ctx, 9, []string{"http://h:1"}); return err }, rpctypes.ErrMemberNotFound},
		{"MemberPromote of no member", func() error { _, err := c.MemberPromote(ctx, 9); return err }, rpctypes.ErrMemberNotFound},
	} {
		if err := tc.call(); !errors.Is(rpctypes.Error(err), tc.want) {
			t.Errorf("%s: got = %v, expected: %v", tc.name, err, tc.want)
		}
	}
}
