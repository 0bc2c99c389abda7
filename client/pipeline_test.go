package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/client"
)

// These tests hold the pipeline to the retry rules of a unary call: a
// request the server provably did not take is sent again, even a
// compare-and-swap; one that may have been taken is sent again only if
// it is idempotent, and otherwise fails with ErrUnknownOutcome. A
// scripted fake endpoint plays the server, so each case decides exactly
// what reached it, and counts the attempts.

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// GoAway naming an earlier request proves the CAS was not read: it is
// sent again on a new connection, and succeeds.
func TestPipelineGoAwayUnreadIsRetried(t *testing.T) {
	f := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a compare-and-swap", isCAS)
		if req == nil {
			return
		}
		if n == 0 {
			// Stopped reading before this request, as far as the client
			// can tell.
			c.Send(&tenurev1.PipelineResponse{Result: &tenurev1.PipelineResponse_GoAway{GoAway: &tenurev1.GoAway{LastId: req.GetId() - 1}}})
			return
		}
		c.Send(casAnswer(req, 7))
		c.Hold()
	})
	kv := newFakeClient(t, []string{f.Addr()}).KV()
	got, err := kv.CompareAndSwap(testCtx(t), "k", client.Absent(), "v1")
	if err != nil {
		t.Fatalf("got = %v, expected: the CAS retried after GoAway and applied", err)
	}
	if got.Value != "v1" || got.ModRevision != 7 {
		t.Errorf("got = %+v, expected: value v1 at revision 7", got)
	}
	if n := f.Count(isCAS); n != 2 {
		t.Errorf("got = CAS seen %d times, expected: 2 (once per connection)", n)
	}
	if n := f.Pipes(); n != 2 {
		t.Errorf("got = %d pipeline connections, expected: 2", n)
	}
}

// GoAway whose last ID is the CAS's own says the server read it: with
// no answer before the GoAway, its outcome is unknown, and it is not
// sent again.
func TestPipelineGoAwayReadIsNotRetried(t *testing.T) {
	f := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a compare-and-swap", isCAS)
		if req == nil {
			return
		}
		c.Send(&tenurev1.PipelineResponse{Result: &tenurev1.PipelineResponse_GoAway{GoAway: &tenurev1.GoAway{LastId: req.GetId()}}})
	})
	kv := newFakeClient(t, []string{f.Addr()}).KV()
	_, err := kv.CompareAndSwap(testCtx(t), "k", client.Absent(), "v1")
	if !errors.Is(err, client.ErrUnknownOutcome) {
		t.Fatalf("got = %v, expected: ErrUnknownOutcome", err)
	}
	if n := f.Count(isCAS); n != 1 {
		t.Errorf("got = CAS seen %d times, expected: 1", n)
	}
}

// A write that reached the server whole, and whose connection then
// broke without an answer, may have been applied: Put, Delete and
// CompareAndSwap (all documented as not repeated) fail with
// ErrUnknownOutcome and are sent once.
func TestPipelineLostAfterSentIsUnknown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match func(*tenurev1.PipelineRequest) bool
		call  func(ctx context.Context, kv *client.KV) error
	}{
		{"CompareAndSwap", isCAS, func(ctx context.Context, kv *client.KV) error {
			_, err := kv.CompareAndSwap(ctx, "k", client.ValueIs("a"), "b")
			return err
		}},
		{"Put", isPut, func(ctx context.Context, kv *client.KV) error {
			_, err := kv.Put(ctx, "k", "b")
			return err
		}},
		{"Delete", isDelete, func(ctx context.Context, kv *client.KV) error {
			_, err := kv.Delete(ctx, "k")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t, func(n int, c *fakeConn) {
				// Read the whole request, then drop the connection.
				c.Expect(tc.name, tc.match)
			})
			kv := newFakeClient(t, []string{f.Addr()}).KV()
			err := tc.call(testCtx(t), kv)
			if !errors.Is(err, client.ErrUnknownOutcome) {
				t.Fatalf("got = %v, expected: ErrUnknownOutcome", err)
			}
			if n := f.Count(tc.match); n != 1 {
				t.Errorf("got = %s sent %d times, expected: 1", tc.name, n)
			}
			if n := f.Upgrades(); n != 1 {
				t.Errorf("got = %d upgrade requests, expected: 1 (no attempt after the loss)", n)
			}
		})
	}
}

