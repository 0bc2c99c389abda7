package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// unaryMethod is one unary procedure with its message types, so that a
// test can decode a body the way the server does and check the answer.
type unaryMethod struct {
	procedure string
	req, resp func() proto.Message
}

// unaryMethods lists every unary method of the three services. The fuzz
// target picks one with the first byte of its input, so the order is part
// of the corpus: append, never reorder.
var unaryMethods = []unaryMethod{
	{tenurev1connect.SessionServiceOpenProcedure, func() proto.Message { return &tenurev1.OpenSessionRequest{} }, func() proto.Message { return &tenurev1.OpenSessionResponse{} }},
	{tenurev1connect.SessionServiceRefreshProcedure, func() proto.Message { return &tenurev1.KeepAliveRequest{} }, func() proto.Message { return &tenurev1.KeepAliveResponse{} }},
	{tenurev1connect.SessionServiceCloseProcedure, func() proto.Message { return &tenurev1.CloseSessionRequest{} }, func() proto.Message { return &tenurev1.CloseSessionResponse{} }},
	{tenurev1connect.SessionServiceGetProcedure, func() proto.Message { return &tenurev1.GetSessionRequest{} }, func() proto.Message { return &tenurev1.GetSessionResponse{} }},
	{tenurev1connect.SessionServiceListProcedure, func() proto.Message { return &tenurev1.ListSessionsRequest{} }, func() proto.Message { return &tenurev1.ListSessionsResponse{} }},
	{tenurev1connect.LeaseServiceAcquireProcedure, func() proto.Message { return &tenurev1.AcquireRequest{} }, func() proto.Message { return &tenurev1.AcquireResponse{} }},
	{tenurev1connect.LeaseServiceReleaseProcedure, func() proto.Message { return &tenurev1.ReleaseRequest{} }, func() proto.Message { return &tenurev1.ReleaseResponse{} }},
	{tenurev1connect.LeaseServiceSetValueProcedure, func() proto.Message { return &tenurev1.SetValueRequest{} }, func() proto.Message { return &tenurev1.SetValueResponse{} }},
	{tenurev1connect.LeaseServiceRevokeProcedure, func() proto.Message { return &tenurev1.RevokeRequest{} }, func() proto.Message { return &tenurev1.RevokeResponse{} }},
	{tenurev1connect.LeaseServiceGetProcedure, func() proto.Message { return &tenurev1.GetLeaseRequest{} }, func() proto.Message { return &tenurev1.GetLeaseResponse{} }},
	{tenurev1connect.LeaseServiceListProcedure, func() proto.Message { return &tenurev1.ListLeasesRequest{} }, func() proto.Message { return &tenurev1.ListLeasesResponse{} }},
	{tenurev1connect.LeaseServiceValidateProcedure, func() proto.Message { return &tenurev1.ValidateRequest{} }, func() proto.Message { return &tenurev1.ValidateResponse{} }},
	{tenurev1connect.KVServiceGetProcedure, func() proto.Message { return &tenurev1.GetRequest{} }, func() proto.Message { return &tenurev1.GetResponse{} }},
	{tenurev1connect.KVServiceRangeProcedure, func() proto.Message { return &tenurev1.RangeRequest{} }, func() proto.Message { return &tenurev1.RangeResponse{} }},
	{tenurev1connect.KVServicePutProcedure, func() proto.Message { return &tenurev1.PutRequest{} }, func() proto.Message { return &tenurev1.PutResponse{} }},
	{tenurev1connect.KVServiceDeleteProcedure, func() proto.Message { return &tenurev1.DeleteRequest{} }, func() proto.Message { return &tenurev1.DeleteResponse{} }},
	{tenurev1connect.KVServiceCompareAndSwapProcedure, func() proto.Message { return &tenurev1.CompareAndSwapRequest{} }, func() proto.Message { return &tenurev1.CompareAndSwapResponse{} }},
	{tenurev1connect.KVServiceValidateKeyProcedure, func() proto.Message { return &tenurev1.ValidateKeyRequest{} }, func() proto.Message { return &tenurev1.ValidateKeyResponse{} }},
}

