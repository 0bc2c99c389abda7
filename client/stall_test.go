package client_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/client"
)

// These tests play a leader that stalls (SIGSTOP, a GC pause, a VM
// stall): it keeps its connections and answers nothing, or answers only
// the pipeline's pings, while another endpoint serves.

func isRefresh(r *tenurev1.PipelineRequest) bool { return r.GetRefresh() != nil }

// stall reads and records every frame until the connection ends,
// answering only pings when pongs is true, and nothing otherwise.
func (c *fakeConn) stall(pongs bool) {
	for {
		frame, err := c.r.Next()
		if err != nil {
			return
		}
		req := &tenurev1.PipelineRequest{}
		if proto.Unmarshal(frame, req) != nil {
			continue
		}
		c.f.mu.Lock()
		c.f.frames = append(c.f.frames, fakeFrame{conn: c.n, req: req})
		c.f.mu.Unlock()
		if pongs && isPing(req) {
			c.Send(pong(req))
		}
	}
}

// refreshLog records when a fake read each heartbeat.
type refreshLog struct {
	mu   sync.Mutex
	read []time.Time
}

func (l *refreshLog) add() { l.mu.Lock(); l.read = append(l.read, time.Now()); l.mu.Unlock() }

func (l *refreshLog) snapshot() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.read...)
}

// serveRefreshes answers every heartbeat and ping, recording when each
// heartbeat was read, until the connection ends.
func (c *fakeConn) serveRefreshes(log *refreshLog) {
	for {
		frame, err := c.r.Next()
		if err != nil {
			return
		}
		req := &tenurev1.PipelineRequest{}
		if proto.Unmarshal(frame, req) != nil {
			continue
		}
		switch {
		case isRefresh(req):
			log.add()
			c.Send(&tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Refresh{
				Refresh: &tenurev1.KeepAliveResponse{SessionId: req.GetRefresh().GetSessionId()},
			}})
		case isPing(req):
			c.Send(pong(req))
		}
	}
}

// A heartbeat the leader leaves unanswered for an interval goes again
// through the next endpoint, and the session lives on. The stalled
// leader answers pings, so only the heartbeat's own patience can find
// it. Validity still comes only from acknowledged sends: it never
// reaches past the moment the serving endpoint read a heartbeat plus
// the window. (The heartbeat used to wait on the first endpoint for the
// whole validity window, and the session was lost.)
func TestHeartbeatUnansweredIsSentThroughAnotherEndpoint(t *testing.T) {
	const ttl, interval = time.Second, 200 * time.Millisecond
	const window = ttl * 3 / 4
	stalled := startFake(t, func(n int, c *fakeConn) { c.stall(true) })
	stalled.mountSessions()
	var served refreshLog
	next := startFake(t, func(n int, c *fakeConn) { c.serveRefreshes(&served) })
	next.mountSessions()
	cl := newFakeClient(t, []string{stalled.Addr(), next.Addr()})
	ctx := testCtx(t)
	s, err := cl.NewSession(ctx, client.WithTTL(ttl), client.WithHeartbeatInterval(interval))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)

	// Several windows' worth of heartbeats, all through the second
	// endpoint once the first left one unanswered.
	waitFor(t, "heartbeats through the second endpoint", func() bool {
		return len(served.snapshot()) >= int(3*window/interval) || s.Err() != nil
	})
	if err := s.Err(); err != nil {
		t.Fatalf("got = session lost (%v), expected: alive", err)
	}
	if n := stalled.Count(isRefresh); n != 1 {
		t.Errorf("got = %d heartbeats sent to the stalled endpoint, expected: 1 (then the next endpoint)", n)
	}
	read := served.snapshot()
	if until, limit := s.ValidUntil(), read[len(read)-1].Add(window); until.After(limit) {
		t.Errorf("got = valid until %v after the last heartbeat was read, expected: at most the window, %v", until.Sub(read[len(read)-1]), window)
	}
	select {
	case <-s.Lost():
		t.Errorf("got = Lost fired (%v), expected: not", s.Err())
	default:
	}
}