// An idempotent call whose connection broke after it was sent is sent
// again, on a new connection.
func TestPipelineIdempotentLostIsRetried(t *testing.T) {
	f := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a get", isGet)
		if req == nil || n == 0 {
			return // drop the first connection unanswered
		}
		c.Send(getAnswer(req, "second", 9))
		c.Hold()
	})
	kv := newFakeClient(t, []string{f.Addr()}).KV()
	got, err := kv.Get(testCtx(t), "k")
	if err != nil {
		t.Fatalf("got = %v, expected: the Get retried", err)
	}
	if got.Value != "second" {
		t.Errorf("got = %+v, expected: the second connection's answer", got)
	}
	if n := f.Count(isGet); n != 2 {
		t.Errorf("got = Get seen %d times, expected: 2", n)
	}
}

// A failed compare on the pipeline reads like the unary call's: a
// *CompareFailedError with the current key from the error's details,
// the server's message, and no retry.
func TestPipelineCompareFailedPassthrough(t *testing.T) {
	const message = `compare failed: key "k" has value "current"`
	current, err := anypb.New(&tenurev1.GetResponse{Revision: 12, Kv: &tenurev1.KeyValue{
		Key: "k", Value: "current", CreateRevision: 3, ModRevision: 11, Version: 4,
	}})
	if err != nil {
		t.Fatal(err)
	}
	f := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a compare-and-swap", isCAS)
		if req == nil {
			return
		}
		c.Send(&tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Error{Error: &tenurev1.PipelineError{
			Code:    int32(connect.CodeFailedPrecondition),
			Reason:  string(api.ReasonCompareFailed),
			Message: message,
			Details: []*anypb.Any{current},
		}}})
		c.Hold()
	})
	kv := newFakeClient(t, []string{f.Addr()}).KV()
	_, err = kv.CompareAndSwap(testCtx(t), "k", client.ValueIs("expected"), "new")
	if !errors.Is(err, client.ErrCompareFailed) {
		t.Fatalf("got = %v, expected: ErrCompareFailed", err)
	}
	var cf *client.CompareFailedError
	if !errors.As(err, &cf) {
		t.Fatalf("got = %T, expected: *client.CompareFailedError", err)
	}
	want := client.KeyValue{Key: "k", Value: "current", CreateRevision: 3, ModRevision: 11, Version: 4}
	if !cf.Found || cf.Current != want || cf.Revision != 12 {
		t.Errorf("got = found %v current %+v revision %d, expected: found, %+v, revision 12", cf.Found, cf.Current, cf.Revision, want)
	}
	if err.Error() != message {
		t.Errorf("got = message %q, expected: %q", err.Error(), message)
	}
	if n := f.Count(isCAS); n != 1 {
		t.Errorf("got = CAS seen %d times, expected: 1", n)
	}
}

// "Not leader" naming the leader on the pipeline moves the client to
// that leader, where the call (provably not applied by the follower) is
// sent again.
func TestPipelineNotLeaderFollowsLeader(t *testing.T) {
	leader := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a compare-and-swap", isCAS)
		if req == nil {
			return
		}
		c.Send(casAnswer(req, 21))
		c.Hold()
	})
	follower := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a compare-and-swap", isCAS)
		if req == nil {
			return
		}
		c.Send(&tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Error{Error: &tenurev1.PipelineError{
			Code:    int32(connect.CodeUnavailable),
			Reason:  string(api.ReasonNotLeader),
			Message: "this node is not the leader",
			Leader:  leader.Addr(),
		}}})
		c.Hold()
	})
	c := newFakeClient(t, []string{follower.Addr()})
	got, err := c.KV().CompareAndSwap(testCtx(t), "k", client.Absent(), "v")
	if err != nil {
		t.Fatalf("got = %v, expected: the CAS applied by the leader", err)
	}
	if got.ModRevision != 21 {
		t.Errorf("got = %+v, expected: the leader's answer (revision 21)", got)
	}
	if a, b := follower.Count(isCAS), leader.Count(isCAS); a != 1 || b != 1 {
		t.Errorf("got = CAS seen %d times by the follower, %d by the leader, expected: once each", a, b)
	}
	if eps := c.Endpoints(); eps[0] != "http://"+leader.Addr() {
		t.Errorf("got = endpoints %v, expected: the leader %s first", eps, leader.Addr())
	}
}

