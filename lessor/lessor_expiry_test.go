package lessor_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/statemachine"
)

func TestKeyExpiry(t *testing.T) {
	const ttl = 150 * time.Millisecond
	put := func(rev int64, ttl time.Duration) []statemachine.Event {
		return []statemachine.Event{{Revision: rev, Type: statemachine.EventKeyPut,
			KV: &statemachine.KeyValue{Key: "k", ModRevision: rev, TTL: int64(ttl)}}}
	}
	tests := []struct {
		name    string
		observe [][]statemachine.Event
		want    []statemachine.KeyTTL // nil: nothing is proposed
	}{
		{
			name:    "A key with a TTL expires no sooner than its TTL, named by the revision of its put.",
			observe: [][]statemachine.Event{put(5, ttl)},
			want:    []statemachine.KeyTTL{{Key: "k", ModRevision: 5, TTL: int64(ttl)}},
		},
		{
			name:    "A newer put replaces the key's deadline and revision.",
			observe: [][]statemachine.Event{put(5, ttl/2), put(7, ttl)},
			want:    []statemachine.KeyTTL{{Key: "k", ModRevision: 7, TTL: int64(ttl)}},
		},
		{
			name:    "A put without a TTL stops the key from expiring.",
			observe: [][]statemachine.Event{put(5, ttl), put(6, 0)},
		},
		{
			name: "A deleted key is not expired.",
			observe: [][]statemachine.Event{put(5, ttl), {{Revision: 6, Type: statemachine.EventKeyDeleted,
				KV: &statemachine.KeyValue{Key: "k", ModRevision: 6}}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{}
				l := newLessor(t, r, lessor.Config{})
				l.Promote(1, statemachine.Deadlines{}, 0)
				var last time.Time
				for _, evs := range tt.observe {
					last = time.Now()
					l.Observe(evs)
				}
				if tt.want == nil {
					time.Sleep(quiet)
					if calls := r.snapshot(); len(calls) != 0 {
						t.Errorf("got = %v, expected: no proposal", calls[0].keys)
					}
					return
				}
				calls := waitCalls(t, r, 1, 3*time.Second)
				if got := calls[0].at.Sub(last); got < ttl {
					t.Errorf("expired %v after the put, expected: at least %v", got, ttl)
				}
				if got := calls[0].keys; !slices.Equal(got, tt.want) {
					t.Errorf("got = %v, expected: %v", got, tt.want)
				}
				time.Sleep(quiet)
				if got := len(r.snapshot()); got != 1 {
					t.Errorf("calls = %d, expected: 1", got)
				}
			})
		})
	}
}

func TestLockDelayEnd(t *testing.T) {
	const delay = 150 * time.Millisecond
	lease := statemachine.LeaseID{Namespace: "ns", Name: "db"}
	expired := func(delay time.Duration) []statemachine.Event {
		return []statemachine.Event{{Revision: 9, Type: statemachine.EventLeaseExpired, Lease: lease,
			SessionID: 1, Token: 8, LockDelay: int64(delay)}}
	}
	tests := []struct {
		name    string
		observe [][]statemachine.Event
		want    []statemachine.LockDelay // nil: nothing is proposed
	}{
		{
			name:    "A lock-delay ends no sooner than its delay, named by the revision of the expiry.",
			observe: [][]statemachine.Event{expired(delay)},
			want:    []statemachine.LockDelay{{Lease: lease, Revision: 9, Delay: int64(delay)}},
		},
		{
			name:    "An expiry without a lock-delay times nothing.",
			observe: [][]statemachine.Event{expired(0)},
		},
		{
			name: "A lock-delay already ended is not ended again.",
			observe: [][]statemachine.Event{expired(delay),
				{{Revision: 10, Type: statemachine.EventLockDelayEnded, Lease: lease}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkTimed(t, tt.observe, delay, quiet, func(c call) []statemachine.LockDelay { return c.delays }, tt.want)
		})
	}
}

// checkTimed observes each batch of events on a new leader and checks
// that the one proposal it makes, as got reads it, is want, and comes no
// sooner than after; with want nil, that nothing is proposed for
// quietFor.
func checkTimed[W comparable](t *testing.T, observe [][]statemachine.Event, after, quietFor time.Duration, got func(call) []W, want []W) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		l := newLessor(t, r, lessor.Config{})
		l.Promote(1, statemachine.Deadlines{}, 0)
		begin := time.Now()
		for _, evs := range observe {
			l.Observe(evs)
		}
		if want == nil {
			time.Sleep(quietFor)
			if calls := r.snapshot(); len(calls) != 0 {
				t.Errorf("got = %v, expected: no proposal", got(calls[0]))
			}
			return
		}
		calls := waitCalls(t, r, 1, 3*time.Second)
		if d := calls[0].at.Sub(begin); d < after {
			t.Errorf("proposed %v after the event, expected: at least %v", d, after)
		}
		if g := got(calls[0]); !slices.Equal(g, want) {
			t.Errorf("got = %v, expected: %v", g, want)
		}
	})
}

