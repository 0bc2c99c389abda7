package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/raftnode"
)

// TestEtcdErrorsOfTheNode: every error the node gives a proposal or a
// read, in the form raftnode and the server return it, reaches the APIs
// as the node's error for it (frontend's sentinels), which etcdapi
// answers as etcd answers the same situation. A lost leadership is a
// timeout due to the leader's failure for a write, whose outcome is
// unknown, and "leader changed" for a read; both were codes.Unknown with
// raftnode's text.
func TestEtcdErrorsOfTheNode(t *testing.T) {
	lost := fmt.Errorf("raftnode: propose: %w", raftnode.ErrLeadershipLost)
	for _, tc := range []struct {
		name          string
		err           error
		propose, read error // what errors.Is must find
	}{
		{"not the leader, leader known", &raftnode.NotLeaderError{Leader: "n2:7481", LeaderID: "n2"}, etcdapi.ErrNotLeader, etcdapi.ErrNotLeader},
		{"not the leader, none known", &raftnode.NotLeaderError{}, etcdapi.ErrNotLeader, etcdapi.ErrNotLeader},
		{"elected but not yet promoted", &notLeaderError{}, etcdapi.ErrNotLeader, etcdapi.ErrNotLeader},
		{"the lessor's leadership gone", lessor.ErrNotLeader, etcdapi.ErrNotLeader, etcdapi.ErrNotLeader},
		{"leadership lost in flight", lost, etcdapi.ErrLeaderFailed, etcdapi.ErrLeaderChanged},
		{"a read round no quorum confirmed", fmt.Errorf("raftnode: read: no quorum confirmed this leader: %w", raftnode.ErrLeadershipLost), etcdapi.ErrLeaderFailed, etcdapi.ErrLeaderChanged},
		{"the node closed", raftnode.ErrClosed, frontend.ErrStopped, frontend.ErrStopped},
		{"the disk full", &raftnode.DiskFullError{Dir: "/data", Free: 1, Reserve: 2}, frontend.ErrNoSpace, frontend.ErrNoSpace},
		{"the caller gone", fmt.Errorf("raftnode: propose: %w", context.Canceled), context.Canceled, context.Canceled},
		{"the deadline passed", fmt.Errorf("raftnode: wait for index 9: %w", context.DeadlineExceeded), context.DeadlineExceeded, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := proposeError(tc.err); !errors.Is(got, tc.propose) {
				t.Errorf("proposal: got = %v, expected: %v", got, tc.propose)
			}
			if got := nodeError(tc.err); !errors.Is(got, tc.read) {
				t.Errorf("read: got = %v, expected: %v", got, tc.read)
			}
		})
	}
}
