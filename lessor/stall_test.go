package lessor_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tenurehq/tenure/lessor"
)

// Heartbeats are answered while the leader lease holds (Config.Leased)
// and refused while it does not, whether the node was stopped or not: a
// stop shorter than the election timeout can be deposed a leader as well
// as a longer one (internal/sim seed 100530), and after a longer one a
// leader whose quorum still follows it may answer at once.
func TestHeartbeatsAreTheLeasesToRefuse(t *testing.T) {
	const ttl, election = time.Hour, time.Second
	tests := []struct {
		name  string
		steps []time.Duration // advance, then heartbeat
		lease []bool          // whether the lease holds at that heartbeat
		want  []error
	}{
		{
			name:  "Under the lease, heartbeats are answered, a stop or not.",
			steps: []time.Duration{900 * time.Millisecond, 1500 * time.Millisecond, 100 * time.Millisecond},
			lease: []bool{true, true, true},
			want:  []error{nil, nil, nil},
		},
		{
			name:  "Without it they are refused, a stop or not, and answered again once it holds.",
			steps: []time.Duration{100 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond, 100 * time.Millisecond},
			lease: []bool{false, false, false, true},
			want:  []error{lessor.ErrNotLeader, lessor.ErrNotLeader, lessor.ErrNotLeader, nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			var held bool
			l := newLessor(t, &recorder{}, lessor.Config{Now: c.Now, Leased: func(time.Time) bool { return held }})
			l.Promote(1, sessions(ttl, 1), election)
			for i, step := range tt.steps {
				c.Advance(step)
				held = tt.lease[i]
				got, err := l.Heartbeat(1)
				if !errors.Is(err, tt.want[i]) || (err == nil && got != ttl) {
					t.Fatalf("heartbeat %d: got = %v, %v, expected: %v, %v", i, got, err, ttl, tt.want[i])
				}
			}
		})
	}
}
