package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"unicode"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
)

// Errors callers branch on with errors.Is. They survive the network: the
// server names each failure in a response header and the client maps the
// name back here.
var (
	// ErrNotHolder is returned when a release or value update names a
	// token that is not a current holder's: the grant is already gone.
	ErrNotHolder = errors.New("not holder")
	// ErrLocked is returned by TryLock (and TryAcquire) when the lease is
	// held by others.
	ErrLocked = errors.New("locked")
	// ErrCompareFailed is returned by CompareAndSwap when its compare
	// does not hold; nothing was written.
	ErrCompareFailed = errors.New("compare failed")
	// ErrSessionExpired is returned when the session is gone on the
	// server or was given up as lost by this client. Everything it held
	// is released; a new session is needed.
	ErrSessionExpired = errors.New("session expired")
	// ErrNotFound is returned when a key, lease or session does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalidArgument is returned when the server rejected the request
	// as malformed or over a limit; the message names the problem.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnavailable is returned when no endpoint could serve the call:
	// all down, or no leader within the retries allowed. Calls that wait
	// (Lock, Acquire, Campaign) keep retrying until their context ends
	// instead.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnknownOutcome is returned when a call that is not safe to
	// repeat failed after it was sent: it may or may not have been
	// applied. Read the state before trying again.
	ErrUnknownOutcome = errors.New("outcome unknown")
	// ErrNoLeader is returned by Election.Leader when nobody leads.
	ErrNoLeader = errors.New("no leader")
	// ErrNotLeader is returned by Election.Proclaim and Resign when this
	// session does not lead.
	ErrNotLeader = errors.New("not the leader")
	// ErrLagged is returned by watches that fell too far behind the
	// server's history; resync by reading the state and watching anew.
	ErrLagged = errors.New("watch fell behind")
	// ErrClosed is returned by calls on a closed Client.
	ErrClosed = errors.New("client closed")
	// ErrResourceExhausted is returned when a server limit (waiters per
	// lease, sessions per identity) is reached, or when the server's disk
	// is nearly full: then writes that add state are refused, while
	// reads, releases, closes and deletes still work.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrChecksumMismatch is returned by Snapshot when the copy received
	// does not match the SHA-256 the leader sent with it.
	ErrChecksumMismatch = errors.New("checksum mismatch")
	// ErrUnauthenticated is returned when the server takes no
	// credentials from this client: none given (see WithToken and
	// WithTLS), an unknown or expired token, or a certificate from
	// another CA.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied is returned when the server's policy does not
	// allow the call to this client's principal: nothing changed.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrNotSupported is returned when the cluster does not run the call
	// yet: a member runs an older build. Nothing changed.
	ErrNotSupported = errors.New("not supported by the cluster")
	// ErrStepDown is the cause of a grant's loss when its holder was asked
	// to step down (the lease's preferred holder waits). The grant is
	// still held on the server: stop the work it guards, then release it.
	ErrStepDown = errors.New("asked to step down")
)

// errorNames maps every api.Reason the server sends to the sentinel a
// caller branches on.
var errorNames = map[api.Reason]error{
	api.ReasonInvalidArgument:  ErrInvalidArgument,
	api.ReasonSessionNotFound:  ErrSessionExpired,
	api.ReasonLeaseNotFound:    ErrNotFound,
	api.ReasonKeyNotFound:      ErrNotFound,
	api.ReasonNotHolder:        ErrNotHolder,
	api.ReasonLocked:           ErrLocked,
	api.ReasonCompareFailed:    ErrCompareFailed,
	api.ReasonCapacityMismatch: ErrInvalidArgument,
	api.ReasonNotWaiting:       ErrNotHolder,
	api.ReasonTooManyWaiters:   ErrResourceExhausted,
	api.ReasonTooManySessions:  ErrResourceExhausted,
	api.ReasonDiskFull:         ErrResourceExhausted,
	api.ReasonNoSpace:          ErrResourceExhausted,
	api.ReasonNotLeader:        ErrUnavailable,
	api.ReasonLeadershipLost:   ErrUnavailable,
	api.ReasonShuttingDown:     ErrUnavailable,
	api.ReasonWaitCancelled:    ErrUnavailable,
	api.ReasonWatchLagged:      ErrLagged,
	api.ReasonCompacted:        ErrLagged,
	api.ReasonDeadlineExceeded: context.DeadlineExceeded,
	api.ReasonCanceled:         context.Canceled,
	api.ReasonUnauthenticated:  ErrUnauthenticated,
	api.ReasonPermissionDenied: ErrPermissionDenied,
	api.ReasonRateLimited:      ErrResourceExhausted,
	api.ReasonNotSupported:     ErrNotSupported,
}

