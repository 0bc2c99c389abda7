package nativeapi

import (
	"strings"
	"testing"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// TestGoDurationsInNestedMessages: a Duration inside a nested message (a
// pipelined acquire) is rewritten too, and the rest of the JSON is left
// as it came.
func TestGoDurationsInNestedMessages(t *testing.T) {
	var req tenurev1.PipelineRequest
	if err := (strictJSON{"json"}).Unmarshal([]byte(`{"id":"7", "acquire": {"name":"a","lockDelay":"250ms","waitTimeout":"-2s"}}`), &req); err != nil {
		t.Fatal(err)
	}
	a := req.GetAcquire()
	if got := a.GetLockDelay().AsDuration().String(); got != "250ms" {
		t.Errorf("nested lockDelay: got = %s, expected: 250ms", got)
	}
	if got := a.GetWaitTimeout().AsDuration().String(); got != "-2s" {
		t.Errorf("nested waitTimeout: got = %s, expected: -2s", got)
	}
	err := (strictJSON{"json"}).Unmarshal([]byte(`{"acquire":{"maxHold":"forever"}}`), &req)
	if err == nil || !strings.HasPrefix(err.Error(), `acquire.maxHold: "forever" is not a duration`) {
		t.Errorf("bad nested duration: got = %v, expected: an error naming acquire.maxHold", err)
	}
	// Unknown fields still get protojson's error, untouched.
	err = (strictJSON{"json"}).Unmarshal([]byte(`{"ttl_":"1h"}`), &tenurev1.OpenSessionRequest{})
	if err == nil || !strings.Contains(err.Error(), "ttl_") {
		t.Errorf("unknown field: got = %v, expected: protojson's error naming ttl_", err)
	}
}