// methodSeeds are valid and invalid bodies for each unary method, by
// procedure. Session IDs and tokens are small numbers that often name a
// session or grant the fuzzer made earlier.
var methodSeeds = map[string][]string{
	tenurev1connect.SessionServiceOpenProcedure: {
		`{"identity":"fuzz","ttl":"1s"}`,
		`{"ttl":"0.5s","labels":{"app":"web","example.com/tier":"db"}}`,
		`{"ttl":"-1s"}`,
		`{"ttl":"100h"}`,
		`{"ttl":"1.000000000001s"}`,
		`{"identity":"a\u0007b"}`,
		`{"labels":{"bad key":"x"}}`,
		`{"labels":{"a,b/c":"x"}}`,
		`{"ttl":1}`,
		`{"identity":`,
		`{"identty":"alice","ttl":"1s"}`,
	},
	tenurev1connect.SessionServiceRefreshProcedure: {`{"sessionId":"1"}`, `{"sessionId":0}`, `{"sessionId":-5}`, `{"sessionId":"x"}`, `{"sessionId":1e40}`},
	tenurev1connect.SessionServiceCloseProcedure:   {`{"sessionId":"2"}`, `{"session_id":"99999"}`, `{"sessionId":true}`},
	tenurev1connect.SessionServiceGetProcedure:     {`{"sessionId":"1"}`, `{"sessionId":"9223372036854775808"}`},
	tenurev1connect.SessionServiceListProcedure: {
		`{"labelSelector":"app=web,tier!=db,canary,!gone"}`,
		`{"labelSelector":"a=b=c"}`,
		`{"labelSelector":","}`,
		`{"labelSelector":["app"]}`,
	},
	tenurev1connect.LeaseServiceAcquireProcedure: {
		`{"sessionId":"1","name":"job"}`,
		`{"sessionId":"1","name":"job","wait":true,"waitTimeout":"0.1s"}`,
		`{"sessionId":"1","namespace":"team-a","name":"sem","capacity":3,"value":"v","labels":{"app":"x"},"lockDelay":"0.2s"}`,
		`{"sessionId":"1","name":""}`,
		`{"sessionId":"1","namespace":"Bad_NS","name":"x"}`,
		`{"sessionId":"0","name":"x"}`,
		`{"sessionId":"1","name":"x","capacity":-1}`,
		`{"sessionId":"1","name":"x","capacity":2147483648}`,
		`{"sessionId":"1","name":"x","lockDelay":"-1s"}`,
		`{"sessionId":"1","name":"x","waitTimeout":"-1s"}`,
		`{"sessionId":"1","name":"x","wait":"yes"}`,
	},
	tenurev1connect.LeaseServiceReleaseProcedure:  {`{"name":"job","token":"2"}`, `{"name":"job"}`, `{"namespace":"-x","name":"job","token":"1"}`},
	tenurev1connect.LeaseServiceSetValueProcedure: {`{"name":"job","token":"2","value":"addr"}`, `{"name":"job","token":"2","value":"` + strings.Repeat("x", 300) + `"}`},
	tenurev1connect.LeaseServiceRevokeProcedure:   {`{"name":"job","reason":"stuck"}`, `{"name":"job","token":"3"}`, `{"name":"\u0000"}`},
	tenurev1connect.LeaseServiceGetProcedure:      {`{"name":"job"}`, `{"namespace":"team-a","name":"sem"}`},
	tenurev1connect.LeaseServiceListProcedure:     {`{"allNamespaces":true,"labelSelector":"app"}`, `{"namespace":"UPPER"}`, `{"namespace":"team-a","labelSelector":"app=x"}`},
	tenurev1connect.LeaseServiceValidateProcedure: {`{"name":"job","token":"2"}`, `{"name":"job","token":"0"}`, `{"name":"job","token":"-1"}`},
	tenurev1connect.KVServiceGetProcedure:         {`{"key":"a"}`, `{"key":""}`, `{"key":"\ud800"}`},
	tenurev1connect.KVServiceRangeProcedure:       {`{"prefix":"a"}`, `{"prefix":"","limit":"2"}`, `{"limit":-1}`},
	tenurev1connect.KVServicePutProcedure: {
		`{"key":"a","value":"1"}`,
		`{"key":"t","value":"1","ttl":"0.5s"}`,
		`{"key":"s","value":"1","sessionId":"1"}`,
		`{"key":"a","ttl":"0s"}`,
		`{"key":"a","sessionId":"-1"}`,
		`{"kee":"a","value":"1"}`,
	},
	tenurev1connect.KVServiceDeleteProcedure: {`{"key":"a"}`, `{"key":"t","prefix":true}`, `{"key":""}`},
	tenurev1connect.KVServiceCompareAndSwapProcedure: {
		`{"key":"c","compare":{"absent":true},"value":"1"}`,
		`{"key":"c","compare":{"value":"1"},"value":"2","ttl":"1s"}`,
		`{"key":"c","compare":{"modRevision":"0"},"delete":true}`,
		`{"key":"c"}`,
		`{"key":"c","compare":{"absent":false}}`,
		`{"key":"c","compare":{"absent":true,"value":"x"}}`,
		`{"key":"c","compare":{"modRevision":"-1"}}`,
	},
	tenurev1connect.KVServiceValidateKeyProcedure: {
		`{"key":"c","revision":"2"}`,
		`{"key":"c","revision":"9223372036854775807"}`,
		`{"key":"c","revision":"0"}`,
		`{"key":"","revision":"1"}`,
		`{"key":"c","revision":-4}`,
	},
}