// reasonOf is the api.Reason the server named for err, or "".
func reasonOf(err error) api.Reason {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return api.Reason(ce.Meta().Get(api.ErrorHeader))
	}
	return ""
}

// Error is a failed call: the sentinel it matches, the server's message,
// and the transport error underneath.
type Error struct {
	Op    string // the method, e.g. "Acquire"
	Kind  error  // one of the sentinels above, or nil
	Cause error  // the connect or network error
}

// Error is written for the person who reads it, and keeps Op out of
// sight: when the server answered, its message alone, which already
// names the lease, key or limit; when no answer came (a refused or cut
// connection, a timeout, a closed client), what was being done, in
// words, and what went wrong: "list leases: unexpected EOF".
func (e *Error) Error() string {
	var msg string
	var ce *connect.Error
	switch {
	case errors.As(e.Cause, &ce) && connect.IsWireError(ce) && ce.Message() != "":
		msg = ce.Message()
	case errors.As(e.Cause, &ce):
		msg = ce.Message()
		if msg == "" {
			msg = ce.Code().String()
		}
		msg = doing(e.Op) + msg
	case errors.Is(e.Cause, context.Canceled), errors.Is(e.Cause, context.DeadlineExceeded),
		errors.Is(e.Cause, ErrClosed), isNetError(e.Cause):
		msg = doing(e.Op) + e.Cause.Error()
	case e.Cause != nil:
		// Made by the client, and whole: it names the lease or key.
		msg = e.Cause.Error()
	case e.Kind != nil:
		msg = doing(e.Op) + e.Kind.Error()
	default:
		msg = doing(e.Op) + "failed"
	}
	if errors.Is(e.Kind, ErrUnknownOutcome) {
		msg += " (outcome unknown: the call may or may not have been applied)"
	}
	return msg
}

// doing turns an Op into a prefix in words: "ListLeases" into "list
// leases: ".
func doing(op string) string {
	if op == "" {
		return ""
	}
	var b strings.Builder
	for i, r := range op {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte(' ')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String() + ": "
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// Is makes errors.Is(err, ErrNotHolder) and friends work.
func (e *Error) Is(target error) bool { return e.Kind != nil && target == e.Kind }

func (e *Error) Unwrap() error { return e.Cause }

// wrap turns a transport error into an *Error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var te *Error
	if errors.As(err, &te) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Op: op, Cause: err}
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if kind, ok := errorNames[reasonOf(ce)]; ok {
			return &Error{Op: op, Kind: kind, Cause: err}
		}
		switch ce.Code() {
		case connect.CodeUnavailable:
			return &Error{Op: op, Kind: ErrUnavailable, Cause: err}
		case connect.CodeInvalidArgument:
			return &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
		case connect.CodeNotFound:
			return &Error{Op: op, Kind: ErrNotFound, Cause: err}
		case connect.CodeResourceExhausted:
			return &Error{Op: op, Kind: ErrResourceExhausted, Cause: err}
		case connect.CodeUnauthenticated:
			return &Error{Op: op, Kind: ErrUnauthenticated, Cause: err}
		case connect.CodePermissionDenied:
			return &Error{Op: op, Kind: ErrPermissionDenied, Cause: err}
		}
	}
	return &Error{Op: op, Cause: err}
}

// notSent reports whether err proves the request never reached a server
// that could apply it: the connection could not be made or broke while
// the request was written, or the server refused it as not the leader
// before proposing anything.
func notSent(err error) bool {
	if reasonOf(err).NotSent() || errors.Is(err, errNotSent) {
		return true
	}
	// A request whose connection failed as it was being written never
	// reached the server whole, and a server cannot act on part of one:
	// a pooled connection to a node that just died fails so.
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "dial" || op.Op == "write")
}

// answered reports whether err is an unexpected failure the server
// itself reported (internal, unknown), as opposed to no answer at all (a
// refused or cut connection) or the server's "not now" (not leader,
// leadership lost, shutting down, a wait to retry).
func answered(err error) bool {
	if notSent(err) || !connect.IsWireError(err) {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeAborted:
		return false
	}
	return true
}

// transient reports whether a failure is worth retrying elsewhere.
func transient(err error) bool {
	if notSent(err) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeInternal, connect.CodeAborted:
		return true
	case connect.CodeCanceled:
		// connect-go (v1.21) labels a connection reset or broken pipe
		// "canceled" on the client too, as if the caller had given up;
		// callers check their own context before asking. A cancel the
		// server sent, or the context's, is not a lost connection.
		return !connect.IsWireError(err) && !errors.Is(err, context.Canceled)
	}
	return false
}
