package etcdapi

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/statemachine"
)

// What a Backend returns (possibly wrapped) when the leader a call ran
// on lost its leadership while the call was under way; ErrNotLeader is
// for one that never started. Each is answered as etcd answers the same
// situation: Unavailable, which clients take as "try again" (clientv3
// retries a read, and leaves a write, whose outcome is unknown, to the
// caller). A read gets etcd's "leader changed"; a write etcd waits for
// until its request timeout and answers "request timed out, possibly
// due to previous leader failure".
var (
	ErrLeaderChanged = frontend.ErrLeaderChanged
	ErrLeaderFailed  = frontend.ErrLeaderFailed
)

// statusError is an answer in etcd's code and text that still says, to
// the server that sends it, what it answers (errors.Is finds cause): a
// call answered for want of the leader wraps ErrNotLeader whichever code
// etcd gives it there, and the server forwards it to the leader. gRPC
// sends the status alone.
type statusError struct {
	st    *status.Status
	cause error
}

func (e *statusError) Error() string              { return e.st.Err().Error() }
func (e *statusError) GRPCStatus() *status.Status { return e.st }
func (e *statusError) Unwrap() error              { return e.cause }

// ToGRPC is the error etcd answers for a node's error err: for the
// server's own etcd wiring (its interceptors), which answers before a
// service runs.
func ToGRPC(err error) error { return toGRPC(err) }

// toGRPC turns an error of the state machine or the Backend into the
// error etcd would answer, with its code and text: clients match on
// both. An error that already is a gRPC status passes as it is.
func toGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, ErrNotLeader):
		return &statusError{st: status.Convert(rpctypes.ErrGRPCNoLeader), cause: err}
	case errors.Is(err, ErrLeaderFailed):
		return rpctypes.ErrGRPCTimeoutDueToLeaderFail
	case errors.Is(err, ErrLeaderChanged):
		return rpctypes.ErrGRPCLeaderChanged
	case errors.Is(err, frontend.ErrNoSpace):
		return rpctypes.ErrGRPCNoSpace
	case errors.Is(err, frontend.ErrStopped):
		return rpctypes.ErrGRPCStopped
	case errors.Is(err, statemachine.ErrCompacted):
		return rpctypes.ErrGRPCCompacted
	case errors.Is(err, statemachine.ErrFutureRevision):
		return rpctypes.ErrGRPCFutureRev
	case errors.Is(err, statemachine.ErrSessionNotFound):
		return rpctypes.ErrGRPCLeaseNotFound
	case errors.Is(err, statemachine.ErrLeaseExists):
		return rpctypes.ErrGRPCLeaseExist
	case errors.Is(err, statemachine.ErrKeyNotFound):
		return rpctypes.ErrGRPCKeyNotFound
	case errors.Is(err, statemachine.ErrNotOwner), errors.Is(err, frontend.ErrPermissionDenied):
		return rpctypes.ErrGRPCPermissionDenied
	case errors.Is(err, statemachine.ErrNoSpace):
		return rpctypes.ErrGRPCNoSpace // etcd's exact text, which clients map
	case errors.Is(err, frontend.ErrNoCredentials):
		return rpctypes.ErrGRPCUserEmpty
	case errors.Is(err, frontend.ErrInvalidToken):
		return rpctypes.ErrGRPCInvalidAuthToken
	case errors.Is(err, frontend.ErrRateLimited):
		return rpctypes.ErrGRPCRequestTooManyRequests
	case errors.Is(err, frontend.ErrLimit):
		// etcd has no such limit; its "too many requests" is what its
		// clients know to back off from, and the text names the limit.
		return status.Error(codes.ResourceExhausted, "etcdserver: too many requests: "+err.Error())
	case errors.Is(err, statemachine.ErrTooManySessions):
		return rpctypes.ErrGRPCRequestTooManyRequests
	case errors.Is(err, statemachine.ErrNotUTF8):
		// etcd never refuses bytes; say why Tenure does, for now.
		return status.Error(codes.FailedPrecondition, "etcdserver: "+err.Error())
	case errors.Is(err, statemachine.ErrNotSupported):
		return rpctypes.ErrGRPCNotCapable // etcd's exact text, which clients map
	case errors.Is(err, ErrMemberNotFound):
		return rpctypes.ErrGRPCMemberNotFound
	case errors.Is(err, ErrMemberNotLearner):
		return rpctypes.ErrGRPCMemberNotLearner
	case errors.Is(err, ErrLearnerNotReady):
		return rpctypes.ErrGRPCLearnerNotReady
	case errors.Is(err, ErrPeerURLExist):
		return rpctypes.ErrGRPCPeerURLExist
	case errors.Is(err, ErrBadMemberURLs):
		return rpctypes.ErrGRPCMemberBadURLs
	case errors.Is(err, ErrBadLeaderTransferee):
		return rpctypes.ErrGRPCBadLeaderTransferee
	case errors.Is(err, ErrLeaderTransferTimeout):
		// etcd sends its server's error as it is: codes.Unknown.
		return status.Error(codes.Unknown, "etcdserver: "+ErrLeaderTransferTimeout.Error())
	case errors.Is(err, ErrNotEnoughStarted):
		return rpctypes.ErrGRPCMemberNotEnoughStarted
	}
	if e, ok := authErrors[firstAuthError(err)]; ok {
		return e
	}
	switch {
	case errors.Is(err, context.Canceled):
		return rpctypes.ErrGRPCCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return rpctypes.ErrGRPCTimeout
	}
	return status.Error(codes.Unknown, err.Error())
}

// authErrors are the auth store's refusals as etcd answers them: its
// exact texts, which etcdctl prints and clients match.
var authErrors = map[error]error{
	statemachine.ErrAuthUserEmpty:       rpctypes.ErrGRPCUserEmpty,
	statemachine.ErrAuthUserExists:      rpctypes.ErrGRPCUserAlreadyExist,
	statemachine.ErrAuthUserNotFound:    rpctypes.ErrGRPCUserNotFound,
	statemachine.ErrAuthRoleEmpty:       rpctypes.ErrGRPCRoleEmpty,
	statemachine.ErrAuthRoleExists:      rpctypes.ErrGRPCRoleAlreadyExist,
	statemachine.ErrAuthRoleNotFound:    rpctypes.ErrGRPCRoleNotFound,
	statemachine.ErrAuthRoleNotGranted:  rpctypes.ErrGRPCRoleNotGranted,
	statemachine.ErrAuthPermNotGranted:  rpctypes.ErrGRPCPermissionNotGranted,
	statemachine.ErrAuthPermNotGiven:    rpctypes.ErrGRPCPermissionNotGiven,
	statemachine.ErrAuthInvalidMgmt:     rpctypes.ErrGRPCInvalidAuthMgmt,
	statemachine.ErrAuthRootUserMissing: rpctypes.ErrGRPCRootUserNotExist,
	statemachine.ErrAuthRootRoleMissing: rpctypes.ErrGRPCRootRoleNotExist,
	statemachine.ErrAuthNoPassword:      status.Error(codes.InvalidArgument, "etcdserver: "+statemachine.ErrAuthNoPassword.Error()),
}

// firstAuthError is the auth store's sentinel err wraps, or nil.
func firstAuthError(err error) error {
	for sentinel := range authErrors {
		if errors.Is(err, sentinel) {
			return sentinel
		}
	}
	return nil
}
