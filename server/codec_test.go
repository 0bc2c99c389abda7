package server

import (
	"net/http"
	"strings"
	"testing"
)

// TestJSONTakesGoDurations: over HTTP, as curl sends it, every Duration
// field of a request takes a Go duration ("1h", "1m30s", "500ms") as
// well as protobuf's "3600s", by its JSON or its proto name, and answers
// still spell durations protobuf's way.
func TestJSONTakesGoDurations(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	code, out := postJSON(t, ts.URL, "tenure.v1.SessionService/Open", `{"identity":"alice","ttl":"1h"}`)
	if code != http.StatusOK {
		t.Fatalf(`open with "ttl":"1h": got = %d %v, expected: 200`, code, out)
	}
	session := out["session"].(map[string]any)
	if session["ttl"] != "3600s" {
		t.Errorf(`session ttl: got = %v, expected: "3600s" (the answer's form is unchanged)`, session["ttl"])
	}
	sid := session["id"].(string)

	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Acquire", `{"sessionId":"`+sid+`","name":"job",
		"waitTimeout": "500ms", "lock_delay":"1m30s", "gcAfter":"2h", "max_hold":"1.5h"}`)
	if code != http.StatusOK || out["acquired"] != true {
		t.Fatalf("acquire with Go durations: got = %d %v, expected: acquired", code, out)
	}
	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Get", `{"name":"job"}`)
	if code != http.StatusOK {
		t.Fatalf("get: got = %d %v, expected: 200", code, out)
	}
	lease := out["lease"].(map[string]any)
	for field, want := range map[string]string{"lockDelay": "90s", "gcAfter": "7200s", "maxHold": "5400s"} {
		if lease[field] != want {
			t.Errorf("lease %s: got = %v, expected: %q", field, lease[field], want)
		}
	}

	code, out = postJSON(t, ts.URL, "tenure.v1.KVService/Put", `{"key":"k","value":"v","ttl":"90s"}`)
	if code != http.StatusOK {
		t.Errorf(`put with "ttl":"90s": got = %d %v, expected: 200`, code, out)
	}
}

// TestJSONRefusesABadDurationNamingTheField: a Duration that is neither
// form is invalid_argument, and the message names the field and the
// forms it takes, not protobuf's internals.
func TestJSONRefusesABadDurationNamingTheField(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	for _, tc := range []struct{ method, body, field string }{
		{"tenure.v1.SessionService/Open", `{"ttl":"1x"}`, `ttl: "1x" is not a duration`},
		{"tenure.v1.SessionService/Open", `{"ttl":3600}`, `ttl: 3600 is not a string`},
		{"tenure.v1.LeaseService/Acquire", `{"sessionId":"1","name":"a","lockDelay":"soon"}`, `lockDelay: "soon" is not a duration`},
	} {
		code, out := postJSON(t, ts.URL, tc.method, tc.body)
		msg, _ := out["message"].(string)
		if code != http.StatusBadRequest || out["code"] != "invalid_argument" ||
			!strings.Contains(msg, tc.field) || !strings.Contains(msg, `"1h", "90s", "1m30s" or "500ms"`) {
			t.Errorf("%s %s: got = %d %v, expected: 400 invalid_argument naming %q and the accepted forms", tc.method, tc.body, code, out, tc.field)
		}
	}
}