func TestIdleLeaseCollection(t *testing.T) {
	const gcAfter = 200 * time.Millisecond
	lease := statemachine.LeaseID{Namespace: "ns", Name: "node-1"}
	released := func(rev int64, gc time.Duration) []statemachine.Event {
		return []statemachine.Event{{Revision: rev, Type: statemachine.EventLeaseReleased, Lease: lease, GCAfter: int64(gc)}}
	}
	tests := []struct {
		name    string
		observe [][]statemachine.Event
		want    []statemachine.IdleLease // nil: nothing is proposed
	}{
		{
			name:    "An idle lease is collected no sooner than its gc_after, named by the revision that left it idle.",
			observe: [][]statemachine.Event{released(9, gcAfter)},
			want:    []statemachine.IdleLease{{Lease: lease, Revision: 9}},
		},
		{
			name: "A lease whose holder expired, with no lock-delay, is collected too.",
			observe: [][]statemachine.Event{{{Revision: 9, Type: statemachine.EventLeaseExpired, Lease: lease,
				SessionID: 1, Token: 8, GCAfter: int64(gcAfter)}}},
			want: []statemachine.IdleLease{{Lease: lease, Revision: 9}},
		},
		{
			name: "A revoked lease, with no lock-delay, is collected too.",
			observe: [][]statemachine.Event{{{Revision: 9, Type: statemachine.EventLeaseRevoked, Lease: lease,
				Token: 8, GCAfter: int64(gcAfter)}}},
			want: []statemachine.IdleLease{{Lease: lease, Revision: 9}},
		},
		{
			name:    "A lease left idle without gc_after is kept.",
			observe: [][]statemachine.Event{released(9, 0)},
		},
		{
			name: "A lease busy again is not collected.",
			observe: [][]statemachine.Event{released(9, gcAfter),
				{{Revision: 10, Type: statemachine.EventLeaseAcquired, Lease: lease}}},
		},
		{
			name:    "A later idle event restarts the timing at its own revision.",
			observe: [][]statemachine.Event{released(9, gcAfter), released(12, gcAfter)},
			want:    []statemachine.IdleLease{{Lease: lease, Revision: 12}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkTimed(t, tt.observe, gcAfter, 2*gcAfter, func(c call) []statemachine.IdleLease { return c.idle }, tt.want)
		})
	}

	t.Run("A new leader dates a collection from the logged idle time, not from its promotion.", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &recorder{}
			l := newLessor(t, r, lessor.Config{})
			begin := time.Now()
			idleSince := begin.Add(-gcAfter / 2).UnixNano()
			l.Promote(1, statemachine.Deadlines{Idle: []statemachine.IdleLease{
				{Lease: lease, Revision: 4, GCAfter: int64(gcAfter), IdleSince: idleSince},
			}}, time.Second)
			calls := waitCalls(t, r, 1, 3*time.Second)
			if got := calls[0].at.Sub(begin); got != gcAfter/2 {
				t.Errorf("collected %v after promotion, expected: the %v left of its gc_after", got, gcAfter/2)
			}
		})
	})

	t.Run("A postponed collection is asked for again after the postpone interval, and not counted as failed.", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &recorder{fail: 1, err: fmt.Errorf("cluster version 1: %w", lessor.ErrPostponed)}
			reg := prometheus.NewRegistry()
			l := newLessor(t, r, lessor.Config{PostponeInterval: time.Second, Registerer: reg})
			l.Promote(1, statemachine.Deadlines{}, 0)
			l.Observe(released(9, gcAfter))
			calls := waitCalls(t, r, 2, 5*time.Second)
			if got := calls[1].at.Sub(calls[0].at); got != time.Second {
				t.Errorf("asked again after %v, expected: the postpone interval %v", got, time.Second)
			}
			got := gather(t, reg)
			if n := got["tenure_lessor_expiries_failed_total{kind=lease_gc}"]; n != 0 {
				t.Errorf("failed collections: got = %v, expected: 0", n)
			}
			if n := got["tenure_lessor_expiries_proposed_total{kind=lease_gc}"]; n != 2 {
				t.Errorf("proposed collections: got = %v, expected: 2", n)
			}
		})
	})
}

