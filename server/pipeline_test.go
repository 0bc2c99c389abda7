package server

import (
	"bufio"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// pipeT is a test's end of an upgraded pipeline connection: every read
// is bounded in time, and a broken connection fails the test.
type pipeT struct {
	*upgradePipe
	t *testing.T
}

func openPipe(t *testing.T, ts *testServer) *pipeT {
	return &pipeT{upgradePipe: dialPipeline(t, ts), t: t}
}

func (p *pipeT) write(req *tenurev1.PipelineRequest) {
	p.t.Helper()
	if err := p.send(req); err != nil {
		p.t.Fatalf("send request %d: %v", req.GetId(), err)
	}
}

// read returns the next frame from the server, failing the test if none
// comes within 10 seconds.
func (p *pipeT) read() *tenurev1.PipelineResponse {
	p.t.Helper()
	resp, err := p.readErr()
	if err != nil {
		p.t.Fatalf("read an answer: %v", err)
	}
	return resp
}

func (p *pipeT) readErr() (*tenurev1.PipelineResponse, error) {
	_ = p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	return p.receive()
}

// roundTrip sends req and reads the next answer, which must be req's.
func (p *pipeT) roundTrip(req *tenurev1.PipelineRequest) *tenurev1.PipelineResponse {
	p.t.Helper()
	p.write(req)
	resp := p.read()
	if resp.GetId() != req.GetId() {
		p.t.Fatalf("answer to request %d: got = id %d (%v), expected: id %d", req.GetId(), resp.GetId(), resp, req.GetId())
	}
	return resp
}

// pingPong shows that nothing else was answered before the server read
// the ping: the answer to the ping is the next frame.
func (p *pipeT) pingPong(id uint64) {
	p.t.Helper()
	resp := p.roundTrip(&tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}})
	if resp.GetPong() == nil {
		p.t.Fatalf("answer to ping %d: got = %v, expected: a pong", id, resp)
	}
}

// wantPipeError checks that resp is an error answer with code and reason.
func wantPipeError(t *testing.T, resp *tenurev1.PipelineResponse, code connect.Code, reason api.Reason) *tenurev1.PipelineError {
	t.Helper()
	e := resp.GetError()
	if e == nil || connect.Code(e.GetCode()) != code || e.GetReason() != string(reason) {
		t.Fatalf("answer %d: got = %v, expected: an error %v with reason %q", resp.GetId(), resp, code, reason)
	}
	return e
}

// wantSameError checks that a pipelined operation failed as the same
// call made as a unary call did: code, message, reason and details.
func wantSameError(t *testing.T, what string, got *tenurev1.PipelineError, unary error) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(unary, &ce) {
		t.Fatalf("%s as a unary call: got = %v, expected: a connect error", what, unary)
	}
	if got == nil {
		t.Fatalf("%s pipelined: got = no error, expected: %v", what, unary)
	}
	if connect.Code(got.GetCode()) != ce.Code() || got.GetMessage() != ce.Message() || got.GetReason() != ce.Meta().Get(api.ErrorHeader) {
		t.Fatalf("%s pipelined: got = %v %q (reason %q), expected: as the unary call, %v %q (reason %q)",
			what, connect.Code(got.GetCode()), got.GetMessage(), got.GetReason(), ce.Code(), ce.Message(), ce.Meta().Get(api.ErrorHeader))
	}
	if len(got.GetDetails()) != len(ce.Details()) {
		t.Fatalf("%s pipelined: got = %d details, expected: %d, as the unary call", what, len(got.GetDetails()), len(ce.Details()))
	}
	for i, d := range ce.Details() {
		want, err := d.Value()
		if err != nil {
			t.Fatal(err)
		}
		pd, err := anypb.UnmarshalNew(got.GetDetails()[i], proto.UnmarshalOptions{})
		if err != nil {
			t.Fatalf("%s pipelined: detail %d: %v", what, i, err)
		}
		if !proto.Equal(pd, want) {
			t.Fatalf("%s pipelined: detail %d got = %v, expected: %v, as the unary call", what, i, pd, want)
		}
	}
}

