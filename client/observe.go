package client

import (
	"context"

	"github.com/tenurehq/tenure/api"
)

// ElectionLeader returns the leader of the election name in namespace
// ("" for DefaultNamespace), or ErrNoLeader, without joining it.
func (c *Client) ElectionLeader(ctx context.Context, namespace, name string) (Leader, error) {
	return leaderOf(ctx, c, api.NewLeaseName(namespace, name))
}

// ObserveElection follows an election without joining it; see
// Election.Observe.
func (c *Client) ObserveElection(ctx context.Context, namespace, name string) <-chan Leader {
	return observe(ctx, c, api.NewLeaseName(namespace, name))
}
