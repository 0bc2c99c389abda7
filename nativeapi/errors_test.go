package nativeapi

import (
	"slices"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
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
