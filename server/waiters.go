package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// waitCancelledReason is the state machine's reason on a cancelled wait.
const waitCancelledReason = "wait cancelled"

// waitOutcome is how the state machine ended a parked Acquire: granted
// with a token, or the wait ended (session gone, cancelled) with a
// reason. revision is the event's, so a call can tell an outcome caused
// by its own proposal from an older one.
type waitOutcome struct {
	revision int64
	token    int64
	reason   string
}

type waitKey struct {
	session int64
	lease   statemachine.LeaseID
}

// parkedCall is one Acquire call waiting for its outcome. observe keeps
// the newest outcome and signals ready; the call checks it against the
// revision its own proposal was applied at.
type parkedCall struct {
	ready  chan struct{} // one pending signal; observe never blocks
	latest waitOutcome   // guarded by waiters.mu
}

// waitEntry is every Acquire call parked for one session and lease. A
// client that lost its connection retries with a new call while the old
// one is still being torn down; both share the session's one grant or
// place in the queue.
type waitEntry struct {
	// turn serializes the proposals of calls for this key, so that "am I
	// the last call?" and the CancelWait that follows are atomic with
	// respect to a new call's Acquire.
	turn sync.Mutex
	// refs counts calls from park to leave, including one still waiting
	// for its turn; calls are those past their turn. Both are guarded by
	// waiters.mu.
	refs  int
	calls []*parkedCall
}

// proposeFunc applies a command and returns its result, with the
// command's own error as the error (Server.propose).
type proposeFunc func(context.Context, statemachine.Command) (statemachine.Result, error)

// waiters runs waiting Acquire calls and wakes them. The state machine
// decides who is granted; this only routes the decision to the calls
// that wait for it, so a release wakes exactly one session's callers, not
// every waiter.
//
// A call is woken only by an outcome applied after its own Acquire: the
// apply path also carries entries replayed from the log after a restart
// and grants of calls that gave up, and a grant from history must never
// be handed out as new (it would carry a released token).
type waiters struct {
	propose proposeFunc
	// hold takes one of the caller's parked-wait slots (Server.holdWait)
	// before a waiting Acquire parks; release gives it back.
	hold   func(ctx context.Context) (release func(), err error)
	onWait func(delta float64) // counts calls parked past their proposal
	log    *slog.Logger

	mu     sync.Mutex // guards parked, ended and every entry's refs and calls
	parked map[waitKey]*waitEntry
	// ended is closed by endWaits, with the error parked calls return,
	// and replaced for the calls that park after it.
	ended *waitsEnded
}

type waitsEnded struct {
	c   chan struct{}
	err error
}

func newWaiters(propose proposeFunc, hold func(context.Context) (func(), error), onWait func(delta float64), log *slog.Logger) *waiters {
	return &waiters{propose: propose, hold: hold, onWait: onWait, log: log, parked: map[waitKey]*waitEntry{}, ended: &waitsEnded{c: make(chan struct{})}}
}

// endWaits makes every parked call return err at once, leaving its
// session's place in the queue as it is: leadership moved, or the node
// is closing, and only a leader can grant. The caller retries on the new
// leader, where the Acquire finds its place (Acquire is idempotent per
// session and lease) and parks again.
func (w *waiters) endWaits(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended.err = err
	close(w.ended.c)
	w.ended = &waitsEnded{c: make(chan struct{})}
}

// acquired is a waiting Acquire's answer: granted with token (lease is
// the lease after the grant when the command returned it), or not
// granted before the wait timed out (token 0).
type acquired struct {
	token int64
	lease *statemachine.Lease
}