// TestPipelineAnswersEachOperationAsItsUnaryMethodWould: every kind of
// operation gets its own result type, tagged with the request's ID, and
// does what the unary call does.
func TestPipelineAnswersEachOperationAsItsUnaryMethodWould(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "alice", 30*time.Second)
	p := openPipe(t, ts)
	// IDs are the client's to choose, in any order and up to 2^64-1.
	ids := []uint64{9, 3, 1 << 40, 1<<64 - 1, 17, 2, 11, 5, 100, 42, 7}

	acq := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[0], Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: s.Id, Name: "job"}}}).GetAcquire()
	if !acq.GetAcquired() || acq.GetToken() <= 0 || acq.GetLease().GetHolderIdentity() != "alice" {
		t.Fatalf("acquire: got = %v, expected: granted to alice", acq)
	}
	token := acq.GetToken()

	val := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[1], Op: &tenurev1.PipelineRequest_Validate{Validate: &tenurev1.ValidateRequest{Name: "job", Token: token}}}).GetValidate()
	if !val.GetValid() || val.GetHolderIdentity() != "alice" || val.GetCurrentToken() != token {
		t.Fatalf("validate: got = %v, expected: valid, alice, token %d", val, token)
	}

	set := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[2], Op: &tenurev1.PipelineRequest_SetValue{SetValue: &tenurev1.SetValueRequest{Name: "job", Token: token, Value: "step 2"}}}).GetSetValue()
	if set.GetRevision() <= token {
		t.Fatalf("set value: got = %v, expected: a revision past the grant's %d", set, token)
	}
	lease, err := ts.Leases.Get(ctxT(t), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if v := lease.Msg.GetLease().GetValue(); v != "step 2" {
		t.Fatalf("lease value after a pipelined SetValue: got = %q, expected: %q", v, "step 2")
	}

	put := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[3], Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: "config", Value: "v1"}}}).GetPut()
	// Keys have a clock of their own (the KV revision): the put's
	// revision is the key's, not the grant's.
	if put.GetRevision() <= 0 {
		t.Fatalf("put: got = %v, expected: a revision", put)
	}

	get := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[4], Op: &tenurev1.PipelineRequest_Get{Get: &tenurev1.GetRequest{Key: "config"}}}).GetGet()
	if get.GetKv().GetValue() != "v1" || get.GetKv().GetModRevision() != put.GetRevision() {
		t.Fatalf("get: got = %v, expected: v1 at revision %d", get, put.GetRevision())
	}

	cas := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[5], Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: &tenurev1.CompareAndSwapRequest{
		Key: "config", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "v1"}}, Value: "v2",
	}}}).GetCompareAndSwap()
	if cas.GetKv().GetValue() != "v2" || cas.GetRevision() <= put.GetRevision() {
		t.Fatalf("compare-and-swap that holds: got = %v, expected: v2 at a revision past %d", cas, put.GetRevision())
	}

	// A failed compare is an error carrying the key as it is, exactly as
	// the unary call's.
	failing := &tenurev1.CompareAndSwapRequest{Key: "config", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "v1"}}, Value: "v3"}
	resp := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[6], Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: failing}})
	e := wantPipeError(t, resp, connect.CodeFailedPrecondition, api.ReasonCompareFailed)
	if len(e.GetDetails()) != 1 {
		t.Fatalf("failed compare-and-swap: got = %d details, expected: the current key", len(e.GetDetails()))
	}
	var cur tenurev1.GetResponse
	if err := e.GetDetails()[0].UnmarshalTo(&cur); err != nil {
		t.Fatalf("failed compare-and-swap's detail: %v", err)
	}
	if cur.GetKv().GetValue() != "v2" || cur.GetKv().GetModRevision() != cas.GetRevision() {
		t.Fatalf("failed compare-and-swap's detail: got = %v, expected: v2 at revision %d", cur.GetKv(), cas.GetRevision())
	}
	_, unary := ts.KV.CompareAndSwap(ctxT(t), connect.NewRequest(failing))
	wantSameError(t, "failed compare-and-swap", e, unary)

	del := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[7], Op: &tenurev1.PipelineRequest_Delete{Delete: &tenurev1.DeleteRequest{Key: "config"}}}).GetDelete()
	if del.GetDeleted() != 1 {
		t.Fatalf("delete: got = %v, expected: 1 deleted", del)
	}

	ref := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[8], Op: &tenurev1.PipelineRequest_Refresh{Refresh: &tenurev1.KeepAliveRequest{SessionId: s.Id}}}).GetRefresh()
	if ref.GetSessionId() != s.Id || ref.GetExpired() || ref.GetTtl().AsDuration() != 30*time.Second {
		t.Fatalf("refresh: got = %v, expected: session %d alive with its 30s TTL", ref, s.Id)
	}

	rel := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[9], Op: &tenurev1.PipelineRequest_Release{Release: &tenurev1.ReleaseRequest{Name: "job", Token: token}}}).GetRelease()
	if rel.GetRevision() <= del.GetRevision() {
		t.Fatalf("release: got = %v, expected: a revision past %d", rel, del.GetRevision())
	}
	after, err := ts.Leases.Validate(ctxT(t), connect.NewRequest(&tenurev1.ValidateRequest{Name: "job", Token: token}))
	if err != nil {
		t.Fatal(err)
	}
	if after.Msg.GetValid() {
		t.Fatalf("validate after a pipelined release: got = valid, expected: invalid")
	}
	// A non-waiting Acquire of a held lease is answered "not acquired",
	// not an error, as the unary call is.
	other := openSession(t, ts, "bob", 30*time.Second)
	acquire(t, ts, other.Id, "job", false)
	miss := p.roundTrip(&tenurev1.PipelineRequest{Id: ids[10], Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: s.Id, Name: "job"}}}).GetAcquire()
	if miss == nil || miss.GetAcquired() || miss.GetToken() != 0 || miss.GetLease().GetHolderIdentity() != "bob" {
		t.Fatalf("acquire of a held lease: got = %v, expected: not acquired, held by bob", miss)
	}
}

