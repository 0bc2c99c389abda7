package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// ErrorHeader carries the name of the domain error behind a failed call,
// so that clients can map it back to a sentinel without parsing messages.
const ErrorHeader = "Tenure-Error"

// errWaitCancelled is returned when a parked Acquire's place in the queue
// was cancelled while the session lives on.
var errWaitCancelled = errors.New("wait cancelled")

// waitCancelledReason is the state machine's reason on a cancelled wait.
const waitCancelledReason = "wait cancelled"

// errorCodes is the one table from domain errors to wire codes. The name
// goes in ErrorHeader; clients keep the inverse table.
var errorCodes = []struct {
	err  error
	code connect.Code
	name string
}{
	{errInvalid, connect.CodeInvalidArgument, "invalid-argument"},
	{statemachine.ErrSessionNotFound, connect.CodeNotFound, "session-not-found"},
	{lessor.ErrSessionExpired, connect.CodeNotFound, "session-not-found"},
	{statemachine.ErrLeaseNotFound, connect.CodeNotFound, "lease-not-found"},
	{statemachine.ErrKeyNotFound, connect.CodeNotFound, "key-not-found"},
	{statemachine.ErrNotHolder, connect.CodeFailedPrecondition, "not-holder"},
	{statemachine.ErrLocked, connect.CodeFailedPrecondition, "locked"},
	{statemachine.ErrCompareFailed, connect.CodeFailedPrecondition, "compare-failed"},
	{statemachine.ErrCapacityMismatch, connect.CodeFailedPrecondition, "capacity-mismatch"},
	{statemachine.ErrNotWaiting, connect.CodeFailedPrecondition, "not-waiting"},
	{statemachine.ErrTooManyWaiters, connect.CodeResourceExhausted, "too-many-waiters"},
	{statemachine.ErrTooManySessions, connect.CodeResourceExhausted, "too-many-sessions"},
	{raftnode.ErrNotLeader, connect.CodeUnavailable, "not-leader"},
	// The entry may still commit: not "not-leader", which tells clients
	// a retry is safe.
	{raftnode.ErrLeadershipLost, connect.CodeUnavailable, "leadership-lost"},
	{lessor.ErrNotLeader, connect.CodeUnavailable, "not-leader"},
	{raftnode.ErrClosed, connect.CodeUnavailable, "shutting-down"},
	{raftnode.ErrDiskFull, connect.CodeResourceExhausted, "disk-full"},
	{watch.ErrLagged, connect.CodeAborted, "watch-lagged"},
	{errWaitCancelled, connect.CodeAborted, "wait-cancelled"},
	{watch.ErrCompacted, connect.CodeOutOfRange, "compacted"},
	{watch.ErrClosed, connect.CodeUnavailable, "shutting-down"},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded, "deadline-exceeded"},
	{context.Canceled, connect.CodeCanceled, "canceled"},
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
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			out := connect.NewError(e.code, errorMessage(err))
			out.Meta().Set(ErrorHeader, e.name)
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
	var nl *raftnode.NotLeaderError
	if errors.As(err, &nl) {
		if nl.Leader == "" {
			return errors.New("not leader: no leader is known yet; retry shortly")
		}
		return fmt.Errorf("not leader: the leader's peer address is %s", nl.Leader)
	}
	if errors.Is(err, errInvalid) {
		msg := err.Error()
		if p := errInvalid.Error() + ": "; len(msg) > len(p) && msg[:len(p)] == p {
			return errors.New(msg[len(p):])
		}
	}
	return err
}