// malformedSeeds are bodies no request message parses from.
var malformedSeeds = []string{"", "not json", "{", `{"a":`, "[]", "null", `"str"`, `{"name":"` + "\xff" + `"}`, `{}{}`, "{\"key\":\"a\"}\x00"}

// fuzzLimits are short, so that what the fuzzer creates expires within
// seconds and limits are easy to reach.
func fuzzLimits() Limits {
	l := testLimits()
	l.MaxNameBytes = 64
	l.MaxValueBytes = 256
	l.MaxRequestBytes = 4096
	l.MaxTTL = 2 * time.Second
	l.DefaultTTL = 500 * time.Millisecond
	l.MaxSessionsPerIdentity = 8
	l.MaxWaitersPerLease = 8
	l.MaxCapacity = 8
	l.MaxLabels = 4
	l.WatchHistory = 4096
	return l
}

// legitimateCodes are the connect codes a unary call may fail with, and
// the HTTP status connect gives each. Unavailable (not leader, shutting
// down) and DeadlineExceeded (a parked Acquire or a slow write outliving
// Connect-Timeout-Ms) are the only 5xx answers allowed; Internal and
// Unknown never are.
var legitimateCodes = map[string]int{
	"invalid_argument":    http.StatusBadRequest,
	"not_found":           http.StatusNotFound,
	"failed_precondition": http.StatusBadRequest,
	"resource_exhausted":  http.StatusTooManyRequests,
	"out_of_range":        http.StatusBadRequest,
	"unavailable":         http.StatusServiceUnavailable,
	"deadline_exceeded":   http.StatusGatewayTimeout,
}

// connectError is the JSON body of a failed Connect unary call.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// fuzzCallTimeout bounds every fuzzed call on the server side, so that a
// parked Acquire ends with DeadlineExceeded instead of stalling the fuzzer.
const fuzzCallTimeout = 300 * time.Millisecond

// FuzzDecodeJSONRequests posts arbitrary bytes as a JSON body to one unary
// method, chosen by the first byte, of one server started for the whole
// run. The server must answer 200 with a response message, or a
// legitimate connect error; a body too big is ResourceExhausted, one that
// does not decode as the request message is InvalidArgument, and an
// InvalidArgument answer changes nothing.
func FuzzDecodeJSONRequests(f *testing.F) {
	for i, m := range unaryMethods {
		bodies := append(append([]string{"{}"}, methodSeeds[m.procedure]...), malformedSeeds...)
		for _, b := range bodies {
			f.Add(append([]byte{byte(i)}, b...))
		}
	}
	limits := fuzzLimits()
	ts := startServer(f, f.TempDir(), limits)
	tr := &http.Transport{}
	f.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 15 * time.Second}

	// lastUnsure is set after a call that may still apply a command once
	// its answer is sent: a write that timed out. The next call's window
	// may then hold that command's events, so it is not checked.
	lastUnsure := false
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		m := unaryMethods[int(data[0])%len(unaryMethods)]
		body := data[1:]

		before := ts.hub.Revision()
		w, err := ts.hub.Watch(before+1, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		status, respBody := postRaw(t, hc, ts.URL+m.procedure, body, fuzzCallTimeout)
		after := ts.hub.Revision()
		unsure := lastUnsure
		lastUnsure = false

		// The server takes Go durations ("1h") where protobuf's JSON
		// wants seconds ("3600s"): the oracle reads them as it does.
		decodeErr := func() error {
			req := m.req()
			b, err := nativeapi.GoDurations(body, req.ProtoReflect().Descriptor())
			if err != nil {
				return err
			}
			return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, req)
		}()
		if status == http.StatusOK {
			if len(body) > limits.MaxRequestBytes {
				t.Fatalf("%s: a %d-byte body over MaxRequestBytes %d got 200", m.procedure, len(body), limits.MaxRequestBytes)
			}
			if decodeErr != nil {
				t.Fatalf("%s: body %q does not decode (%v) but got 200: %s", m.procedure, body, decodeErr, respBody)
			}
			if err := protojson.Unmarshal(respBody, m.resp()); err != nil {
				t.Fatalf("%s: 200 response %q is not a %T: %v", m.procedure, respBody, m.resp(), err)
			}
			return
		}
		var ce connectError
		if err := json.Unmarshal(respBody, &ce); err != nil {
			t.Fatalf("%s: %d response %q is not a connect error: %v", m.procedure, status, respBody, err)
		}
		wantStatus, ok := legitimateCodes[ce.Code]
		if !ok {
			t.Fatalf("%s: body %q got = %d %s %q, expected: 200 or one of %v", m.procedure, body, status, ce.Code, ce.Message, codeNames())
		}
		if len(body) > limits.MaxRequestBytes {
			// Refused from its Content-Length before it is read.
			wantStatus = http.StatusRequestEntityTooLarge
		}
		if status != wantStatus {
			t.Fatalf("%s: code %s got = HTTP %d, expected: %d", m.procedure, ce.Code, status, wantStatus)
		}
		if ce.Message == "" {
			t.Fatalf("%s: body %q got = %s with an empty message, expected: a message naming the problem", m.procedure, body, ce.Code)
		}
		switch {
		case len(body) > limits.MaxRequestBytes:
			if ce.Code != "resource_exhausted" {
				t.Fatalf("%s: a %d-byte body got = %s %q, expected: resource_exhausted", m.procedure, len(body), ce.Code, ce.Message)
			}
		case decodeErr != nil:
			if ce.Code != "invalid_argument" {
				t.Fatalf("%s: body %q does not decode (%v) and got = %s %q, expected: invalid_argument", m.procedure, body, decodeErr, ce.Code, ce.Message)
			}
		}
		switch ce.Code {
		case "deadline_exceeded", "unavailable":
			lastUnsure = true
		case "invalid_argument":
			if !unsure {
				checkOnlyExpiries(t, w, before, after, fmt.Sprintf("%s %q", m.procedure, body))
			}
		}
	})
}

