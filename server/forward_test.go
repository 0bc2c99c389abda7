package server

import (
	"fmt"
	"testing"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// TestEveryUnaryMethodIsForwardedOrAnsweredLocally: a method added to the
// API without a forwarding entry would answer "not leader" on followers,
// which clients of any node must never see while a leader exists.
func TestEveryUnaryMethodIsForwardedOrAnsweredLocally(t *testing.T) {
	services := tenurev1.File_tenure_v1_tenure_proto.Services()
	for i := range services.Len() {
		svc := services.Get(i)
		for j := range svc.Methods().Len() {
			m := svc.Methods().Get(j)
			procedure := fmt.Sprintf("/%s/%s", svc.FullName(), m.Name())
			_, forwarded := forwards[procedure]
			streaming := m.IsStreamingClient() || m.IsStreamingServer()
			switch {
			case streaming && forwarded:
				t.Errorf("%s is a stream, expected: not in forwards (streams are redirected)", procedure)
			case !streaming && forwarded == forwardExempt[procedure]:
				t.Errorf("%s: forwarded = %v, exempt = %v, expected: exactly one of them", procedure, forwarded, forwardExempt[procedure])
			}
		}
	}
}