// TestPipelineAnswersOutOfOrder: a parked Acquire holds up nothing sent
// after it on the same connection, and is answered when it is granted.
func TestPipelineAnswersOutOfOrder(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	holder := openSession(t, ts, "holder", 30*time.Second)
	waiter := openSession(t, ts, "waiter", 30*time.Second)
	first := acquire(t, ts, holder.Id, "job", false)
	if _, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "v"})); err != nil {
		t.Fatal(err)
	}
	p := openPipe(t, ts)
	p.write(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: waiter.Id, Name: "job", Wait: true}}})
	waitForWaiters(t, ts, "job", 1)

	get := p.roundTrip(&tenurev1.PipelineRequest{Id: 2, Op: &tenurev1.PipelineRequest_Get{Get: &tenurev1.GetRequest{Key: "k"}}})
	if get.GetGet().GetKv().GetValue() != "v" {
		t.Fatalf("get behind a parked acquire: got = %v, expected: k = v", get)
	}
	p.pingPong(3)

	// The holder releases on the same connection: both the release and
	// the grant it causes are answered, in whichever order they finish.
	p.write(&tenurev1.PipelineRequest{Id: 4, Op: &tenurev1.PipelineRequest_Release{Release: &tenurev1.ReleaseRequest{Name: "job", Token: first.Token}}})
	answers := map[uint64]*tenurev1.PipelineResponse{}
	for len(answers) < 2 {
		resp := p.read()
		if answers[resp.GetId()] != nil || (resp.GetId() != 1 && resp.GetId() != 4) {
			t.Fatalf("got = %v, expected: one answer each to requests 1 and 4", resp)
		}
		answers[resp.GetId()] = resp
	}
	if answers[4].GetRelease() == nil {
		t.Fatalf("release: got = %v, expected: a release result", answers[4])
	}
	granted := answers[1].GetAcquire()
	if !granted.GetAcquired() || granted.GetToken() <= first.Token || granted.GetLease().GetHolderIdentity() != "waiter" {
		t.Fatalf("parked acquire after the release: got = %v, expected: granted to waiter with a token above %d", answers[1], first.Token)
	}
}