func codeNames() []string {
	var out []string
	for c := range legitimateCodes {
		out = append(out, c)
	}
	return out
}

// postRaw posts body as a Connect JSON unary call with a server-side
// timeout and returns the status and the response body.
func postRaw(t testing.TB, hc *http.Client, url string, body []byte, timeout time.Duration) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	if timeout > 0 {
		req.Header.Set("Connect-Timeout-Ms", fmt.Sprint(timeout.Milliseconds()))
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read response: %v", url, err)
	}
	return resp.StatusCode, data
}

// checkOnlyExpiries reads w's events up to revision after and fails if
// any of them is one a client's request makes. The server expires
// sessions, keys and lock-delays by itself while the fuzzer runs, so a
// rejected request's window may hold those, and the grants and session
// key deletions they cause, but nothing else.
func checkOnlyExpiries(t *testing.T, w *watch.Watcher, before, after int64, call string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var window []statemachine.Event
	for rev := before; rev < after; {
		ev, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("watch from %d to %d: %v", before, after, err)
		}
		window, rev = append(window, ev), ev.Revision
	}
	expiredSessions := map[int64]bool{}
	for _, ev := range window {
		if ev.Type == statemachine.EventSessionExpired {
			expiredSessions[ev.SessionID] = true
		}
	}
	freed := map[statemachine.LeaseID]bool{}
	for _, ev := range window {
		ok := false
		switch ev.Type {
		case statemachine.EventSessionExpired, statemachine.EventKeyExpired:
			ok = true
		case statemachine.EventLeaseExpired, statemachine.EventLockDelayEnded:
			ok = true
			freed[ev.Lease] = true
		case statemachine.EventLeaseWaitEnded:
			ok = ev.Reason == "session expired"
		case statemachine.EventKeyDeleted:
			ok = ev.SessionID != 0 && expiredSessions[ev.SessionID]
		case statemachine.EventLeaseAcquired:
			ok = freed[ev.Lease]
		}
		if !ok {
			t.Fatalf("%s was rejected with invalid_argument, but revision %d is a %v event %+v, expected: nothing but expiries", call, ev.Revision, ev.Type, ev)
		}
	}
}

