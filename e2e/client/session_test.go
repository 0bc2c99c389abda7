package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

// TestSessionLossDetection partitions a lock holder from the server and
// checks safety rule 5: the holder stops trusting its grant at the last
// acknowledged heartbeat's send time + 0.75×TTL, before the server can
// expire the session and grant the lock to the next waiter; and a lost
// session stays lost when the network heals.
func TestSessionLossDetection(t *testing.T) {
	addr := startServer(t)
	p := startProxy(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const ttl = time.Second
	// Frequent heartbeats, so that the last one before the partition is
	// recent and the bounds below are tight.
	const interval = ttl / 10

	a := newSession(t, newClient(t, p.Addr()), client.WithTTL(ttl), client.WithHeartbeatInterval(interval), client.WithIdentity("partitioned"))
	b := newSession(t, newClient(t, addr), client.WithTTL(ttl), client.WithIdentity("direct"))
	watchdog := make(chan time.Time, 1)
	ma := a.Mutex("loss", client.WithWatchdog(func() { watchdog <- time.Now() }))
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lockLost := ma.Lost()
	lockCtx := ma.Context()

	type acquired struct {
		at  time.Time
		err error
		// aValid is whether the partitioned holder still trusted its
		// grant when the lock was granted to b.
		aValid bool
	}
	mb := b.Mutex("loss")
	bDone := make(chan acquired, 1)
	go func() {
		err := mb.Lock(ctx)
		bDone <- acquired{time.Now(), err, ma.Valid() || a.Valid()}
	}()

	// Let several heartbeats be acknowledged, so that the last one is
	// recent when the partition starts.
	time.Sleep(ttl / 2)
	if !a.Valid() || !ma.Valid() {
		t.Fatalf("got = session valid %v lock valid %v before the partition, expected: both valid", a.Valid(), ma.Valid())
	}
	blockStart := time.Now()
	p.Block()
	blocked := time.Now()

	var lostAt time.Time
	select {
	case <-a.Lost():
		lostAt = time.Now()
	case <-time.After(5 * ttl):
		t.Fatalf("got = session not lost %v after the partition, expected: lost within 0.75×TTL", 5*ttl)
	}
	validUntil := a.ValidUntil()
	lastAckSent := validUntil.Add(-ttl * 3 / 4)

	// Valid turns false by the last ack's send time + 0.75×TTL; that send
	// was before the partition.
	if limit := blocked.Add(ttl * 3 / 4); validUntil.After(limit) {
		t.Fatalf("got = valid until %v after the partition, expected: at most %v", validUntil.Sub(blocked), limit.Sub(blocked))
	}
	// Not needlessly early: heartbeats went every interval until the
	// partition.
	if floor := blockStart.Add(ttl*3/4 - interval - 100*time.Millisecond); validUntil.Before(floor) {
		t.Fatalf("got = valid until %v after the partition, expected: at least %v", validUntil.Sub(blockStart), floor.Sub(blockStart))
	}
	if lostAt.Before(validUntil) {
		t.Fatalf("got = lost %v before the validity ended, expected: not before", validUntil.Sub(lostAt))
	}
	if limit := blocked.Add(ttl*3/4 + ttl/4); lostAt.After(limit) {
		t.Fatalf("got = Lost fired %v after the partition, expected: at most %v", lostAt.Sub(blocked), limit.Sub(blocked))
	}
	if a.Valid() || ma.Valid() {
		t.Fatalf("got = session valid %v lock valid %v after loss, expected: both false", a.Valid(), ma.Valid())
	}
	for name, c := range map[string]context.Context{"session": a.Context(), "lock": lockCtx} {
		if c.Err() == nil || !errors.Is(context.Cause(c), client.ErrSessionExpired) {
			t.Fatalf("got = %s context err %v cause %v, expected: cancelled with ErrSessionExpired", name, c.Err(), context.Cause(c))
		}
	}
	if !errors.Is(a.Err(), client.ErrSessionExpired) {
		t.Fatalf("got = Err %v, expected: ErrSessionExpired", a.Err())
	}
	select {
	case <-lockLost:
	case <-time.After(2 * time.Second):
		t.Fatal("got = lock Lost not closed 2s after the session was lost, expected: closed")
	}
	select {
	case <-watchdog:
	case <-time.After(2 * time.Second):
		t.Fatal("got = watchdog not called 2s after the session was lost, expected: called")
	}

	// The server grants the lock to b only after a full TTL without
	// heartbeats: no earlier than the last acknowledged send + TTL, so
	// about a TTL after the partition began, and by then a has long
	// given up.
	var got acquired
	select {
	case got = <-bDone:
	case <-time.After(10 * time.Second):
		t.Fatal("got = b still waiting 10s after the partition, expected: granted after the TTL")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.at.Before(lastAckSent.Add(ttl)) {
		t.Fatalf("got = b granted %v after a's last acknowledged heartbeat was sent, expected: at least the TTL %v", got.at.Sub(lastAckSent), ttl)
	}
	if floor := ttl - interval - 100*time.Millisecond; got.at.Sub(blockStart) < floor {
		t.Fatalf("got = b granted %v after the partition, expected: at least %v", got.at.Sub(blockStart), floor)
	}
	t.Logf("after the partition: valid until %v, Lost at %v, b granted at %v (TTL %v)",
		validUntil.Sub(blockStart).Round(time.Millisecond), lostAt.Sub(blockStart).Round(time.Millisecond), got.at.Sub(blockStart).Round(time.Millisecond), ttl)
	if got.aValid || !lostAt.Before(got.at) {
		t.Fatalf("got = a valid %v when b was granted, a lost %v before b's grant, expected: a invalid and lost first", got.aValid, got.at.Sub(lostAt))
	}
	if tokenOf(mb) <= tokenOf(ma) || !mb.Valid() {
		t.Fatalf("got = b token %d (a's %d) valid %v, expected: above a's and valid", tokenOf(mb), tokenOf(ma), mb.Valid())
	}

	// The network heals: a stays lost and never takes the lock back.
	p.Resume()
	time.Sleep(ttl / 2)
	if a.Valid() || ma.Valid() || a.Err() == nil {
		t.Fatalf("got = session valid %v lock valid %v err %v after healing, expected: lost for good", a.Valid(), ma.Valid(), a.Err())
	}
	if err := a.Mutex("loss").TryLock(ctx); !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("got = TryLock on the lost session %v, expected: ErrSessionExpired", err)
	}
	if err := a.Mutex("other").Lock(ctx); !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("got = Lock on the lost session %v, expected: ErrSessionExpired", err)
	}
	// Unlock after a loss is a no-op locally, and never releases b's grant.
	if err := ma.Unlock(ctx); err != nil {
		t.Fatalf("got = Unlock after loss %v, expected: nil", err)
	}
	// A bystander with a roomy TTL: under load a 1s TTL's validity can run
	// out between opening the session and the TryLock.
	if err := newSession(t, newClient(t, addr), client.WithTTL(10*time.Second)).Mutex("loss").TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("got = %v, expected: ErrLocked (b still holds)", err)
	}
	if !mb.Valid() {
		t.Fatal("got = b's lock invalid after a healed, expected: valid")
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSessionHeartbeatsKeepItValid(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	const ttl = 400 * time.Millisecond
	s := newSession(t, c, client.WithTTL(ttl), client.WithIdentity("beating"))
	if s.TTL() != ttl || s.Identity() != "beating" || s.ID() <= 0 || s.Client() != c {
		t.Fatalf("got = ttl %v identity %q id %d, expected: %v, beating, positive", s.TTL(), s.Identity(), s.ID(), ttl)
	}
	first := s.ValidUntil()
	if limit := time.Now().Add(ttl * 3 / 4); first.After(limit) {
		t.Fatalf("got = valid until %v from now, expected: at most 0.75×TTL", time.Until(first))
	}
	time.Sleep(3 * ttl)
	if !s.Valid() || s.Err() != nil {
		t.Fatalf("got = valid %v err %v after 3 TTLs, expected: valid", s.Valid(), s.Err())
	}
	if later := s.ValidUntil(); !later.After(first.Add(ttl)) {
		t.Fatalf("got = validity moved %v, expected: more than a TTL", later.Sub(first))
	}
	select {
	case <-s.Lost():
		t.Fatal("got = Lost closed, expected: open")
	default:
	}
}

// TestSessionCloseReleasesAtOnce: closing a session hands its lock to
// the next waiter in milliseconds, not after a TTL.
func TestSessionCloseReleasesAtOnce(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const ttl = 5 * time.Second
	a, err := c.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	b := newSession(t, c, client.WithTTL(ttl))
	ma := a.Mutex("close")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := ma.Lost()
	granted := make(chan error, 1)
	mb := b.Mutex("close")
	go func() { granted <- mb.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond) // let b park; the grant comes either way

	start := time.Now()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatalf("got = second Close %v, expected: nil", err)
	}
	select {
	case err := <-granted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(ttl / 2):
		t.Fatalf("got = b not granted %v after a closed, expected: at once", ttl/2)
	}
	if took := time.Since(start); took > ttl/2 {
		t.Fatalf("got = handover took %v, expected: well under the TTL %v", took, ttl)
	}
	select {
	case <-lost:
	case <-time.After(time.Second):
		t.Fatal("got = a's lock Lost open after Close, expected: closed")
	}
	if a.Valid() || !errors.Is(a.Err(), client.ErrSessionExpired) {
		t.Fatalf("got = valid %v err %v after Close, expected: invalid, ErrSessionExpired", a.Valid(), a.Err())
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatalf("got = Unlock after Close %v, expected: nil", err)
	}
	if err := a.Mutex("close2").TryLock(ctx); !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("got = TryLock on a closed session %v, expected: ErrSessionExpired", err)
	}
	if !mb.Valid() {
		t.Fatal("got = b's lock invalid, expected: valid")
	}
}

