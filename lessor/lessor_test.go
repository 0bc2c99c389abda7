package lessor_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/statemachine"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Proposer is a lessor.Proposer whose methods call its function fields.
type Proposer struct {
	ExpireSessionsFn func(ctx context.Context, epoch int64, ids []int64) error
	ExpireKeysFn     func(ctx context.Context, epoch int64, keys []statemachine.KeyTTL) error
	EndLockDelaysFn  func(ctx context.Context, epoch int64, delays []statemachine.LockDelay) error
	CollectLeasesFn  func(ctx context.Context, epoch int64, leases []statemachine.IdleLease) error
}

var _ lessor.Proposer = (*Proposer)(nil)

func (p *Proposer) Propose(ctx context.Context, cmd statemachine.Command) error {
	switch c := cmd.(type) {
	case statemachine.ExpireSessions:
		return p.ExpireSessionsFn(ctx, c.Epoch, c.IDs)
	case statemachine.ExpireKeys:
		return p.ExpireKeysFn(ctx, c.Epoch, c.Keys)
	case statemachine.EndLockDelays:
		return p.EndLockDelaysFn(ctx, c.Epoch, c.Delays)
	case statemachine.CollectLeases:
		return p.CollectLeasesFn(ctx, c.Epoch, c.Leases)
	}
	return fmt.Errorf("not an expiry: %T", cmd)
}

// call is one proposal as the recorder saw it.
type call struct {
	at     time.Time
	kind   string
	epoch  int64
	ids    []int64
	keys   []statemachine.KeyTTL
	delays []statemachine.LockDelay
	idle   []statemachine.IdleLease
	err    error
}

// recorder records proposals and plays the state machine: unless told to
// fail, it feeds the events an applied expiry would emit back through
// Observe, as the server does before the proposal returns.
type recorder struct {
	mu    sync.Mutex
	calls []call
	fail  int            // fail this many more calls
	err   error          // the failure, if not the default
	block bool           // wait for ctx to be cancelled, then fail
	l     *lessor.Lessor // fed back the events
}

func (r *recorder) proposer() *Proposer {
	return &Proposer{
		ExpireSessionsFn: func(ctx context.Context, epoch int64, ids []int64) error {
			evs := make([]statemachine.Event, len(ids))
			for i, id := range ids {
				evs[i] = statemachine.Event{Type: statemachine.EventSessionExpired, SessionID: id}
			}
			return r.record(ctx, call{kind: "session", epoch: epoch, ids: slices.Clone(ids)}, evs)
		},
		ExpireKeysFn: func(ctx context.Context, epoch int64, keys []statemachine.KeyTTL) error {
			evs := make([]statemachine.Event, len(keys))
			for i, k := range keys {
				evs[i] = statemachine.Event{Type: statemachine.EventKeyExpired,
					KV: &statemachine.KeyValue{Key: k.Key, ModRevision: k.ModRevision}}
			}
			return r.record(ctx, call{kind: "key", epoch: epoch, keys: slices.Clone(keys)}, evs)
		},
		EndLockDelaysFn: func(ctx context.Context, epoch int64, delays []statemachine.LockDelay) error {
			evs := make([]statemachine.Event, len(delays))
			for i, d := range delays {
				evs[i] = statemachine.Event{Type: statemachine.EventLockDelayEnded, Lease: d.Lease}
			}
			return r.record(ctx, call{kind: "lock_delay", epoch: epoch, delays: slices.Clone(delays)}, evs)
		},
		CollectLeasesFn: func(ctx context.Context, epoch int64, leases []statemachine.IdleLease) error {
			evs := make([]statemachine.Event, len(leases))
			for i, il := range leases {
				evs[i] = statemachine.Event{Type: statemachine.EventLeaseDeleted, Lease: il.Lease}
			}
			return r.record(ctx, call{kind: "lease_gc", epoch: epoch, idle: slices.Clone(leases)}, evs)
		},
	}
}