// TestInvalidJSONIsInvalidArgument posts malformed bodies the way curl
// would. Connect decodes JSON with DiscardUnknown, so an unknown field is
// ignored rather than rejected: a misspelled field reads as absent, and
// the request is rejected only if the field it meant is required. A body
// over MaxRequestBytes is refused from its Content-Length before it is
// read, with ResourceExhausted (HTTP 413), whether or not it is valid JSON.
func TestInvalidJSONIsInvalidArgument(t *testing.T) {
	limits := testLimits()
	limits.MaxRequestBytes = 1024
	ts := startServer(t, t.TempDir(), limits)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	revision := func() int64 {
		var rev int64
		err := ts.node.Read(ctxT(t), func(m *statemachine.Machine) error {
			rev = m.Revision()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	huge := `{"key":"k","value":"` + strings.Repeat("v", 2048) + `"}`
	cases := []struct {
		name      string
		procedure string
		body      string
		code      string
		contains  string
	}{
		{"a body that is not JSON", tenurev1connect.SessionServiceOpenProcedure, "identity=alice", "invalid_argument", "unmarshal"},
		{"an empty body", tenurev1connect.SessionServiceOpenProcedure, "", "invalid_argument", "empty body"},
		{"a truncated object", tenurev1connect.KVServicePutProcedure, `{"key":"k","value":`, "invalid_argument", "unmarshal"},
		{"a JSON array instead of an object", tenurev1connect.KVServicePutProcedure, `[{"key":"k"}]`, "invalid_argument", "unmarshal"},
		{"JSON null", tenurev1connect.SessionServiceOpenProcedure, "null", "invalid_argument", "unmarshal"},
		{"two objects", tenurev1connect.KVServicePutProcedure, `{"key":"k"}{"key":"j"}`, "invalid_argument", "unmarshal"},
		{"a number where a duration goes", tenurev1connect.SessionServiceOpenProcedure, `{"ttl":10}`, "invalid_argument", "unmarshal"},
		{"a string where a bool goes", tenurev1connect.LeaseServiceAcquireProcedure, `{"sessionId":"1","name":"x","wait":"yes"}`, "invalid_argument", "unmarshal"},
		{"an object where a string goes", tenurev1connect.KVServicePutProcedure, `{"key":{"a":1},"value":"v"}`, "invalid_argument", "unmarshal"},
		{"a session ID that is not a number", tenurev1connect.SessionServiceCloseProcedure, `{"sessionId":"one"}`, "invalid_argument", "unmarshal"},
		{"a capacity over int32", tenurev1connect.LeaseServiceAcquireProcedure, `{"sessionId":"1","name":"x","capacity":2147483648}`, "invalid_argument", "unmarshal"},
		{"a duration with a bad unit", tenurev1connect.SessionServiceOpenProcedure, `{"ttl":"10 parsecs"}`, "invalid_argument", "not a duration"},
		{"seconds with more than nine decimals", tenurev1connect.SessionServiceOpenProcedure, `{"ttl":"1.000000000001s"}`, "invalid_argument", "unmarshal"},
		{"both targets of the compare oneof", tenurev1connect.KVServiceCompareAndSwapProcedure, `{"key":"k","compare":{"absent":true,"value":"v"}}`, "invalid_argument", "unmarshal"},
		{"a duplicate field", tenurev1connect.KVServicePutProcedure, `{"key":"k","key":"j"}`, "invalid_argument", "unmarshal"},
		{"invalid UTF-8 in a string", tenurev1connect.KVServicePutProcedure, "{\"key\":\"\xff\"}", "invalid_argument", "unmarshal"},
		{"a misspelled field is named, not ignored", tenurev1connect.KVServicePutProcedure, `{"kee":"k","value":"v"}`, "invalid_argument", `unknown field "kee"`},
		{"an unknown field is rejected before the TTL is read", tenurev1connect.SessionServiceOpenProcedure, `{"colour":"red","ttl":"-1s"}`, "invalid_argument", `unknown field "colour"`},
		{"a body over MaxRequestBytes", tenurev1connect.KVServicePutProcedure, huge, "resource_exhausted", "over the limit of 1024 bytes (--max-request-bytes)"},
		{"a body over MaxRequestBytes that is not JSON", tenurev1connect.KVServicePutProcedure, strings.Repeat("x", 2048), "resource_exhausted", "over the limit of 1024 bytes (--max-request-bytes)"},
	}
	before := revision()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := postRaw(t, hc, ts.URL+tc.procedure, []byte(tc.body), 0)
			var ce connectError
			if err := json.Unmarshal(body, &ce); err != nil {
				t.Fatalf("got = %d %q, expected: a connect error: %v", status, body, err)
			}
			wantStatus := legitimateCodes[tc.code]
			if len(tc.body) > limits.MaxRequestBytes {
				wantStatus = http.StatusRequestEntityTooLarge
			}
			if ce.Code != tc.code || status != wantStatus || !strings.Contains(ce.Message, tc.contains) {
				t.Fatalf("got = %d %s %q, expected: %d %s containing %q", status, ce.Code, ce.Message, wantStatus, tc.code, tc.contains)
			}
		})
	}
	if after := revision(); after != before {
		t.Fatalf("revision got = %d, expected: %d (bad input changes nothing)", after, before)
	}
}
