package nativeapi

import (
	"fmt"
	"slices"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/frontend"
)

// The server's table and api.Reasons must name the same reasons: the
// client's test maps every api.Reason, so together they tie every
// domain error the server sends to a client sentinel.
func TestEveryErrorReasonIsDeclaredInTheAPIAndSent(t *testing.T) {
	sent := map[api.Reason]bool{}
	for _, e := range errorCodes {
		if !slices.Contains(api.Reasons, e.reason) {
			t.Errorf("server sends %q for %v, which api.Reasons does not declare", e.reason, e.err)
		}
		sent[e.reason] = true
		ce := toConnect(e.err).(*connect.Error)
		if got := api.Reason(ce.Meta().Get(api.ErrorHeader)); got != e.reason || ce.Code() != e.code {
			t.Errorf("toConnect(%v): got = %s %q, expected: %s %q", e.err, ce.Code(), got, e.code, e.reason)
		}
	}
	for _, r := range api.Reasons {
		if !sent[r] {
			t.Errorf("api.Reasons declares %q, which the server never sends", r)
		}
	}
}

// notLeaderAt is a server's not-leader error naming the leader's address.
type notLeaderAt struct{ addr string }

func (e notLeaderAt) Error() string {
	return "not leader: the leader is n2, serving clients at " + e.addr
}
func (e notLeaderAt) LeaderAddress() string { return e.addr }

// A pipelined call refused for want of the leader is answered as a unary
// one would be, and names the leader, whom the Go client then follows:
// the table rewords the message, and must keep the error underneath.
func TestAPipelinedNotLeaderNamesTheLeader(t *testing.T) {
	err := fmt.Errorf("%w: %w", frontend.ErrNotLeader, notLeaderAt{"10.0.0.2:7480"})
	e := pipelineError(7, err).GetError()
	if e.GetLeader() != "10.0.0.2:7480" || e.GetReason() != string(api.ReasonNotLeader) || e.GetMessage() != "not leader: the leader is n2, serving clients at 10.0.0.2:7480" {
		t.Errorf("got = leader %q, reason %q, message %q, expected: the leader's address, %s, the server's words", e.GetLeader(), e.GetReason(), e.GetMessage(), api.ReasonNotLeader)
	}
}
