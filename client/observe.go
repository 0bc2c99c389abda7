package client

import "context"

// ElectionLeader returns the leader of the election name in namespace
// ("" for "default"), or ErrNoLeader, without joining it.
func (c *Client) ElectionLeader(ctx context.Context, namespace, name string) (Leader, error) {
	return leaderOf(ctx, c, orDefault(namespace), name)
}

// ObserveElection follows an election without joining it; see
// Election.Observe.
func (c *Client) ObserveElection(ctx context.Context, namespace, name string) <-chan Leader {
	return observe(ctx, c, orDefault(namespace), name)
}

func orDefault(namespace string) string {
	if namespace == "" {
		return "default"
	}
	return namespace
}
