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

// waiters wakes parked Acquire calls. The state machine decides who is
// granted; this only routes the decision to the one call that waits for
// it, so a release wakes exactly one caller, not every waiter.
type waiters struct {
	mu     sync.Mutex // guards parked
	parked map[waitKey][]chan waitOutcome
}

func newWaiters() *waiters {
	return &waiters{parked: map[waitKey][]chan waitOutcome{}}
}

// park registers interest before the Acquire is proposed, so an outcome
// applied right after the proposal cannot be missed. The caller must call
// unpark when done waiting.
func (w *waiters) park(session int64, lease statemachine.LeaseID) chan waitOutcome {
	ch := make(chan waitOutcome, 1)
	k := waitKey{session, lease}
	w.mu.Lock()
	w.parked[k] = append(w.parked[k], ch)
	w.mu.Unlock()
	return ch
}

func (w *waiters) unpark(session int64, lease statemachine.LeaseID, ch chan waitOutcome) {
	k := waitKey{session, lease}
	w.mu.Lock()
	defer w.mu.Unlock()
	list := w.parked[k]
	for i, c := range list {
		if c == ch {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.parked, k)
	} else {
		w.parked[k] = list
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
		k := waitKey{e.SessionID, e.Lease}
		for _, ch := range w.parked[k] {
			select {
			case ch <- out:
			default:
			}
		}
		delete(w.parked, k)
	}
}
