package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/client"
)

// The text of an *Error is for people: the server's own message when it
// answered, and what was being done in words when no answer came. The
// Op stays a field, never part of the text.
func TestErrorTextLeavesOutTheOp(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	tests := []struct {
		name string
		err  *client.Error
		want string
	}{
		{"a server's answer is its message alone",
			&client.Error{Op: "Acquire", Kind: client.ErrInvalidArgument,
				Cause: connect.NewWireError(connect.CodeInvalidArgument, errors.New(`namespace "Bad" must be a DNS label`))},
			`namespace "Bad" must be a DNS label`},
		{"a cut connection says what was being done, in words",
			&client.Error{Op: "ListLeases", Cause: connect.NewError(connect.CodeUnknown, io.ErrUnexpectedEOF)},
			"list leases: unexpected EOF"},
		{"a refused connection says what was being done, in words",
			&client.Error{Op: "OpenSession", Kind: client.ErrUnavailable, Cause: connect.NewError(connect.CodeUnavailable, refused)},
			"open session: dial tcp: connect: connection refused"},
		{"a bare network error says what was being done",
			&client.Error{Op: "GetLease", Cause: refused},
			"get lease: dial tcp: connect: connection refused"},
		{"a context that ended says what was being done",
			&client.Error{Op: "Acquire", Cause: context.DeadlineExceeded},
			"acquire: context deadline exceeded"},
		{"a message the client made is whole already",
			&client.Error{Op: "Acquire", Kind: client.ErrLocked, Cause: fmt.Errorf("%s/%s is held by %q", "default", "x", "alice")},
			`default/x is held by "alice"`},
		{"an unknown outcome says so after the cause",
			&client.Error{Op: "Put", Kind: client.ErrUnknownOutcome, Cause: connect.NewError(connect.CodeUnavailable, io.ErrUnexpectedEOF)},
			"put: unexpected EOF (outcome unknown: the call may or may not have been applied)"},
		{"a sentinel alone is named with what was being done",
			&client.Error{Op: "Resign", Kind: client.ErrNotLeader},
			"resign: not the leader"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%s: got = %q, expected: %q", tt.name, got, tt.want)
		}
	}
}
