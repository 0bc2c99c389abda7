package server

import (
	"sync"

	"github.com/tenurehq/tenure/statemachine"
)

// waitOutcome is how a parked Acquire ends: granted with a token, or the
// wait ended (session gone, cancelled) with a reason.
type waitOutcome struct {
	token  int64
	reason string
}

type waitKey struct {
	session int64
	lease   statemachine.LeaseID
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
	// for its turn; calls are the channels of those past their turn.
	// Both are guarded by waiters.mu.
	refs  int
	calls []chan waitOutcome
}

// waiters wakes parked Acquire calls. The state machine decides who is
// granted; this only routes the decision to the calls that wait for it,
// so a release wakes exactly one session's callers, not every waiter.
type waiters struct {
	mu     sync.Mutex // guards parked and every entry's refs and calls
	parked map[waitKey]*waitEntry
}

func newWaiters() *waiters {
	return &waiters{parked: map[waitKey]*waitEntry{}}
}

// park takes the key's turn and registers a call before its Acquire is
// proposed, so an outcome applied after the proposal cannot be missed,
// while outcomes of an older call's CancelWait (applied before the turn
// passed) never reach it. The caller proposes, calls endTurn, waits on
// the channel, and finally calls leave.
func (w *waiters) park(session int64, lease statemachine.LeaseID) (*waitEntry, chan waitOutcome) {
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
	ch := make(chan waitOutcome, 1)
	w.mu.Lock()
	e.calls = append(e.calls, ch)
	w.mu.Unlock()
	return e, ch
}

func (e *waitEntry) endTurn() { e.turn.Unlock() }

// leave unregisters a call. With cancel set it first asks, under the
// key's turn, whether any other call is parked or about to be; only when
// none is does cancel run (to propose CancelWait), so a grant or queue
// place another call is waiting for is never taken away.
func (w *waiters) leave(session int64, lease statemachine.LeaseID, e *waitEntry, ch chan waitOutcome, cancel func()) {
	k := waitKey{session, lease}
	if cancel != nil {
		e.turn.Lock()
		defer e.turn.Unlock()
		w.mu.Lock()
		last := e.refs == 1
		w.mu.Unlock()
		if last {
			cancel()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range e.calls {
		if c == ch {
			e.calls = append(e.calls[:i], e.calls[i+1:]...)
			break
		}
	}
	if e.refs--; e.refs == 0 && w.parked[k] == e {
		delete(w.parked, k)
	}
}

// observe runs on the apply path with each command's events; it never
// blocks (every channel has room for its one outcome).
func (w *waiters) observe(events []statemachine.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.parked) == 0 {
		return
	}
	for i := range events {
		e := &events[i]
		var out waitOutcome
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
		for _, ch := range entry.calls {
			select {
			case ch <- out:
			default:
			}
		}
	}
}