func (r *recorder) record(ctx context.Context, c call, evs []statemachine.Event) error {
	c.at = time.Now()
	r.mu.Lock()
	block := r.block
	if !block && r.fail > 0 {
		r.fail--
		c.err = errors.New("injected failure")
		if r.err != nil {
			c.err = r.err
		}
	}
	r.calls = append(r.calls, c)
	l := r.l
	r.mu.Unlock()
	switch {
	case block:
		<-ctx.Done()
		return ctx.Err()
	case c.err != nil:
		return c.err
	case l != nil:
		l.Observe(evs)
	}
	return nil
}

func (r *recorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *recorder) set(f func(r *recorder)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

// newLessor returns a lessor proposing to r, stopped when the test ends.
func newLessor(t testing.TB, r *recorder, cfg lessor.Config) *lessor.Lessor {
	t.Helper()
	cfg.Proposer = r.proposer()
	l := lessor.New(cfg)
	r.set(func(r *recorder) { r.l = l })
	t.Cleanup(l.Stop)
	return l
}

// waitCalls waits until the recorder has seen at least n calls. The tests
// that wait run in a synctest bubble, where time.Now and time.Sleep use a
// fake clock: the polling costs no real time, and the clock moves only
// when every goroutine in the bubble is blocked, so the times the recorder
// stamps are exactly when the lessor proposed. Its readings carry no
// monotonic part, which Config.Now asks for, but a fake wall clock never
// steps either.
func waitCalls(t *testing.T, r *recorder, n int, timeout time.Duration) []call {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		calls := r.snapshot()
		if len(calls) >= n {
			return calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls = %d after %v, expected: at least %d", len(calls), timeout, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// quiet is how long a test waits to see that nothing is proposed: several
// times every TTL the tests use. It passes on the bubble's fake clock.
const quiet = 600 * time.Millisecond

// clock is a fake Now. It starts at the real time, so that its readings
// carry a monotonic part as the lessor requires.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func sessions(ttl time.Duration, ids ...int64) statemachine.Deadlines {
	var d statemachine.Deadlines
	for _, id := range ids {
		d.Sessions = append(d.Sessions, statemachine.SessionTTL{ID: id, TTL: int64(ttl)})
	}
	return d
}

func opened(ttl time.Duration, ids ...int64) []statemachine.Event {
	evs := make([]statemachine.Event, len(ids))
	for i, id := range ids {
		evs[i] = statemachine.Event{Type: statemachine.EventSessionOpened, SessionID: id,
			Session: &statemachine.Session{ID: id, TTL: int64(ttl)}}
	}
	return evs
}

func TestSessionExpiry(t *testing.T) {
	tests := []struct {
		name  string
		ttl   time.Duration
		extra time.Duration
		start func(l *lessor.Lessor, ttl, extra time.Duration)
	}{
		{
			name: "A session opened on the leader expires no sooner than its TTL, and soon after.",
			ttl:  200 * time.Millisecond,
			start: func(l *lessor.Lessor, ttl, _ time.Duration) {
				l.Promote(7, statemachine.Deadlines{}, time.Hour)
				l.Observe(opened(ttl, 1))
			},
		},
		{
			name:  "A session known at promotion expires no sooner than its TTL plus the election timeout.",
			ttl:   150 * time.Millisecond,
			extra: 150 * time.Millisecond,
			start: func(l *lessor.Lessor, ttl, extra time.Duration) {
				l.Promote(7, sessions(ttl, 1), extra)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{}
				l := newLessor(t, r, lessor.Config{})
				begin := time.Now()
				tt.start(l, tt.ttl, tt.extra)

				calls := waitCalls(t, r, 1, tt.ttl+tt.extra+3*time.Second)
				c := calls[0]
				if got, min := c.at.Sub(begin), tt.ttl+tt.extra; got < min {
					t.Errorf("expired after %v, expected: at least %v", got, min)
				}
				if got, max := c.at.Sub(begin), tt.ttl+tt.extra+2*time.Second; got > max {
					t.Errorf("expired after %v, expected: at most %v", got, max)
				}
				if c.kind != "session" || c.epoch != 7 || !slices.Equal(c.ids, []int64{1}) {
					t.Errorf("got = %s epoch %d ids %v, expected: session epoch 7 ids [1]", c.kind, c.epoch, c.ids)
				}
				if _, ok := l.Remaining(1); ok {
					t.Errorf("Remaining ok = true after the expiry was applied, expected: false")
				}
				if _, err := l.Heartbeat(1); !errors.Is(err, lessor.ErrSessionExpired) {
					t.Errorf("Heartbeat err = %v, expected: %v", err, lessor.ErrSessionExpired)
				}
			})
		})
	}
}

func TestHeartbeatsKeepSessionAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		r := &recorder{}
		l := newLessor(t, r, lessor.Config{})
		l.Promote(1, statemachine.Deadlines{}, 0)
		l.Observe(opened(ttl, 1))

		// Beat at TTL/6 for four TTLs: the session must outlive its TTL many
		// times over, and nothing may be proposed.
		var last time.Time
		for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(ttl / 6) {
			got, err := l.Heartbeat(1)
			if err != nil || got != ttl {
				t.Fatalf("Heartbeat = %v, %v, expected: %v, nil", got, err, ttl)
			}
			last = time.Now()
		}
		if calls := r.snapshot(); len(calls) != 0 {
			t.Fatalf("proposals while beating = %d, expected: 0", len(calls))
		}

		calls := waitCalls(t, r, 1, ttl+3*time.Second)
		if got := calls[0].at.Sub(last); got < ttl {
			t.Errorf("expired %v after the last heartbeat, expected: at least %v", got, ttl)
		}
	})
}

func TestHeartbeat(t *testing.T) {
	const ttl = time.Hour
	tests := []struct {
		name    string
		promote bool
		demote  bool
		advance time.Duration
		id      int64
		wantTTL time.Duration
		wantErr error
	}{
		{name: "A heartbeat before the deadline renews the session for a full TTL.",
			promote: true, advance: 30 * time.Minute, id: 1, wantTTL: ttl},
		{name: "A heartbeat at the deadline is refused: the session is being expired.",
			promote: true, advance: ttl, id: 1, wantErr: lessor.ErrSessionExpired},
		{name: "A heartbeat for an unknown session is refused.",
			promote: true, id: 99, wantErr: lessor.ErrSessionExpired},
		{name: "A heartbeat before promotion is sent to the wrong node.",
			id: 1, wantErr: lessor.ErrNotLeader},
		{name: "A heartbeat after demotion is sent to the wrong node.",
			promote: true, demote: true, id: 1, wantErr: lessor.ErrNotLeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			l := newLessor(t, &recorder{}, lessor.Config{Now: c.Now})
			if tt.promote {
				l.Promote(1, sessions(ttl, 1), 0)
			}
			if tt.demote {
				l.Demote()
			}
			c.Advance(tt.advance)

			got, err := l.Heartbeat(tt.id)
			if got != tt.wantTTL || !errors.Is(err, tt.wantErr) {
				t.Fatalf("got = %v, %v, expected: %v, %v", got, err, tt.wantTTL, tt.wantErr)
			}
			if err != nil {
				if got := l.LastHeartbeat(tt.id); !got.IsZero() {
					t.Errorf("LastHeartbeat = %v, expected: zero", got)
				}
				return
			}
			if got, ok := l.Remaining(tt.id); got != ttl || !ok {
				t.Errorf("Remaining = %v, %v, expected: %v, true", got, ok, ttl)
			}
			if got, want := l.LastHeartbeat(tt.id), c.Now().Round(0); !got.Equal(want) {
				t.Errorf("LastHeartbeat = %v, expected: %v", got, want)
			}
		})
	}
}