// TestPipelineCancelEndsAParkedAcquire: a Cancel frame ends a parked
// Acquire as a cancelled context ends the unary call: its session leaves
// the queue, it is never granted, and neither it nor the cancel is
// answered (its caller has gone).
func TestPipelineCancelEndsAParkedAcquire(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	holder := openSession(t, ts, "holder", 30*time.Second)
	waiter := openSession(t, ts, "waiter", 30*time.Second)
	first := acquire(t, ts, holder.Id, "job", false)
	p := openPipe(t, ts)
	p.write(&tenurev1.PipelineRequest{Id: 10, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: waiter.Id, Name: "job", Wait: true}}})
	waitForWaiters(t, ts, "job", 1)

	// A cancel of an ID not in flight does nothing and is not answered.
	p.write(&tenurev1.PipelineRequest{Id: 11, Op: &tenurev1.PipelineRequest_Cancel{Cancel: 999}})
	p.pingPong(12)
	p.write(&tenurev1.PipelineRequest{Id: 13, Op: &tenurev1.PipelineRequest_Cancel{Cancel: 10}})
	waitForWaiters(t, ts, "job", 0)
	// Neither request 10 nor the cancel is answered: the next frame is
	// the pong.
	p.pingPong(14)
	sess, err := ts.Sessions.Get(ctxT(t), connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: waiter.Id}))
	if err != nil {
		t.Fatal(err)
	}
	if w := sess.Msg.GetSession().GetWaiting(); len(w) != 0 {
		t.Fatalf("waiter's queues after the cancel: got = %v, expected: none", w)
	}
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: first.Token})); err != nil {
		t.Fatal(err)
	}
	lease, err := ts.Leases.Get(ctxT(t), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Msg.GetLease().GetHolders(); len(h) != 0 {
		t.Fatalf("holders after the release: got = %v, expected: none, the only waiter cancelled", h)
	}
	p.pingPong(15)
}

// TestPipelineWatchGrantAnswersWhenTheGrantEnds: a WatchGrant stays
// unanswered while the grant is held, and is answered with the event
// that ended it.
func TestPipelineWatchGrantAnswersWhenTheGrantEnds(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	cases := []struct {
		name string
		ttl  time.Duration
		end  func(t *testing.T, name string, token int64)
		want tenurev1.LeaseEventType
	}{
		{"released", 30 * time.Second, func(t *testing.T, name string, token int64) {
			if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: name, Token: token})); err != nil {
				t.Fatal(err)
			}
		}, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED},
		{"revoked", 30 * time.Second, func(t *testing.T, name string, token int64) {
			if _, err := ts.Leases.Revoke(ctxT(t), connect.NewRequest(&tenurev1.RevokeRequest{Name: name, Token: token, Reason: "operator"})); err != nil {
				t.Fatal(err)
			}
		}, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_REVOKED},
		// Nobody heartbeats the session: it expires after its TTL, long
		// enough for the acquire to come first on a loaded machine.
		{"expired", time.Second, func(*testing.T, string, int64) {}, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openSession(t, ts, "holder-"+c.name, c.ttl)
			p := openPipe(t, ts)
			acq := p.roundTrip(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: s.Id, Name: c.name}}}).GetAcquire()
			if !acq.GetAcquired() {
				t.Fatalf("acquire: got = %v, expected: granted", acq)
			}
			// From the revision after the grant, so that an end that
			// comes before the watch starts is still seen.
			p.write(&tenurev1.PipelineRequest{Id: 2, Op: &tenurev1.PipelineRequest_WatchGrant{WatchGrant: &tenurev1.WatchGrantRequest{Name: c.name, Token: acq.GetToken(), StartRevision: acq.GetToken() + 1}}})
			if c.want != tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED {
				p.pingPong(3)
				// A change that does not end the grant does not answer.
				if _, err := ts.Leases.SetValue(ctxT(t), connect.NewRequest(&tenurev1.SetValueRequest{Name: c.name, Token: acq.GetToken(), Value: "x"})); err != nil {
					t.Fatal(err)
				}
				p.pingPong(4)
			}
			c.end(t, c.name, acq.GetToken())
			resp := p.read()
			ev := resp.GetWatchGrant().GetEvent()
			if resp.GetId() != 2 || ev.GetType() != c.want || ev.GetToken() != acq.GetToken() || ev.GetName() != c.name {
				t.Fatalf("watch answer: got = %v, expected: request 2 answered with %v of token %d", resp, c.want, acq.GetToken())
			}
		})
	}
}