// A follower refuses the upgrade ("not leader"): the call goes unary to
// it, which forwards it; the leader its answer names gets the next call,
// on a pipeline.
func TestPipelineFollowerRefusalFallsBackToUnary(t *testing.T) {
	leader := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a get", isGet)
		if req == nil {
			return
		}
		c.Send(getAnswer(req, "piped", 30))
		c.Hold()
	})
	follower := startFake(t, func(n int, c *fakeConn) {
		t.Errorf("the follower upgraded connection %d", n)
	})
	follower.refuse = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set(api.ErrorHeader, string(api.ReasonNotLeader))
		http.Error(w, "this node is not the leader", http.StatusServiceUnavailable)
		return true
	}
	kvs := &fakeKV{leader: leader.Addr()}
	follower.mountKV(kvs)

	c := newFakeClient(t, []string{follower.Addr()})
	ctx := testCtx(t)
	got, err := c.KV().Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got.Value != "unary" {
		t.Errorf("got = %+v, expected: the follower's unary answer", got)
	}
	if n, m := follower.Upgrades(), kvs.count("Get"); n != 1 || m != 1 {
		t.Errorf("got = %d upgrade requests and %d unary Gets at the follower, expected: 1 and 1", n, m)
	}
	got, err = c.KV().Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got.Value != "piped" {
		t.Errorf("got = %+v, expected: the leader's pipelined answer", got)
	}
	if n := leader.Count(isGet); n != 1 {
		t.Errorf("got = %d Gets on the leader's pipeline, expected: 1", n)
	}
	if n, m := follower.Upgrades(), kvs.count("Get"); n != 1 || m != 1 {
		t.Errorf("got = %d upgrade requests and %d unary Gets at the follower after the second Get, expected: still 1 and 1", n, m)
	}
}

// A server from before pipelines (404 or 405 on the upgrade) gets unary
// calls, and is not asked to upgrade again.
func TestPipelineOldServerUnaryOnly(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			f := startFake(t, func(n int, c *fakeConn) {
				t.Errorf("the old server upgraded connection %d", n)
			})
			f.refuse = func(w http.ResponseWriter, r *http.Request) bool {
				http.Error(w, http.StatusText(status), status)
				return true
			}
			kvs := &fakeKV{}
			f.mountKV(kvs)
			kv := newFakeClient(t, []string{f.Addr()}).KV()
			ctx := testCtx(t)
			for i := 0; i < 3; i++ {
				if _, err := kv.Get(ctx, "k"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := kv.Put(ctx, "k", "v"); err != nil {
				t.Fatal(err)
			}
			if _, err := kv.CompareAndSwap(ctx, "k", client.ValueIs("v"), "w"); err != nil {
				t.Fatal(err)
			}
			if n := f.Upgrades(); n != 1 {
				t.Errorf("got = %d upgrade requests, expected: 1", n)
			}
			if g, p, s := kvs.count("Get"), kvs.count("Put"), kvs.count("CompareAndSwap"); g != 3 || p != 1 || s != 1 {
				t.Errorf("got = unary Get %d, Put %d, CAS %d, expected: 3, 1, 1", g, p, s)
			}
		})
	}
}