func TestSessionBadOptions(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		opts []client.SessionOption
	}{
		{"a validity factor of 1 is refused by the client", []client.SessionOption{client.WithValidityFactor(1)}},
		{"a validity factor of 0 is refused by the client", []client.SessionOption{client.WithValidityFactor(0)}},
		{"a TTL of 0 is refused by the client, not sent as 0s", []client.SessionOption{client.WithTTL(0)}},
		{"a TTL below the server's minimum is refused by the server", []client.SessionOption{client.WithTTL(10 * time.Millisecond)}},
		{"an identity over the name limit is refused by the server", []client.SessionOption{client.WithIdentity(strings.Repeat("x", 600))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := c.NewSession(ctx, tc.opts...)
			if err == nil {
				s.Close(ctx)
			}
			if !errors.Is(err, client.ErrInvalidArgument) {
				t.Fatalf("got = %v, expected: ErrInvalidArgument", err)
			}
		})
	}
}

// TestSessionCloseWhilePartitioned: closing a session that lost its
// server is bounded by Close's context, not by the client's request
// timeout, and leaves no goroutine behind (TestMain checks).
func TestSessionCloseWhilePartitioned(t *testing.T) {
	addr := startServer(t)
	p := startProxy(t, addr)
	c := newClient(t, p.Addr())
	const ttl = 500 * time.Millisecond
	for _, lost := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		s, err := c.NewSession(ctx, client.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		p.Block()
		if lost {
			select {
			case <-s.Lost():
			case <-time.After(5 * ttl):
				t.Fatal("got = session not lost in the partition, expected: lost")
			}
		}
		const bound = 300 * time.Millisecond
		cctx, ccancel := context.WithTimeout(ctx, bound)
		start := time.Now()
		err = s.Close(cctx)
		took := time.Since(start)
		ccancel()
		// Not a speed goal: Close must end with its context, not hang on
		// the unreachable server (the test's own context allows 20s). The
		// heartbeat loop it waits for can take a couple of seconds to see
		// the end on a loaded machine.
		if took > bound+5*time.Second {
			t.Fatalf("lost %v: got = Close took %v, expected: to end with its context's %v, not hang", lost, took, bound)
		}
		if err == nil && !lost {
			t.Fatalf("lost %v: got = Close nil with the server unreachable, expected: an error", lost)
		}
		if s.Valid() || !errors.Is(s.Err(), client.ErrSessionExpired) {
			t.Fatalf("lost %v: got = valid %v err %v after Close, expected: invalid, ErrSessionExpired", lost, s.Valid(), s.Err())
		}
		p.Resume()
		cancel()
	}
}

// A lease name with '/' is refused before anything is sent: it would read
// as namespace/name in fence headers and the CLI.
func TestLeaseNameWithSlashIsRefused(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	err = s.Mutex("prod/scheduler").TryLock(ctx)
	if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithNamespace") {
		t.Fatalf("got = %v, expected: ErrInvalidArgument pointing at WithNamespace", err)
	}
}