func TestPipelinePingEmptyRequestAndDuplicateID(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	holder := openSession(t, ts, "holder", 30*time.Second)
	waiter := openSession(t, ts, "waiter", 30*time.Second)
	first := acquire(t, ts, holder.Id, "job", false)
	p := openPipe(t, ts)

	p.pingPong(42)
	wantPipeError(t, p.roundTrip(&tenurev1.PipelineRequest{Id: 43}), connect.CodeInvalidArgument, api.ReasonInvalidArgument)

	// An ID in flight cannot be reused: the second request is refused,
	// and the first goes on as if it had not been sent.
	p.write(&tenurev1.PipelineRequest{Id: 7, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: waiter.Id, Name: "job", Wait: true}}})
	waitForWaiters(t, ts, "job", 1)
	dup := p.roundTrip(&tenurev1.PipelineRequest{Id: 7, Op: &tenurev1.PipelineRequest_Get{Get: &tenurev1.GetRequest{Key: "k"}}})
	e := wantPipeError(t, dup, connect.CodeInvalidArgument, api.ReasonInvalidArgument)
	if !strings.Contains(e.GetMessage(), "already in flight") {
		t.Fatalf("duplicate ID: got = %q, expected: a message saying the ID is in flight", e.GetMessage())
	}
	p.pingPong(8)
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: first.Token})); err != nil {
		t.Fatal(err)
	}
	resp := p.read()
	if resp.GetId() != 7 || !resp.GetAcquire().GetAcquired() || resp.GetAcquire().GetLease().GetHolderIdentity() != "waiter" {
		t.Fatalf("the first request 7 after the release: got = %v, expected: granted to waiter", resp)
	}
	// Once answered, the ID is free again.
	p.pingPong(7)
}