// A call whose context ends while it waits on the pipeline tells the
// server with a Cancel naming its ID, and is not sent again.
func TestPipelineCancelNamesRequest(t *testing.T) {
	t.Run("MutexLock", func(t *testing.T) {
		cancels := make(chan uint64, 1)
		f := startFake(t, func(n int, c *fakeConn) {
			req := c.Expect("a waiting acquire", func(r *tenurev1.PipelineRequest) bool { return r.GetAcquire().GetWait() })
			if req == nil {
				return
			}
			if cancel := c.Expect("a cancel", func(r *tenurev1.PipelineRequest) bool { return r.GetCancel() == req.GetId() }); cancel != nil {
				cancels <- cancel.GetCancel()
			}
			c.Hold()
		})
		f.mountSessions()
		c := newFakeClient(t, []string{f.Addr()})
		s, err := c.NewSession(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		ctx, cancel := context.WithCancel(testCtx(t))
		locked := make(chan error, 1)
		go func() { locked <- s.Mutex("m").Lock(ctx) }()
		waitFor(t, "the acquire", func() bool { return f.Count(isAcquire) == 1 })
		cancel()
		if err := <-locked; !errors.Is(err, context.Canceled) {
			t.Errorf("got = %v, expected: context.Canceled", err)
		}
		select {
		case <-cancels:
		case <-time.After(10 * time.Second):
			t.Fatal("got = no cancel frame, expected: a cancel naming the acquire")
		}
		if n := f.Count(isAcquire); n != 1 {
			t.Errorf("got = acquire sent %d times, expected: 1", n)
		}
	})
	t.Run("Get", func(t *testing.T) {
		cancels := make(chan uint64, 1)
		f := startFake(t, func(n int, c *fakeConn) {
			req := c.Expect("a get", isGet)
			if req == nil {
				return
			}
			if cancel := c.Expect("a cancel", func(r *tenurev1.PipelineRequest) bool { return r.GetCancel() == req.GetId() }); cancel != nil {
				cancels <- cancel.GetCancel()
			}
			c.Hold()
		})
		kv := newFakeClient(t, []string{f.Addr()}).KV()
		ctx, cancel := context.WithCancel(testCtx(t))
		got := make(chan error, 1)
		go func() {
			_, err := kv.Get(ctx, "k")
			got <- err
		}()
		waitFor(t, "the get", func() bool { return f.Count(isGet) == 1 })
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Errorf("got = %v, expected: context.Canceled", err)
		}
		select {
		case <-cancels:
		case <-time.After(10 * time.Second):
			t.Fatal("got = no cancel frame, expected: a cancel naming the get")
		}
		if n := f.Count(isGet); n != 1 {
			t.Errorf("got = Get sent %d times, expected: 1", n)
		}
	})
}

