package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// errWaitCancelled is returned when a parked Acquire's place in the queue
// was cancelled while the session lives on.
var errWaitCancelled = errors.New("wait cancelled")

// waitCancelledReason is the state machine's reason on a cancelled wait.
const waitCancelledReason = "wait cancelled"

// errorCodes is the one table from domain errors to wire codes. The
// reason goes in api.ErrorHeader; clients keep the inverse table, over
// the same api.Reasons.
var errorCodes = []struct {
	err    error
	code   connect.Code
	reason api.Reason
}{
	{errInvalid, connect.CodeInvalidArgument, api.ReasonInvalidArgument},
	{statemachine.ErrSessionNotFound, connect.CodeNotFound, api.ReasonSessionNotFound},
	{lessor.ErrSessionExpired, connect.CodeNotFound, api.ReasonSessionNotFound},
	{statemachine.ErrLeaseNotFound, connect.CodeNotFound, api.ReasonLeaseNotFound},
	{statemachine.ErrKeyNotFound, connect.CodeNotFound, api.ReasonKeyNotFound},
	{statemachine.ErrNotHolder, connect.CodeFailedPrecondition, api.ReasonNotHolder},
	{statemachine.ErrLocked, connect.CodeFailedPrecondition, api.ReasonLocked},
	{statemachine.ErrCompareFailed, connect.CodeFailedPrecondition, api.ReasonCompareFailed},
	{statemachine.ErrCapacityMismatch, connect.CodeFailedPrecondition, api.ReasonCapacityMismatch},
	{statemachine.ErrNotWaiting, connect.CodeFailedPrecondition, api.ReasonNotWaiting},
	{statemachine.ErrTooManyWaiters, connect.CodeResourceExhausted, api.ReasonTooManyWaiters},
	{statemachine.ErrTooManySessions, connect.CodeResourceExhausted, api.ReasonTooManySessions},
	{statemachine.ErrNotSupported, connect.CodeFailedPrecondition, api.ReasonNotSupported},
	{raftnode.ErrNotLeader, connect.CodeUnavailable, api.ReasonNotLeader},
	// The entry may still commit: not "not-leader", which tells clients
	// a retry is safe.
	{raftnode.ErrLeadershipLost, connect.CodeUnavailable, api.ReasonLeadershipLost},
	{lessor.ErrNotLeader, connect.CodeUnavailable, api.ReasonNotLeader},
	{raftnode.ErrClosed, connect.CodeUnavailable, api.ReasonShuttingDown},
	{raftnode.ErrDiskFull, connect.CodeResourceExhausted, api.ReasonDiskFull},
	{statemachine.ErrNoSpace, connect.CodeResourceExhausted, api.ReasonNoSpace},
	{watch.ErrLagged, connect.CodeAborted, api.ReasonWatchLagged},
	{errWaitCancelled, connect.CodeAborted, api.ReasonWaitCancelled},
	{watch.ErrCompacted, connect.CodeOutOfRange, api.ReasonCompacted},
	{watch.ErrClosed, connect.CodeUnavailable, api.ReasonShuttingDown},
	{errUnauthenticated, connect.CodeUnauthenticated, api.ReasonUnauthenticated},
	{errPermissionDenied, connect.CodePermissionDenied, api.ReasonPermissionDenied},
	{statemachine.ErrNotOwner, connect.CodePermissionDenied, api.ReasonPermissionDenied},
	{errRateLimited, connect.CodeResourceExhausted, api.ReasonRateLimited},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded, api.ReasonDeadlineExceeded},
	{context.Canceled, connect.CodeCanceled, api.ReasonCanceled},
}

// toConnect turns an error from below into a connect error whose message
// names the problem. Unknown errors become Internal.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, frontend.ErrLimit) {
		// A wait or watch slot: no reason of its own, which clients
		// would map to nothing more than the code; the message names
		// the limit.
		return connect.NewError(connect.CodeResourceExhausted, errorMessage(err))
	}
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			out := connect.NewError(e.code, errorMessage(err))
			out.Meta().Set(api.ErrorHeader, string(e.reason))
			return out
		}
	}
	return connect.NewError(connect.CodeInternal, err)
}

// errorMessage drops the redundant "invalid argument: " prefix and adds
// the leader hint to not-leader errors.
func errorMessage(err error) error {
	var full *raftnode.DiskFullError
	if errors.As(err, &full) {
		return full
	}
	var snl *notLeaderError
	if errors.As(err, &snl) {
		return snl
	}
	var nl *raftnode.NotLeaderError
	if errors.As(err, &nl) {
		if nl.Leader == "" {
			return errors.New("not leader: no leader is known yet; retry shortly")
		}
		return fmt.Errorf("not leader: the leader's peer address is %s", nl.Leader)
	}
	// The code says it already: "permission_denied: permission
	// denied: ..." would say it twice.
	for _, sentinel := range []error{errInvalid, errUnauthenticated, errPermissionDenied, errRateLimited, frontend.ErrLimit} {
		if errors.Is(err, sentinel) {
			msg := err.Error()
			if p := sentinel.Error() + ": "; len(msg) > len(p) && msg[:len(p)] == p {
				return errors.New(msg[len(p):])
			}
		}
	}
	return err
}
