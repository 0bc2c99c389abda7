package nativeapi

import (
	"errors"
	"os"
	"time"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Idle upgraded connections. A hijacked connection is invisible to
// http.Server's timeouts, so without a bound of its own a caller could
// hold any number of them open at no cost. One is closed, with a GoAway
// naming the last request read, once it has had no operation in flight
// and neither read an operation nor answered one for
// Limits.PipelineIdleTimeout. The GoAway makes the close safe against a
// request already on its way: the client fails it as not sent and
// repeats it on a new connection, as after a server restart.
//
// Pings and cancels do not count as activity. The Go client pings only
// while it awaits an answer (client/pipeline.go watchdog), and while an
// operation is in flight the connection is never idle anyway; a ping on
// a connection with nothing in flight serves no client, and counting it
// would let anyone keep a connection, its goroutine and its buffers
// forever by pinging it — the very thing this bound is for.

// errPipeIdle ends a connection idle for PipelineIdleTimeout.
var errPipeIdle = errors.New("pipeline idle")

// touch marks activity: an operation read or answered.
func (pc *pipeConn) touch() { pc.lastActive.Store(time.Now().UnixNano()) }

// read notes req as activity unless it is a ping or a cancel.
func (pc *pipeConn) read(req *tenurev1.PipelineRequest) {
	switch req.GetOp().(type) {
	case *tenurev1.PipelineRequest_Ping, *tenurev1.PipelineRequest_Cancel:
	default:
		pc.touch()
	}
}

// answered notes resp as activity unless it is a pong.
func (pc *pipeConn) answered(resp *tenurev1.PipelineResponse) {
	if resp.GetPong() == nil {
		pc.touch()
	}
}

// awaitFrame returns once the next frame has begun to arrive, with a read
// deadline set that it must arrive whole by (a frame stalled that long
// ends the connection). While it waits for the frame to begin it returns
// errPipeIdle when the connection has been idle for the timeout. Only
// serve's goroutine calls it.
func (pc *pipeConn) awaitFrame(p *pipeline) error {
	idle := pc.a.limits.PipelineIdleTimeout
	if idle <= 0 {
		return nil
	}
	if pc.br.Buffered() > 0 {
		if time.Until(pc.deadline) > idle/2 {
			return nil // set recently enough: spare the busy path a timer update per frame
		}
		return pc.setDeadline(time.Now().Add(idle))
	}
	for {
		due := time.Unix(0, pc.lastActive.Load()).Add(idle)
		if err := pc.setDeadline(due); err != nil {
			return err
		}
		_, err := pc.br.Peek(1)
		if err == nil {
			return pc.setDeadline(time.Now().Add(idle))
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || pc.isStopping() {
			return err
		}
		switch {
		case p.inFlight() > 0:
			// Busy, however quiet: the clock starts when its last
			// operation is answered (answered touches).
			pc.touch()
		case time.Since(time.Unix(0, pc.lastActive.Load())) >= idle:
			return errPipeIdle
		}
	}
}

// setDeadline sets the read deadline, and fails if stop has begun: stop
// sets its own deadline to make the reader return, which this one may
// just have replaced.
func (pc *pipeConn) setDeadline(t time.Time) error {
	pc.deadline = t
	_ = pc.conn.SetReadDeadline(t)
	if pc.isStopping() {
		return ErrStopping
	}
	return nil
}

func (pc *pipeConn) isStopping() bool {
	select {
	case <-pc.stopping:
		return true
	default:
		return false
	}
}

// inFlight counts the operations running, waits included.
func (p *pipeline) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ops)
}