func TestManySessionsExpireInFewProposals(t *testing.T) {
	const n, ttl = 2500, 100 * time.Millisecond
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	tests := []struct {
		name  string
		start func(l *lessor.Lessor)
	}{
		{
			name:  "Sessions known at promotion expire in batches of at most a thousand.",
			start: func(l *lessor.Lessor) { l.Promote(1, sessions(ttl, ids...), 0) },
		},
		{
			name: "Sessions opened by one command expire together.",
			start: func(l *lessor.Lessor) {
				l.Promote(1, statemachine.Deadlines{}, 0)
				l.Observe(opened(ttl, ids...))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{}
				l := newLessor(t, r, lessor.Config{})
				tt.start(l)

				deadline := time.Now().Add(5 * time.Second)
				var got []int64
				var calls []call
				for len(got) < n && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
					calls, got = r.snapshot(), nil
					for _, c := range calls {
						got = append(got, c.ids...)
					}
				}
				slices.Sort(got)
				if !slices.Equal(got, ids) {
					t.Fatalf("expired ids = %d (with any repeats), expected: each of %d once", len(got), n)
				}
				if len(calls) > 5 {
					t.Errorf("proposals = %d, expected: at most 5", len(calls))
				}
				for i, c := range calls {
					if len(c.ids) > 1000 {
						t.Errorf("proposal %d has %d ids, expected: at most 1000", i, len(c.ids))
					}
				}
			})
		})
	}
}

func TestStop(t *testing.T) {
	tests := []struct {
		name  string
		block bool
	}{
		{name: "Stop may be called twice."},
		{name: "Stop cancels a proposal in flight and returns.", block: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{block: tt.block}
				l := lessor.New(lessor.Config{Proposer: r.proposer()})
				l.Promote(1, sessions(50*time.Millisecond, 1), 0)
				if tt.block {
					waitCalls(t, r, 1, 3*time.Second)
				}
				l.Stop()
				l.Stop()
				if _, err := l.Heartbeat(1); !errors.Is(err, lessor.ErrNotLeader) {
					t.Errorf("Heartbeat err = %v, expected: %v", err, lessor.ErrNotLeader)
				}
				l.Promote(2, sessions(time.Hour, 1), 0)
				if _, ok := l.Remaining(1); ok {
					t.Errorf("Remaining after Promote on a stopped lessor ok = true, expected: false")
				}
			})
		})
	}
}

func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		r := &recorder{}
		l := newLessor(t, r, lessor.Config{Registerer: reg})
		l.Promote(1, sessions(time.Hour, 1, 2, 3), 0)
		l.Observe(opened(100*time.Millisecond, 4))
		for range 5 {
			if _, err := l.Heartbeat(1); err != nil {
				t.Fatalf("Heartbeat err = %v, expected: nil", err)
			}
		}
		// Session 4 expires; the others are renewed or have an hour left.
		want := map[string]float64{
			"tenure_lessor_sessions":                              3,
			"tenure_lessor_heartbeats_total":                      5,
			`tenure_lessor_expiries_proposed_total{kind=session}`: 1,
		}
		var got map[string]float64
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got = gather(t, reg)
			if matches(got, want) {
				return
			}
		}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("%s = %v, expected: %v", name, got[name], w)
			}
		}
	})
}
