package nativeapi

import (
	"context"
	"errors"
	"strings"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// ErrWaitCancelled is returned when a parked Acquire's place in the
// queue was cancelled while the session lives on.
var ErrWaitCancelled = errors.New("wait cancelled")

// errorCodes is the one table from the node's errors to wire codes. The
// reason goes in api.ErrorHeader; clients keep the inverse table, over
// the same api.Reasons. The state machine's errors come first: one
// wrapped in a node's sentinel (statemachine.ErrNoSpace in
// frontend.ErrNoSpace) says more.
var errorCodes = []struct {
	err    error
	code   connect.Code
	reason api.Reason
}{
	{ErrInvalid, connect.CodeInvalidArgument, api.ReasonInvalidArgument},
	{statemachine.ErrSessionNotFound, connect.CodeNotFound, api.ReasonSessionNotFound},
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
	{statemachine.ErrNoSpace, connect.CodeResourceExhausted, api.ReasonNoSpace},
	{statemachine.ErrNotOwner, connect.CodePermissionDenied, api.ReasonPermissionDenied},
	{frontend.ErrNotLeader, connect.CodeUnavailable, api.ReasonNotLeader},
	// The entry may still commit: not "not-leader", which tells clients
	// a retry is safe.
	{frontend.ErrLeaderFailed, connect.CodeUnavailable, api.ReasonLeadershipLost},
	{frontend.ErrLeaderChanged, connect.CodeUnavailable, api.ReasonLeadershipLost},
	{frontend.ErrStopped, connect.CodeUnavailable, api.ReasonShuttingDown},
	// Past the quota it is statemachine.ErrNoSpace, above; this is the
	// disk.
	{frontend.ErrNoSpace, connect.CodeResourceExhausted, api.ReasonDiskFull},
	{watch.ErrLagged, connect.CodeAborted, api.ReasonWatchLagged},
	{ErrWaitCancelled, connect.CodeAborted, api.ReasonWaitCancelled},
	{watch.ErrCompacted, connect.CodeOutOfRange, api.ReasonCompacted},
	{watch.ErrClosed, connect.CodeUnavailable, api.ReasonShuttingDown},
	{frontend.ErrUnauthenticated, connect.CodeUnauthenticated, api.ReasonUnauthenticated},
	{frontend.ErrNoCredentials, connect.CodeUnauthenticated, api.ReasonUnauthenticated},
	{frontend.ErrInvalidToken, connect.CodeUnauthenticated, api.ReasonUnauthenticated},
	{frontend.ErrPermissionDenied, connect.CodePermissionDenied, api.ReasonPermissionDenied},
	{frontend.ErrRateLimited, connect.CodeResourceExhausted, api.ReasonRateLimited},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded, api.ReasonDeadlineExceeded},
	{context.Canceled, connect.CodeCanceled, api.ReasonCanceled},
}

// ToConnect turns the node's error into a Connect error whose message
// names the problem. Unknown errors become Internal.
func ToConnect(err error) error {
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

// toConnect is ToConnect, in this package's handlers.
func toConnect(err error) error { return ToConnect(err) }

// ReasonOf is the reason a Connect error carries, or "".
func ReasonOf(err error) api.Reason {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return api.Reason(ce.Meta().Get(api.ErrorHeader))
	}
	return ""
}

// prefixed are the sentinels whose words the code already says:
// "permission_denied: permission denied: ..." would say it twice, and
// "unavailable: not the leader: not leader: ..." three times.
var prefixed = []error{
	ErrInvalid, frontend.ErrUnauthenticated, frontend.ErrPermissionDenied, frontend.ErrRateLimited, frontend.ErrLimit,
	frontend.ErrNotLeader, frontend.ErrLeaderChanged, frontend.ErrLeaderFailed, frontend.ErrStopped, frontend.ErrNoSpace,
}

// errorMessage drops the sentinel's words from the front of err's
// message, where the node's wrapping put them. The error it returns
// still unwraps to err: what answers a pipelined call finds the leader
// a not-leader error names in it (pipelineError).
func errorMessage(err error) error {
	msg := err.Error()
	for _, sentinel := range prefixed {
		if p := sentinel.Error() + ": "; errors.Is(err, sentinel) && strings.HasPrefix(msg, p) && len(msg) > len(p) {
			msg = msg[len(p):]
		}
	}
	if msg == err.Error() {
		return err
	}
	return reworded{msg: msg, err: err}
}

// reworded is err with another message.
type reworded struct {
	msg string
	err error
}

func (r reworded) Error() string { return r.msg }
func (r reworded) Unwrap() error { return r.err }
