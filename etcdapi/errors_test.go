package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// TestErrorsAreEtcds: what a Backend returns for the node's conditions,
// wrapped as it arrives, is answered with etcd's code and text for the
// same situation; a status passes as it is; anything else is Unknown.
func TestErrorsAreEtcds(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"a call that needs the leader on a node that is not it", fmt.Errorf("%w: no leader known", ErrNotLeader), rpctypes.ErrGRPCNoLeader},
		{"a write in flight when its leader stepped down", fmt.Errorf("%w: raftnode: propose: leadership lost", ErrLeaderFailed), rpctypes.ErrGRPCTimeoutDueToLeaderFail},
		{"a read its leader could not confirm before stepping down", fmt.Errorf("%w: raftnode: read: leadership lost", ErrLeaderChanged), rpctypes.ErrGRPCLeaderChanged},
		{"a write whose caller went away", fmt.Errorf("raftnode: propose: %w", context.Canceled), rpctypes.ErrGRPCCanceled},
		{"a write whose deadline passed", fmt.Errorf("raftnode: propose: %w", context.DeadlineExceeded), rpctypes.ErrGRPCTimeout},
		{"a revision compacted", fmt.Errorf("%w: 3 (compacted at 5)", statemachine.ErrCompacted), rpctypes.ErrGRPCCompacted},
		{"the node stopping, as the Backend answers it", rpctypes.ErrGRPCStopped, rpctypes.ErrGRPCStopped},
		{"a full disk, as the Backend answers it", rpctypes.ErrGRPCNoSpace, rpctypes.ErrGRPCNoSpace},
		{"an error nobody expected", errors.New("boom"), status.Error(codes.Unknown, "boom")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := toGRPC(tc.err)
			gs, _ := status.FromError(got)
			ws, _ := status.FromError(tc.want)
			if gs.Code() != ws.Code() || gs.Message() != ws.Message() {
				t.Fatalf("got = %v %q, expected: %v %q", gs.Code(), gs.Message(), ws.Code(), ws.Message())
			}
		})
	}
}

// TestNoLeaderAnswersKeepTheirCause: an answer for want of the leader is
// etcd's in code and text for its method — Unavailable for KV, and
// codes.Unknown from the Lock and Election recipes, as etcd's are — and
// still wraps ErrNotLeader for the server that sends it, which forwards
// such a call to the leader. A recipe's own errors, "election: not
// leader" among them, do not.
func TestNoLeaderAnswersKeepTheirCause(t *testing.T) {
	r := recipes{b: newFakeBackend(t)}
	noLeader := fmt.Errorf("%w: no leader known", ErrNotLeader)
	for _, tc := range []struct {
		name     string
		err      error
		code     codes.Code
		msg      string
		noLeader bool
	}{
		{"a KV call", toGRPC(noLeader), codes.Unavailable, "etcdserver: no leader", true},
		{"a recipe", r.fail(noLeader), codes.Unknown, "etcdserver: no leader", true},
		{"a recipe's own error", r.fail(errElectionNotLeader), codes.Unknown, "election: not leader", false},
		{"a recipe's lease gone", r.fail(statemachine.ErrSessionNotFound), codes.Unknown, "etcdserver: requested lease not found", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := status.FromError(tc.err)
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("got = %v %q, expected: %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
			if got := errors.Is(tc.err, ErrNotLeader); got != tc.noLeader {
				t.Errorf("errors.Is(ErrNotLeader) got = %v, expected: %v", got, tc.noLeader)
			}
		})
	}
}
