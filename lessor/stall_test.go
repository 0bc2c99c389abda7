package lessor_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tenurehq/tenure/lessor"
)

// A leader that did not run for longer than its election timeout refuses
// heartbeats for twice that from when it runs again: raft may have
// elected another meanwhile, and only raft can say. Shorter gaps change
// nothing. The clock here moves only by Advance, so a jump of the clock
// is a stop of the node as the lessor sees it.
func TestHeartbeatsAfterAStop(t *testing.T) {
	const ttl, election = time.Hour, time.Second
	tests := []struct {
		name  string
		steps []time.Duration // advance, then heartbeat
		want  []error
	}{
		{
			name:  "Gaps shorter than the election timeout are not a stop.",
			steps: []time.Duration{900 * time.Millisecond, 900 * time.Millisecond, 900 * time.Millisecond},
			want:  []error{nil, nil, nil},
		},
		{
			name: "After a stop, heartbeats are refused for twice the election timeout, then answered.",
			steps: []time.Duration{
				1500 * time.Millisecond,                        // the stop
				500 * time.Millisecond, 500 * time.Millisecond, // 1 s after it
				900 * time.Millisecond, // 1.9 s after it
				200 * time.Millisecond, // 2.1 s after it
			},
			want: []error{lessor.ErrNotLeader, lessor.ErrNotLeader, lessor.ErrNotLeader, lessor.ErrNotLeader, nil},
		},
		{
			name:  "A promotion after a stop answers at once: its barrier proved a quorum follows.",
			steps: []time.Duration{1500 * time.Millisecond, -1},
			want:  []error{lessor.ErrNotLeader, nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			l := newLessor(t, &recorder{}, lessor.Config{Now: c.Now})
			l.Promote(1, sessions(ttl, 1), election)
			for i, step := range tt.steps {
				if step < 0 {
					l.Demote()
					l.Promote(2, sessions(ttl, 1), election)
				} else {
					c.Advance(step)
				}
				got, err := l.Heartbeat(1)
				if !errors.Is(err, tt.want[i]) || (err == nil && got != ttl) {
					t.Fatalf("heartbeat %d: got = %v, %v, expected: %v, %v", i, got, err, ttl, tt.want[i])
				}
			}
		})
	}
}
