package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// fakeProposer answers an Acquire as queued at revision queuedAt, after
// running during (which may deliver events, as the apply path would while
// the proposal is in flight).
type fakeProposer struct {
	queuedAt int64
	during   func()
	cancels  int
}

func (f *fakeProposer) propose(_ context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	switch cmd.(type) {
	case statemachine.Acquire:
		if f.during != nil {
			f.during()
		}
		return statemachine.Result{Revision: f.queuedAt, Queued: true}, nil
	case statemachine.CancelWait:
		f.cancels++
		return statemachine.Result{Revision: f.queuedAt + 100}, nil
	}
	return statemachine.Result{}, nil
}

func grantEvent(rev int64, session int64, lease statemachine.LeaseID) statemachine.Event {
	return statemachine.Event{Revision: rev, Type: statemachine.EventLeaseAcquired, SessionID: session, Lease: lease, Token: rev}
}

func TestParkedAcquireIgnoresOutcomesFromBeforeItsProposal(t *testing.T) {
	lease := statemachine.LeaseID{Namespace: "default", Name: "L"}
	cases := []struct {
		name   string
		before []statemachine.Event // applied while the Acquire is in flight, before its own entry
		after  []statemachine.Event // applied after its entry
		want   int64                // token the call returns; 0 = times out
	}{
		{
			name:   "a replayed grant of the same session is history, not an answer",
			before: []statemachine.Event{grantEvent(5, 1, lease)},
			want:   0,
		},
		{
			name:   "a replayed wait-ended is history too",
			before: []statemachine.Event{{Revision: 6, Type: statemachine.EventLeaseWaitEnded, SessionID: 1, Lease: lease, Reason: "session closed"}},
			want:   0,
		},
		{
			name:   "a grant after the proposal wakes the call even when history came first",
			before: []statemachine.Event{grantEvent(5, 1, lease)},
			after:  []statemachine.Event{grantEvent(12, 1, lease)},
			want:   12,
		},
		{
			name:  "another session's grant does not wake the call",
			after: []statemachine.Event{grantEvent(12, 2, lease)},
			want:  0,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var w *waiters
			fp := &fakeProposer{queuedAt: 10}
			fp.during = func() { w.observe(tc.before) }
			w = newWaiters(fp.propose, noQuota, func(float64) {}, slog.New(slog.DiscardHandler))
			type result struct {
				got acquired
				err error
			}
			done := make(chan result, 1)
			go func() {
				got, err := w.acquire(context.Background(), statemachine.Acquire{SessionID: 1, Lease: lease, Wait: true}, 200*time.Millisecond)
				done <- result{got, err}
			}()
			// Deliver the later events once the call is parked past its
			// proposal (its outcome slot exists and the proposal returned).
			for {
				w.mu.Lock()
				e := w.parked[waitKey{1, lease}]
				ready := e != nil && len(e.calls) == 1 && e.turn.TryLock()
				w.mu.Unlock()
				if ready {
					e.turn.Unlock()
					break
				}
				time.Sleep(time.Millisecond)
			}
			w.observe(tc.after)
			r := <-done
			if r.err != nil {
				t.Fatalf("got = %v, expected: no error", r.err)
			}
			if r.got.token != tc.want {
				t.Fatalf("got = token %d, expected: %d", r.got.token, tc.want)
			}
			if tc.want == 0 && fp.cancels != 1 {
				t.Fatalf("got = %d CancelWait proposals after the timeout, expected: 1", fp.cancels)
			}
			if len(w.parked) != 0 {
				t.Fatalf("got = %d parked keys left, expected: none", len(w.parked))
			}
		})
	}
}