// Closing the client fails the calls waiting on its pipeline at once:
// an idempotent one as closed, a write as of unknown outcome (it was
// sent). goleak (TestMain) checks that nothing is left running.
func TestPipelineCloseWithCallInFlight(t *testing.T) {
	f := startFake(t, func(n int, c *fakeConn) { c.Hold() })
	c := newFakeClient(t, []string{f.Addr()})
	ctx := testCtx(t)
	type result struct {
		op  string
		err error
	}
	results := make(chan result, 2)
	go func() {
		_, err := c.KV().Get(ctx, "k")
		results <- result{"Get", err}
	}()
	go func() {
		_, err := c.KV().CompareAndSwap(ctx, "k", client.Absent(), "v")
		results <- result{"CompareAndSwap", err}
	}()
	waitFor(t, "both calls", func() bool { return f.Count(isGet) == 1 && f.Count(isCAS) == 1 })
	start := time.Now()
	c.Close()
	for range 2 {
		select {
		case r := <-results:
			switch {
			case r.op == "Get" && !errors.Is(r.err, client.ErrClosed):
				t.Errorf("got = Get %v, expected: ErrClosed", r.err)
			case r.op == "CompareAndSwap" && !errors.Is(r.err, client.ErrUnknownOutcome):
				t.Errorf("got = CompareAndSwap %v, expected: ErrUnknownOutcome", r.err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("got = a call still waiting 2s after Close, expected: both failed at once")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("got = calls failed %v after Close, expected: at once", d)
	}
	if n := f.Upgrades(); n != 1 {
		t.Errorf("got = %d upgrade requests, expected: 1 (nothing after Close)", n)
	}
}

// A request whose frame the kernel took while a later, larger frame in
// the same write was still going out left whole: when the connection
// then breaks, it may have been applied, and a compare-and-swap must
// not be sent again. Here the fake reads a large Put, then the CAS
// batched behind it with another large Put, then stops reading and
// half-closes, so that the client's write is still under way when its
// read side ends. (Closing the connection ends that write; what the
// client must not do is count its bytes before it has. Without that,
// this test fails only when the scheduler lets the close win the race:
// about one run in twenty here.)
func TestPipelineWriteUnderWayCountsAsSent(t *testing.T) {
	const big = 12 << 20 // well past the socket buffers on both sides
	started, read, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	f := startFake(t, func(n int, c *fakeConn) {
		if n > 0 {
			for {
				req := c.Next()
				if req == nil {
					return
				}
				c.Send(answer(req))
			}
		}
		// A small receive buffer, so that the big frames stay in the
		// client's write.
		_ = c.conn.(*net.TCPConn).SetReadBuffer(64 << 10)
		if _, err := c.br.Peek(1); err != nil {
			t.Errorf("fake: %v", err)
			return
		}
		close(started)
		select {
		case <-read:
		case <-c.f.done:
			return
		}
		for {
			req := c.Next()
			if req == nil {
				t.Error("fake: the connection ended before the CAS")
				return
			}
			if isCAS(req) {
				break
			}
		}
		_ = c.conn.(*net.TCPConn).CloseWrite()
		select {
		case <-done:
		case <-c.f.done:
		}
	})
	kv := newFakeClient(t, []string{f.Addr()}).KV()
	ctx := testCtx(t)
	value := strings.Repeat("x", big)
	puts := make(chan error, 2)
	go func() {
		_, err := kv.Put(ctx, "first", value)
		puts <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first Put never arrived")
	}
	// The first Put's write is under way and cannot finish: the CAS and
	// the second Put queue behind it, and go out in one write.
	cas := make(chan error, 1)
	time.Sleep(100 * time.Millisecond)
	go func() {
		_, err := kv.CompareAndSwap(ctx, "k", client.Absent(), "v")
		cas <- err
	}()
	time.Sleep(100 * time.Millisecond)
	go func() {
		_, err := kv.Put(ctx, "second", value)
		puts <- err
	}()
	time.Sleep(100 * time.Millisecond)
	close(read)
	err := <-cas
	close(done)
	if !errors.Is(err, client.ErrUnknownOutcome) {
		t.Errorf("got = %v, expected: ErrUnknownOutcome (the server read the CAS)", err)
	}
	if n := f.Count(isCAS); n != 1 {
		t.Errorf("got = CAS seen %d times, expected: 1", n)
	}
	for range 2 {
		<-puts // either outcome: one was read whole, one was cut
	}
}

// pong answers a ping.
func pong(req *tenurev1.PipelineRequest) *tenurev1.PipelineResponse {
	return &tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Pong{Pong: &tenurev1.Ping{}}}
}

// The watchdog, with its bounds shortened from 5s and 5s: a pipeline
// with a call in flight that stays silent for `every` is pinged; pongs
// keep it alive however long the answer takes; no pings go out while
// nothing is in flight.
func TestPipelineWatchdogPings(t *testing.T) {
	const every, timeout = 200 * time.Millisecond, 200 * time.Millisecond
	type seen struct {
		ping  bool
		after time.Duration // since the CAS arrived
	}
	frames := make(chan seen, 100)
	f := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a compare-and-swap", isCAS)
		if req == nil {
			return
		}
		start := time.Now()
		for pings := 0; pings < 3; {
			ping := c.Expect("a ping", isPing)
			if ping == nil {
				return
			}
			frames <- seen{true, time.Since(start)}
			c.Send(pong(ping))
			pings++
		}
		c.Send(casAnswer(req, 3))
		c.Hold()
	})
	kv := newFakeClient(t, []string{f.Addr()}, client.WithPipelinePings(every, timeout)).KV()
	start := time.Now()
	if _, err := kv.CompareAndSwap(testCtx(t), "k", client.Absent(), "v"); err != nil {
		t.Fatalf("got = %v, expected: the CAS answered after three pongs", err)
	}
	if d := time.Since(start); d < every+timeout {
		t.Errorf("got = answered after %v, expected: after the pings, past %v", d, every+timeout)
	}
	if first := <-frames; first.after < every-50*time.Millisecond {
		t.Errorf("got = first ping %v after the call, expected: not before %v of silence", first.after, every)
	}
	if n := f.Pipes(); n != 1 {
		t.Errorf("got = %d pipeline connections, expected: 1 (pongs keep it)", n)
	}
	// Idle now: no pings.
	time.Sleep(3 * every)
	if n := f.Count(isPing); n != 3 {
		t.Errorf("got = %d pings, expected: 3 (none once idle)", n)
	}
}

