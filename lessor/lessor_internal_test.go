package lessor

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

type nopProposer struct{}

func (nopProposer) Propose(context.Context, statemachine.Command) error { return nil }

func TestStaleItemsAreCompacted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const opened, closed = 5000, 4900
		l := New(Config{Proposer: nopProposer{}})
		defer l.Stop()
		l.Promote(1, statemachine.Deadlines{}, 0)

		evs := make([]statemachine.Event, 0, opened+closed)
		for id := int64(1); id <= opened; id++ {
			evs = append(evs, statemachine.Event{Type: statemachine.EventSessionOpened,
				Session: &statemachine.Session{ID: id, TTL: int64(time.Hour)}})
		}
		for id := int64(1); id <= closed; id++ {
			evs = append(evs, statemachine.Event{Type: statemachine.EventSessionClosed, SessionID: id})
		}
		l.Observe(evs)

		// Closed sessions' items would otherwise sit on the heap for an
		// hour. Once the loop is idle again, it has compacted.
		synctest.Wait()
		l.mu.Lock()
		n := len(l.heap)
		l.mu.Unlock()
		if n != opened-closed {
			t.Errorf("heap items = %d, expected: %d", n, opened-closed)
		}
	})
}