// acquire proposes cmd and returns its answer. An Acquire that does not
// wait is answered at once: granted, or not (token 0) when the lease is
// full. A waiting one returns once this session is granted, timeout
// (when positive) passes, or ctx ends. It parks the
// call before proposing, so that a grant applied right after the
// proposal cannot be missed, and ignores outcomes applied before it.
// It holds one of the caller's parked-wait slots from before it parks
// until it returns, and is refused (resource_exhausted) without one.
//
// A call that times out still takes a grant that raced the timeout: its
// caller is there to use it. A call whose ctx ends gives back a grant
// that raced it (nobody could release it) and leaves the queue — but only
// when no other call of the same session waits for the same lease.
func (w *waiters) acquire(ctx context.Context, cmd statemachine.Acquire, timeout time.Duration) (acquired, error) {
	if !cmd.Wait {
		res, err := w.propose(ctx, cmd)
		switch {
		case errors.Is(err, statemachine.ErrLocked):
			return acquired{}, nil
		case err != nil:
			return acquired{}, err
		}
		return acquired{token: res.Grant.Token, lease: res.Lease}, nil
	}
	release, err := w.hold(ctx)
	if err != nil {
		return acquired{}, err
	}
	defer release()
	entry, call, ended := w.park(cmd.SessionID, cmd.Lease)
	res, err := w.propose(ctx, cmd)
	entry.turn.Unlock()
	if err != nil && ctx.Err() != nil {
		// The caller went away while its Acquire was in the log: the
		// entry may still apply and queue, or grant, a session that no
		// call waits for. Cancel the wait as a cancelled wait would.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, cerr := w.cancel(cctx, cmd, entry, call, true); cerr != nil {
			w.log.Warn("cancel abandoned wait", "session", cmd.SessionID, "lease", cmd.Lease.String(), "err", cerr)
		}
		return acquired{}, err
	}
	if err != nil || res.Grant != nil {
		w.leave(cmd.SessionID, cmd.Lease, entry, call)
		if err != nil {
			return acquired{}, err
		}
		return acquired{token: res.Grant.Token, lease: res.Lease}, nil
	}
	after := res.Revision

	var expired <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		expired = timer.C
	}
	w.onWait(1)
	defer w.onWait(-1)
	for {
		select {
		case <-call.ready:
			out := w.outcome(call)
			if out.revision <= after {
				continue // from before this call's Acquire: history
			}
			w.leave(cmd.SessionID, cmd.Lease, entry, call)
			if out.token != 0 {
				return acquired{token: out.token}, nil
			}
			if out.reason == waitCancelledReason {
				// Cannot happen while calls take turns, but if it did, the
				// session is alive: let the client retry, not give up.
				return acquired{}, fmt.Errorf("%w: the wait of session %d for %s was cancelled; retry", nativeapi.ErrWaitCancelled, cmd.SessionID, cmd.Lease)
			}
			return acquired{}, fmt.Errorf("%w: session %d stopped waiting for %s: %s", statemachine.ErrSessionNotFound, cmd.SessionID, cmd.Lease, out.reason)
		case <-ended.c:
			w.leave(cmd.SessionID, cmd.Lease, entry, call)
			return acquired{}, ended.err
		case <-expired:
			return w.cancel(ctx, cmd, entry, call, false)
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := w.cancel(cctx, cmd, entry, call, true); err != nil {
				w.log.Warn("cancel abandoned wait", "session", cmd.SessionID, "lease", cmd.Lease.String(), "err", err)
			}
			return acquired{}, ctx.Err()
		}
	}
}

// cancel ends a call's wait. When it is the last call of its session for
// the lease, it proposes CancelWait: the session leaves the queue, and a
// grant that raced the end of the wait is kept (releaseIfHeld false) or
// given back. A grant kept is returned.
func (w *waiters) cancel(ctx context.Context, cmd statemachine.Acquire, e *waitEntry, call *parkedCall, releaseIfHeld bool) (acquired, error) {
	e.turn.Lock()
	w.mu.Lock()
	last := e.refs == 1
	w.mu.Unlock()
	var res statemachine.Result
	var err error
	if last {
		res, err = w.propose(ctx, statemachine.CancelWait{SessionID: cmd.SessionID, Lease: cmd.Lease, ReleaseIfHeld: releaseIfHeld})
	}
	e.turn.Unlock()
	w.leave(cmd.SessionID, cmd.Lease, e, call)
	switch {
	case errors.Is(err, statemachine.ErrNotWaiting), errors.Is(err, statemachine.ErrSessionNotFound):
		return acquired{}, nil
	case err != nil:
		return acquired{}, err
	case res.Grant != nil && !releaseIfHeld:
		return acquired{token: res.Grant.Token, lease: res.Lease}, nil
	}
	return acquired{}, nil
}

// park registers a call and takes the key's turn before its Acquire is
// proposed, so an outcome applied after the proposal cannot be missed,
// while outcomes of an older call's CancelWait (applied before the turn
// passed) never reach it. The caller proposes, unlocks the turn, and
// finally calls leave.
func (w *waiters) park(session int64, lease statemachine.LeaseID) (*waitEntry, *parkedCall, *waitsEnded) {
	k := waitKey{session, lease}
	w.mu.Lock()
	e, ok := w.parked[k]
	if !ok {
		e = &waitEntry{}
		w.parked[k] = e
	}
	e.refs++
	w.mu.Unlock()

	e.turn.Lock()
	call := &parkedCall{ready: make(chan struct{}, 1)}
	w.mu.Lock()
	e.calls = append(e.calls, call)
	ended := w.ended
	w.mu.Unlock()
	return e, call, ended
}

// leave unregisters a call.
func (w *waiters) leave(session int64, lease statemachine.LeaseID, e *waitEntry, call *parkedCall) {
	k := waitKey{session, lease}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range e.calls {
		if c == call {
			e.calls = append(e.calls[:i], e.calls[i+1:]...)
			break
		}
	}
	if e.refs--; e.refs == 0 && w.parked[k] == e {
		delete(w.parked, k)
	}
}

func (w *waiters) outcome(call *parkedCall) waitOutcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	return call.latest
}

// observe runs on the apply path with each command's events; it never
// blocks. A call keeps only the newest outcome: events arrive in revision
// order, so anything it replaces is older still.
func (w *waiters) observe(events []statemachine.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.parked) == 0 {
		return
	}
	for i := range events {
		e := &events[i]
		out := waitOutcome{revision: e.Revision}
		switch e.Type {
		case statemachine.EventLeaseAcquired:
			out.token = e.Token
		case statemachine.EventLeaseWaitEnded:
			out.reason = e.Reason
		default:
			continue
		}
		entry, ok := w.parked[waitKey{e.SessionID, e.Lease}]
		if !ok {
			continue
		}
		for _, call := range entry.calls {
			call.latest = out
			select {
			case call.ready <- struct{}{}:
			default:
			}
		}
	}
}