// With no pong, a busy pipeline is given up after every+timeout: a CAS
// on it has an unknown outcome (the server read it), an idempotent Get
// is sent again on a new connection.
func TestPipelineWatchdogGivesUp(t *testing.T) {
	const every, timeout = 200 * time.Millisecond, 200 * time.Millisecond
	t.Run("CompareAndSwap", func(t *testing.T) {
		f := startFake(t, func(n int, c *fakeConn) {
			if c.Expect("a compare-and-swap", isCAS) != nil {
				c.Hold() // read the pings, answer nothing
			}
		})
		kv := newFakeClient(t, []string{f.Addr()}, client.WithPipelinePings(every, timeout)).KV()
		start := time.Now()
		_, err := kv.CompareAndSwap(testCtx(t), "k", client.Absent(), "v")
		if !errors.Is(err, client.ErrUnknownOutcome) {
			t.Fatalf("got = %v, expected: ErrUnknownOutcome", err)
		}
		if d := time.Since(start); d < every+timeout || d > 5*time.Second {
			t.Errorf("got = gave up after %v, expected: after %v, well within 5s", d, every+timeout)
		}
		if n := f.Count(isPing); n < 1 {
			t.Errorf("got = %d pings, expected: at least 1 before giving up", n)
		}
		if n, m := f.Count(isCAS), f.Upgrades(); n != 1 || m != 1 {
			t.Errorf("got = CAS seen %d times over %d upgrades, expected: once, 1", n, m)
		}
	})
	t.Run("Get", func(t *testing.T) {
		f := startFake(t, func(n int, c *fakeConn) {
			req := c.Expect("a get", isGet)
			if req == nil {
				return
			}
			if n > 0 {
				c.Send(getAnswer(req, "second", 4))
			}
			c.Hold()
		})
		kv := newFakeClient(t, []string{f.Addr()}, client.WithPipelinePings(every, timeout)).KV()
		got, err := kv.Get(testCtx(t), "k")
		if err != nil || got.Value != "second" {
			t.Fatalf("got = %+v, %v, expected: the second connection's answer", got, err)
		}
		if n, m := f.Count(isGet), f.Pipes(); n != 2 || m != 2 {
			t.Errorf("got = Get seen %d times over %d connections, expected: 2, 2", n, m)
		}
	})
}

// A pipeline idle for longer than every+timeout is not given up the
// moment a call arrives: silence counts from the call. (It used to count
// from the last frame, so a call answered just after the watchdog's next
// tick failed: a CAS with ErrUnknownOutcome.)
func TestPipelineWatchdogAfterIdle(t *testing.T) {
	const every, timeout = 300 * time.Millisecond, 300 * time.Millisecond
	f := startFake(t, func(n int, c *fakeConn) {
		req := c.Expect("a get", isGet)
		if req == nil {
			return
		}
		c.Send(getAnswer(req, "v", 1))
		if req = c.Expect("a compare-and-swap", isCAS); req == nil {
			return
		}
		// Longer than the watchdog's tick (every/2), shorter than every.
		if !c.Wait(every * 4 / 5) {
			return
		}
		c.Send(casAnswer(req, 2))
		c.Hold()
	})
	kv := newFakeClient(t, []string{f.Addr()}, client.WithPipelinePings(every, timeout)).KV()
	ctx := testCtx(t)
	if _, err := kv.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * (every + timeout))
	if _, err := kv.CompareAndSwap(ctx, "k", client.Absent(), "v"); err != nil {
		t.Fatalf("got = %v, expected: the CAS answered", err)
	}
	if n := f.Pipes(); n != 1 {
		t.Errorf("got = %d pipeline connections, expected: 1", n)
	}
}
