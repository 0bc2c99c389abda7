package lessor_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/statemachine"
)

// driven is a lessor from NewDriven on a fake clock, with its wakes
// counted.
type driven struct {
	*lessor.Lessor
	c     *clock
	wakes int
}

func newDriven(t *testing.T, cfg lessor.Config) *driven {
	d := &driven{c: newClock()}
	cfg.Now = d.c.Now
	d.Lessor = lessor.NewDriven(cfg, func() { d.wakes++ })
	t.Cleanup(d.Stop)
	return d
}

// advance moves the clock by dt, pulsing every tenth of a second as a
// node that runs would.
func (d *driven) advance(dt time.Duration) {
	const step = 100 * time.Millisecond
	for ; dt > step; dt -= step {
		d.c.Advance(step)
		d.Pulse()
	}
	d.c.Advance(dt)
	d.Pulse()
}

// due calls Due and checks that it asks for sessions want (nil: nothing)
// and to be called again after wait.
func (d *driven) due(t *testing.T, epoch int64, want []int64, wait time.Duration) *lessor.Expiry {
	t.Helper()
	got, gotWait := d.Due()
	if gotWait != wait {
		t.Errorf("wait = %v, expected: %v", gotWait, wait)
	}
	if want == nil {
		if len(got) != 0 {
			t.Fatalf("due = %d expiries, expected: none", len(got))
		}
		return nil
	}
	if len(got) != 1 || got[0].Epoch != epoch || !slices.Equal(got[0].Sessions, want) {
		t.Fatalf("due = %+v, expected: one expiry of sessions %v at epoch %d", got, want, epoch)
	}
	return got[0]
}

// wakened checks that the lessor asked to be driven since the last check.
func (d *driven) wakened(t *testing.T, want bool) {
	t.Helper()
	if got := d.wakes > 0; got != want {
		t.Errorf("woken = %v, expected: %v", got, want)
	}
	d.wakes = 0
}

// A driven lessor follows the goroutine form's rules step by step, on
// its caller's calls alone: it says what is due and when to ask again,
// wakes its caller when that becomes sooner, and puts a failed expiry
// back for the retry interval, a postponed one for the postpone
// interval, and one of a term that ended nowhere.
func TestDrivenExpiry(t *testing.T) {
	const ttl, short, extra = time.Second, 200 * time.Millisecond, 500 * time.Millisecond
	const retry, postpone = 100 * time.Millisecond, time.Second
	d := newDriven(t, lessor.Config{RetryInterval: retry, PostponeInterval: postpone})

	d.due(t, 0, nil, -1) // not leader: nothing timed
	d.Promote(3, sessions(ttl, 1), extra)
	d.wakened(t, true)
	d.due(t, 3, nil, ttl+extra)

	d.Observe(opened(short, 2)) // now the earliest deadline
	d.wakened(t, true)
	d.due(t, 3, nil, short)

	d.advance(short)
	e := d.due(t, 3, []int64{2}, ttl+extra-short)
	if _, err := d.Heartbeat(2); !errors.Is(err, lessor.ErrSessionExpired) {
		t.Errorf("heartbeat while its expiry is proposed: err = %v, expected: %v", err, lessor.ErrSessionExpired)
	}
	d.Proposed(e, errors.New("injected failure"))
	d.wakened(t, true)
	d.due(t, 3, nil, retry)
	d.advance(retry)
	e = d.due(t, 3, []int64{2}, ttl+extra-short-retry)
	d.Proposed(e, nil)
	d.Observe([]statemachine.Event{{Type: statemachine.EventSessionExpired, SessionID: 2}})
	if _, ok := d.Remaining(2); ok {
		t.Errorf("Remaining(2) ok = true after its expiry applied, expected: false")
	}
	d.due(t, 3, nil, ttl+extra-short-retry)

	d.advance(ttl + extra - short - retry)
	e = d.due(t, 3, []int64{1}, -1)
	d.Proposed(e, lessor.ErrPostponed)
	d.due(t, 3, nil, postpone)

	d.advance(postpone)
	e = d.due(t, 3, []int64{1}, -1)
	d.wakes = 0
	d.Demote()
	d.wakened(t, true)
	d.Proposed(e, errors.New("context canceled"))
	d.Promote(4, statemachine.Deadlines{}, extra)
	d.due(t, 4, nil, -1) // the old term's expiry is not put back
}

// A driven lessor's pulse is its caller's: a gap of more than the
// election timeout between calls is a stop, and expiries wait twice the
// election timeout. Heartbeats are the lease's to refuse, not the
// pulse's.
func TestDrivenPulse(t *testing.T) {
	const ttl, election = time.Hour, time.Second
	d := newDriven(t, lessor.Config{})
	d.Promote(1, sessions(ttl, 1), election)
	d.advance(3 * election)
	if _, err := d.Heartbeat(1); err != nil {
		t.Fatalf("heartbeat with a steady pulse: err = %v, expected: nil", err)
	}
	d.c.Advance(election + time.Millisecond)
	d.Pulse()
	if _, err := d.Heartbeat(1); err != nil {
		t.Errorf("heartbeat after a stop, under the lease: err = %v, expected: nil", err)
	}
	d.due(t, 1, nil, 2*election)
	d.advance(2 * election)
	if _, err := d.Heartbeat(1); err != nil {
		t.Errorf("heartbeat twice the election timeout after the stop: err = %v, expected: nil", err)
	}
}