// TestPipelineErrorsAreTheUnaryCallsErrors: a request the unary call
// refuses is refused alike: code, message and reason.
func TestPipelineErrorsAreTheUnaryCallsErrors(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "alice", 30*time.Second)
	token := acquire(t, ts, s.Id, "held", false).Token
	ctx := ctxT(t)
	cases := []struct {
		name  string
		req   *tenurev1.PipelineRequest
		unary func() error
	}{
		{"acquire with an empty name",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: s.Id}}},
			func() error {
				_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id}))
				return err
			}},
		{"acquire by no session",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{Name: "x"}}},
			func() error {
				_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{Name: "x"}))
				return err
			}},
		{"release of a name with a slash",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Release{Release: &tenurev1.ReleaseRequest{Name: "a/b", Token: 1}}},
			func() error {
				_, err := ts.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: "a/b", Token: 1}))
				return err
			}},
		{"release by a token that does not hold",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Release{Release: &tenurev1.ReleaseRequest{Name: "held", Token: token + 100}}},
			func() error {
				_, err := ts.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: "held", Token: token + 100}))
				return err
			}},
		{"put with an empty key",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Value: "v"}}},
			func() error {
				_, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Value: "v"}))
				return err
			}},
		{"get of a missing key",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Get{Get: &tenurev1.GetRequest{Key: "missing"}}},
			func() error {
				_, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "missing"}))
				return err
			}},
		{"compare-and-swap without a compare",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: &tenurev1.CompareAndSwapRequest{Key: "k"}}},
			func() error {
				_, err := ts.KV.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{Key: "k"}))
				return err
			}},
		{"refresh of an unknown session",
			&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Refresh{Refresh: &tenurev1.KeepAliveRequest{SessionId: 1 << 40}}},
			func() error {
				_, err := ts.Sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: 1 << 40}))
				return err
			}},
	}
	p := openPipe(t, ts)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			unary := c.unary()
			if unary == nil {
				t.Fatalf("unary call: got = no error, expected: one (the case is wrong)")
			}
			c.req.Id = uint64(i + 1)
			resp := p.roundTrip(c.req)
			wantSameError(t, c.name, resp.GetError(), unary)
		})
	}
	// WatchGrant has no unary form; it checks its token like the others.
	resp := p.roundTrip(&tenurev1.PipelineRequest{Id: 100, Op: &tenurev1.PipelineRequest_WatchGrant{WatchGrant: &tenurev1.WatchGrantRequest{Name: "held"}}})
	wantPipeError(t, resp, connect.CodeInvalidArgument, api.ReasonInvalidArgument)
}

// requestsTotal scrapes /metrics for tenure_requests_total of one
// method and code.
func requestsTotal(t *testing.T, ts *testServer, method, code string) float64 {
	t.Helper()
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tenure_requests_total{") ||
			!strings.Contains(line, `method="`+method+`"`) || !strings.Contains(line, `code="`+code+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestPipelinedOpsAreCountedUnderTheUnaryMethods: dashboards see the
// same request counts whichever transport a client uses.
func TestPipelinedOpsAreCountedUnderTheUnaryMethods(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "alice", 30*time.Second)
	type counted struct{ method, code string }
	counts := []counted{
		{tenurev1connect.LeaseServiceAcquireProcedure, "ok"},
		{tenurev1connect.LeaseServiceReleaseProcedure, "ok"},
		{tenurev1connect.KVServicePutProcedure, "ok"},
		{tenurev1connect.KVServiceCompareAndSwapProcedure, "failed_precondition"},
	}
	before := map[counted]float64{}
	for _, c := range counts {
		before[c] = requestsTotal(t, ts, c.method, c.code)
	}
	p := openPipe(t, ts)
	const pairs = 3
	for i := range uint64(pairs) {
		acq := p.roundTrip(&tenurev1.PipelineRequest{Id: 10 + i, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: s.Id, Name: "job"}}}).GetAcquire()
		p.roundTrip(&tenurev1.PipelineRequest{Id: 20 + i, Op: &tenurev1.PipelineRequest_Release{Release: &tenurev1.ReleaseRequest{Name: "job", Token: acq.GetToken()}}})
	}
	p.roundTrip(&tenurev1.PipelineRequest{Id: 30, Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: "k", Value: "v"}}})
	resp := p.roundTrip(&tenurev1.PipelineRequest{Id: 31, Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: &tenurev1.CompareAndSwapRequest{
		Key: "k", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Absent{Absent: true}}, Value: "w",
	}}})
	wantPipeError(t, resp, connect.CodeFailedPrecondition, api.ReasonCompareFailed)
	want := map[counted]float64{counts[0]: pairs, counts[1]: pairs, counts[2]: 1, counts[3]: 1}
	for _, c := range counts {
		if got := requestsTotal(t, ts, c.method, c.code) - before[c]; got != want[c] {
			t.Errorf("tenure_requests_total{method=%q,code=%q} rose by: got = %v, expected: %v", c.method, c.code, got, want[c])
		}
	}
}