// When no endpoint answers, the retries change nothing about validity:
// it ends a window after the open request was sent, and Lost fires then,
// though the heartbeats were sent through both endpoints.
func TestHeartbeatRetriesNeverExtendValidity(t *testing.T) {
	const ttl, interval = time.Second, 200 * time.Millisecond
	a := startFake(t, func(n int, c *fakeConn) { c.stall(true) })
	a.mountSessions()
	b := startFake(t, func(n int, c *fakeConn) { c.stall(false) })
	b.mountSessions()
	cl := newFakeClient(t, []string{a.Addr(), b.Addr()})
	ctx := testCtx(t)
	s, err := cl.NewSession(ctx, client.WithTTL(ttl), client.WithHeartbeatInterval(interval))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	initial := s.ValidUntil()
	if limit := time.Now().Add(ttl * 3 / 4); initial.After(limit) {
		t.Fatalf("got = valid until %v from now, expected: at most %v after the open was sent", time.Until(initial), ttl*3/4)
	}
	var lostAt time.Time
	select {
	case <-s.Lost():
		lostAt = time.Now()
	case <-ctx.Done():
		t.Fatal("got = session never lost, expected: lost when the window closed")
	}
	if !errors.Is(s.Err(), client.ErrSessionExpired) {
		t.Errorf("got = Err %v, expected: ErrSessionExpired", s.Err())
	}
	if got := s.ValidUntil(); !got.Equal(initial) {
		t.Errorf("got = valid until moved by %v, expected: unchanged, nothing was acknowledged", got.Sub(initial))
	}
	if lostAt.Before(initial) {
		t.Errorf("got = lost %v before the window closed, expected: not before", initial.Sub(lostAt))
	}
	if na, nb := a.Count(isRefresh), b.Count(isRefresh); na < 1 || nb < 1 {
		t.Errorf("got = heartbeats sent %d and %d times to the two endpoints, expected: at least once to each", na, nb)
	}
}

// A client with a session pings its pipelines on the session's scale,
// not every 5s: a frozen connection (no answers, no pongs) carrying a
// compare-and-swap is given up within the session's validity window,
// the CAS fails as it would on a broken connection (ErrUnknownOutcome:
// the server read it), and the answer the frozen server sends when it
// wakes is delivered to no one.
func TestPipelinePingsScaleWithTheShortestTTL(t *testing.T) {
	const ttl = 4 * time.Second // pings after 500ms of silence, given up 500ms later
	const window = ttl * 3 / 4
	woke := make(chan struct{})
	f := startFake(t, func(n int, c *fakeConn) {
		if n > 0 {
			var served refreshLog
			c.serveRefreshes(&served)
			return
		}
		// Frozen: read everything, answer nothing, and answer the CAS
		// once the client has given the connection up.
		var cas *tenurev1.PipelineRequest
		for {
			frame, err := c.r.Next()
			if err != nil {
				break
			}
			req := &tenurev1.PipelineRequest{}
			if proto.Unmarshal(frame, req) == nil {
				c.f.mu.Lock()
				c.f.frames = append(c.f.frames, fakeFrame{conn: c.n, req: req})
				c.f.mu.Unlock()
				if isCAS(req) {
					cas = req
				}
			}
		}
		if cas != nil {
			c.Send(casAnswer(cas, 7))
		}
		close(woke)
	})
	f.mountSessions()
	cl := newFakeClient(t, []string{f.Addr()})
	ctx := testCtx(t)
	s, err := cl.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	start := time.Now()
	_, err = cl.KV().CompareAndSwap(ctx, "k", client.Absent(), "v")
	if !errors.Is(err, client.ErrUnknownOutcome) {
		t.Fatalf("got = %v, expected: ErrUnknownOutcome from the abandoned connection", err)
	}
	if d := time.Since(start); d > window {
		t.Errorf("got = frozen connection given up after %v, expected: within the validity window, %v", d, window)
	}
	if n := f.Count(isPing); n < 1 {
		t.Errorf("got = %d pings, expected: at least 1 before giving up", n)
	}
	select {
	case <-woke:
	case <-ctx.Done():
		t.Fatal("got = the frozen connection still open, expected: closed by the client")
	}
	if n := f.Count(isCAS); n != 1 {
		t.Errorf("got = CAS sent %d times, expected: once", n)
	}
}