func TestLateHeartbeatDoesNotRevive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 100 * time.Millisecond
		r := &recorder{fail: 1 << 30}
		l := newLessor(t, r, lessor.Config{RetryInterval: 50 * time.Millisecond})
		l.Promote(1, sessions(ttl, 1), 0)
		waitCalls(t, r, 1, 3*time.Second)

		for range 3 {
			if _, err := l.Heartbeat(1); !errors.Is(err, lessor.ErrSessionExpired) {
				t.Fatalf("Heartbeat err = %v, expected: %v", err, lessor.ErrSessionExpired)
			}
		}
		// The expiry is still being retried: the heartbeat changed nothing.
		calls := waitCalls(t, r, 3, 3*time.Second)
		if got := calls[2].ids; !slices.Equal(got, []int64{1}) {
			t.Errorf("retried ids = %v, expected: [1]", got)
		}
		if got, ok := l.Remaining(1); got != 0 || !ok {
			t.Errorf("Remaining = %v, %v, expected: 0, true", got, ok)
		}
	})
}

func TestPromote(t *testing.T) {
	const ttl, extra = time.Hour, 10 * time.Minute
	tests := []struct {
		name  string
		steps func(l *lessor.Lessor, c *clock)
		id    int64
		want  time.Duration
		ok    bool
	}{
		{
			name:  "Promotion gives every session its TTL plus the election timeout.",
			steps: func(l *lessor.Lessor, c *clock) { l.Promote(1, sessions(ttl, 1), extra) },
			id:    1, want: ttl + extra, ok: true,
		},
		{
			name: "A session whose deadline passed before promotion still gets a full TTL.",
			steps: func(l *lessor.Lessor, c *clock) {
				l.Promote(1, sessions(ttl, 1), extra)
				c.Advance(2 * ttl)
				l.Demote()
				l.Promote(2, sessions(ttl, 1), extra)
			},
			id: 1, want: ttl + extra, ok: true,
		},
		{
			name: "A heartbeat just after promotion keeps the election timeout's grace.",
			steps: func(l *lessor.Lessor, c *clock) {
				l.Promote(1, sessions(ttl, 1), extra)
				c.Advance(time.Minute)
				l.Heartbeat(1)
			},
			id: 1, want: ttl + extra - time.Minute, ok: true,
		},
		{
			name: "Promotion replaces what was tracked before.",
			steps: func(l *lessor.Lessor, c *clock) {
				l.Promote(1, sessions(ttl, 1), extra)
				l.Promote(2, sessions(ttl, 2), extra)
			},
			id: 1, want: 0, ok: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			// Failing keeps a stray expiry of the first term, should the
			// loop run after an Advance, from feeding back into the second.
			l := newLessor(t, &recorder{fail: 1 << 30}, lessor.Config{Now: c.Now})
			tt.steps(l, c)
			if got, ok := l.Remaining(tt.id); got != tt.want || ok != tt.ok {
				t.Errorf("Remaining = %v, %v, expected: %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestFailedProposalsAreRetried(t *testing.T) {
	const ttl, retry = 100 * time.Millisecond, 80 * time.Millisecond
	lease := statemachine.LeaseID{Namespace: "ns", Name: "db"}
	tests := []struct {
		name   string
		d      statemachine.Deadlines
		kind   string
		forgot func(l *lessor.Lessor) bool
	}{
		{
			name: "A failed session expiry is proposed again until it succeeds.",
			d:    sessions(ttl, 1), kind: "session",
			forgot: func(l *lessor.Lessor) bool { _, ok := l.Remaining(1); return !ok },
		},
		{
			name: "A failed key expiry is proposed again until it succeeds.",
			d:    statemachine.Deadlines{Keys: []statemachine.KeyTTL{{Key: "k", ModRevision: 3, TTL: int64(ttl)}}},
			kind: "key",
		},
		{
			name: "A failed lock-delay end is proposed again until it succeeds.",
			d:    statemachine.Deadlines{Delays: []statemachine.LockDelay{{Lease: lease, Revision: 4, Delay: int64(ttl)}}},
			kind: "lock_delay",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{fail: 2}
				l := newLessor(t, r, lessor.Config{RetryInterval: retry})
				l.Promote(5, tt.d, 0)

				calls := waitCalls(t, r, 3, 5*time.Second)
				for i, c := range calls[:3] {
					if c.kind != tt.kind || c.epoch != 5 {
						t.Errorf("call %d = %s epoch %d, expected: %s epoch 5", i, c.kind, c.epoch, tt.kind)
					}
					if i > 0 {
						if got := c.at.Sub(calls[i-1].at); got < retry {
							t.Errorf("call %d came %v after the last, expected: at least %v", i, got, retry)
						}
					}
				}
				if got, want := calls[2].err, error(nil); got != want {
					t.Errorf("third call err = %v, expected: %v", got, want)
				}
				// Once applied, the item is forgotten and never proposed again.
				time.Sleep(3 * retry)
				if got := len(r.snapshot()); got != 3 {
					t.Errorf("calls = %d, expected: 3", got)
				}
				if tt.forgot != nil && !tt.forgot(l) {
					t.Errorf("forgotten = false, expected: true")
				}
			})
		})
	}
}

func TestDemote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, retry = 100 * time.Millisecond, 50 * time.Millisecond
		r := &recorder{block: true}
		l := newLessor(t, r, lessor.Config{RetryInterval: retry})
		l.Promote(1, sessions(ttl, 1, 2), 0)
		waitCalls(t, r, 1, 3*time.Second)

		l.Demote() // cancels the blocked proposal
		if _, err := l.Heartbeat(1); !errors.Is(err, lessor.ErrNotLeader) {
			t.Errorf("Heartbeat err = %v, expected: %v", err, lessor.ErrNotLeader)
		}
		if _, ok := l.Remaining(2); ok {
			t.Errorf("Remaining ok = true, expected: false")
		}
		l.Observe(opened(ttl, 3)) // ignored: not leader
		time.Sleep(quiet)
		if got := len(r.snapshot()); got != 1 {
			t.Fatalf("calls after demotion = %d, expected: 1", got)
		}

		// A second leadership works like the first, with its own epoch.
		r.set(func(r *recorder) { r.block = false })
		l.Promote(2, sessions(ttl, 4), 0)
		calls := waitCalls(t, r, 2, 3*time.Second)
		if c := calls[1]; c.epoch != 2 || !slices.Equal(c.ids, []int64{4}) {
			t.Errorf("got = epoch %d ids %v, expected: epoch 2 ids [4]", c.epoch, c.ids)
		}
	})
}

func matches(got, want map[string]float64) bool {
	for name, w := range want {
		if got[name] != w {
			return false
		}
	}
	return true
}

// gather flattens a registry into name{label=value} → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather err = %v, expected: nil", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range m.GetLabel() {
				name += fmt.Sprintf("{%s=%s}", lp.GetName(), lp.GetValue())
			}
			switch {
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// BenchmarkHeartbeat renews sessions on a leader tracking 100,000 of them,
// from as many goroutines as GOMAXPROCS.
func BenchmarkHeartbeat(b *testing.B) {
	const n = 100_000
	r := &recorder{}
	l := newLessor(b, r, lessor.Config{})
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	l.Promote(1, sessions(time.Hour, ids...), 0)

	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(n)
		for pb.Next() {
			if _, err := l.Heartbeat(ids[i]); err != nil {
				b.Errorf("Heartbeat err = %v, expected: nil", err)
				return
			}
			if i++; i == n {
				i = 0
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "heartbeats/s")
}
