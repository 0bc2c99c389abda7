package client

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
)

// Every reason the server may send (the server's own test checks that it
// sends exactly api.Reasons) reaches the caller as the sentinel it
// branches on.
func TestEveryServerReasonMapsToASentinel(t *testing.T) {
	want := map[api.Reason]error{
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
	for _, r := range api.Reasons {
		t.Run(string(r), func(t *testing.T) {
			sentinel, ok := want[r]
			if !ok {
				t.Fatalf("no expectation for %q: add the sentinel a caller should see", r)
			}
			// The code does not matter: the reason alone decides.
			ce := connect.NewError(connect.CodeUnknown, errors.New("the server's message"))
			ce.Meta().Set(api.ErrorHeader, string(r))
			err := wrap("Op", ce)
			if !errors.Is(err, sentinel) {
				t.Fatalf("got = %v (kind %v), expected: errors.Is %v", err, err.(*Error).Kind, sentinel)
			}
			if got := notSent(ce); got != r.NotSent() {
				t.Fatalf("notSent: got = %v, expected: %v", got, r.NotSent())
			}
		})
	}
	if len(want) != len(api.Reasons) {
		t.Fatalf("the table names %d reasons, api.Reasons %d", len(want), len(api.Reasons))
	}
}

// TestARequestCutWhileBeingWrittenWasNotSent: only failures that prove
// the server never had the whole request let a once call be repeated.
func TestARequestCutWhileBeingWrittenWasNotSent(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused dial", connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), true},
		{"broken pipe writing the request", connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "write", Err: syscall.EPIPE}), true},
		{"reset reading the answer", connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "read", Err: syscall.ECONNRESET}), false},
		{"EOF instead of an answer", connect.NewError(connect.CodeUnavailable, io.ErrUnexpectedEOF), false},
	} {
		if got := notSent(tt.err); got != tt.want {
			t.Errorf("notSent(%s) = %v, expected: %v", tt.name, got, tt.want)
		}
	}
}
