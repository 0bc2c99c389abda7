package clientgo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/clientgo"
)

// The elector's Create and Update carry a record; the Lock reads only
// its HolderIdentity.
func holder(identity string) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: identity, LeaseDurationSeconds: 2}
}

func mustToken(t *testing.T, l *clientgo.Lock) client.Token {
	t.Helper()
	tok, valid := l.Token()
	if !valid || tok.Token == 0 {
		t.Fatalf("Token() = %v, %v, expected: a valid token", tok, valid)
	}
	return tok
}

// TestLockRecord walks one lease through the elector's calls: not found,
// created, renewed, refused to another candidate, released, and taken by
// the other, checking each record Get reports against Tenure's lease.
func TestLockRecord(t *testing.T) {
	c := newClient(t, startServer(t))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	a := clientgo.New(newSession(t, c, "a"), "", "controller")
	b := clientgo.New(newSession(t, c, "b"), "", "controller")

	if got := a.Describe(); got != "default/controller" {
		t.Errorf("Describe() = %q, expected: %q", got, "default/controller")
	}
	if got := a.Identity(); got != "a" {
		t.Errorf("Identity() = %q, expected: %q", got, "a")
	}
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Get before any grant: err = %v, expected: a Kubernetes NotFound error", err)
	}
	if tok, valid := a.Token(); valid {
		t.Fatalf("Token() before any grant = %v, %v, expected: not valid", tok, valid)
	}

	if err := a.Create(ctx, holder("a")); err != nil {
		t.Fatalf("Create: %v", err)
	}
	first := mustToken(t, a)
	rec, raw, err := a.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.Lease(ctx, "default", "controller")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token != first.Token {
		t.Errorf("Tenure's token = %d, expected: the Lock's %d", lease.Token, first.Token)
	}
	want := resourcelock.LeaderElectionRecord{
		HolderIdentity:       "a",
		LeaseDurationSeconds: int(sessionTTL / time.Second),
		LeaderTransitions:    int(lease.Transitions),
	}
	if rec.HolderIdentity != want.HolderIdentity || rec.LeaseDurationSeconds != want.LeaseDurationSeconds || rec.LeaderTransitions != want.LeaderTransitions {
		t.Errorf("record = %+v, expected: holder, duration and transitions of %+v", rec, want)
	}
	// The renew time is the session's last renewal, which times its
	// expiry: until a heartbeat follows the grant it is the session's
	// opening, before the acquire.
	// Get came before Lease, and renewals only move forward.
	if !rec.AcquireTime.Time.Equal(lease.AcquireTime) || rec.RenewTime.IsZero() || rec.RenewTime.Time.After(lease.RenewTime) {
		t.Errorf("record times: acquired %v, renewed %v; expected: acquired %v, renewed by %v", rec.AcquireTime, rec.RenewTime, lease.AcquireTime, lease.RenewTime)
	}

	// The leader's heartbeats move the record although nothing writes
	// it, so followers never see it stand still while the leader lives.
	deadline := time.Now().Add(waitLimit)
	for {
		rec2, raw2, err := a.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, raw2) {
			if rec2.HolderIdentity != "a" || !rec2.RenewTime.Time.After(rec.RenewTime.Time) {
				t.Fatalf("record moved to %+v, expected: holder a with a later renew time than %v", rec2, rec.RenewTime)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("raw record unchanged for %v while the leader heartbeats", waitLimit)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Whatever b's elector made of the record, Tenure says no.
	if err := b.Update(ctx, holder("b")); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("b's Update while a holds: err = %v, expected: client.ErrLocked", err)
	}
	if tok, valid := b.Token(); valid {
		t.Fatalf("b's Token() after a refused Update = %v, %v, expected: not valid", tok, valid)
	}
	if err := a.Update(ctx, holder("a")); err != nil {
		t.Fatalf("a's renewal: %v", err)
	}
	if got := mustToken(t, a); got != first {
		t.Fatalf("token after renewal = %v, expected: unchanged %v", got, first)
	}
	if err := a.Update(ctx, holder("c")); !errors.Is(err, clientgo.ErrForeignHolder) {
		t.Fatalf("Update naming another holder: err = %v, expected: ErrForeignHolder", err)
	}

	// ReleaseOnCancel's update names nobody: the grant goes at once.
	if err := a.Update(ctx, holder("")); err != nil {
		t.Fatalf("release: %v", err)
	}
	if tok, valid := a.Token(); valid {
		t.Fatalf("Token() after release = %v, %v, expected: not valid", tok, valid)
	}
	if rec, _, err := a.Get(ctx); err != nil || rec.HolderIdentity != "" {
		t.Fatalf("Get after release = %+v, %v, expected: no holder", rec, err)
	}
	if err := a.Update(ctx, holder("")); err != nil {
		t.Fatalf("second release: %v, expected: nil, nothing to give back", err)
	}

	if err := b.Update(ctx, holder("b")); err != nil {
		t.Fatalf("b's Update after a released: %v", err)
	}
	second := mustToken(t, b)
	if second.Token <= first.Token {
		t.Fatalf("b's token = %d, expected: above a's %d", second.Token, first.Token)
	}
	rec, _, err = b.Get(ctx)
	if err != nil || rec.HolderIdentity != "b" || rec.LeaderTransitions <= want.LeaderTransitions {
		t.Fatalf("Get after b took over = %+v, %v, expected: holder b, transitions above %d", rec, err, want.LeaderTransitions)
	}
	// A released Lock may lead again.
	if err := b.Update(ctx, holder("")); err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, holder("a")); err != nil {
		t.Fatalf("a's Update after its own release and b's: %v", err)
	}
}

// TestLockLostIsFinal: once a grant a Lock held ends without a release,
// every later Create and Update fails with ErrLost, so that the elector
// stops leading instead of carrying on under a token it never saw; and
// the lease is free for the others.
func TestLockLostIsFinal(t *testing.T) {
	tests := []struct {
		name string
		lose func(ctx context.Context, c *client.Client, s *client.Session, tok client.Token) error
	}{
		{"an operator revokes the grant", func(ctx context.Context, c *client.Client, _ *client.Session, tok client.Token) error {
			_, err := c.Revoke(ctx, tok.Namespace, tok.Name, tok.Token, "test")
			return err
		}},
		{"the session is closed", func(ctx context.Context, _ *client.Client, s *client.Session, _ client.Token) error {
			return s.Close(ctx)
		}},
	}
	c := newClient(t, startServer(t))
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			name := fmt.Sprintf("lost-%d", i)
			s := newSession(t, c, "a")
			a := clientgo.New(s, "", name)
			b := clientgo.New(newSession(t, c, "b"), "", name)
			if err := a.Update(ctx, holder("a")); err != nil {
				t.Fatal(err)
			}
			tok := mustToken(t, a)
			if err := tt.lose(ctx, c, s, tok); err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.Lost():
			case <-ctx.Done():
				t.Fatalf("Lost() did not fire within %v", waitLimit)
			}
			for range 2 {
				if err := a.Update(ctx, holder("a")); !errors.Is(err, clientgo.ErrLost) {
					t.Fatalf("Update after the loss: err = %v, expected: ErrLost", err)
				}
			}
			if got, valid := a.Token(); valid {
				t.Fatalf("Token() after the loss = %v, %v, expected: not valid", got, valid)
			}
			if err := b.Update(ctx, holder("b")); err != nil {
				t.Fatalf("b's Update after a lost the lease: %v", err)
			}
			if err := b.Update(ctx, holder("")); err != nil {
				t.Fatal(err)
			}
			if err := a.Create(ctx, holder("a")); !errors.Is(err, clientgo.ErrLost) {
				t.Fatalf("Create on a free lease after the loss: err = %v, expected: ErrLost", err)
			}
		})
	}
}

// recorder is a fake resourcelock.EventRecorder.
type recorder struct {
	eventf func(obj runtime.Object, eventType, reason, message string, args ...any)
}

func (r recorder) Eventf(obj runtime.Object, eventType, reason, message string, args ...any) {
	r.eventf(obj, eventType, reason, message, args...)
}

var _ resourcelock.EventRecorder = recorder{}

func TestLockRecordEvent(t *testing.T) {
	c := newClient(t, startServer(t))
	var got []string
	rec := recorder{eventf: func(obj runtime.Object, eventType, reason, message string, args ...any) {
		got = append(got, fmt.Sprintf("%T %s %s: ", obj, eventType, reason)+fmt.Sprintf(message, args...))
	}}
	l := clientgo.New(newSession(t, c, "a"), "ops", "controller", clientgo.WithEventRecorder(rec))
	l.RecordEvent("became leader")
	want := "*v1.Lease Normal LeaderElection: a became leader"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("events = %q, expected: [%q]", got, want)
	}
	clientgo.New(newSession(t, c, "b"), "ops", "controller").RecordEvent("became leader") // no recorder: nothing, no panic
}

// TestLockStepsDownForPreferredHolder: when the lease prefers a waiting
// candidate, the leader's grant ends locally with client.ErrStepDown,
// its next renewal gives the lease back and fails with ErrLost, and the
// preferred candidate is granted the lease.
func TestLockStepsDownForPreferredHolder(t *testing.T) {
	c := newClient(t, startServer(t))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	a := clientgo.New(newSession(t, c, "a"), "", "controller")
	if err := a.Update(ctx, holder("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetPreferredHolder(ctx, "default", "controller", "b"); err != nil {
		t.Fatal(err)
	}
	rec, _, err := a.Get(ctx)
	if err != nil || rec.PreferredHolder != "b" {
		t.Fatalf("Get = %+v, %v, expected: preferred holder b", rec, err)
	}
	// b waits on the server, as tenure elect and client.Election do.
	b := newSession(t, c, "b").Mutex("controller")
	locked := make(chan error, 1)
	go func() { locked <- b.Lock(ctx) }()

	select {
	case <-a.Lost():
	case <-ctx.Done():
		t.Fatalf("a's grant did not end within %v of b waiting", waitLimit)
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, client.ErrStepDown) {
		t.Fatalf("a's grant ended with %v, expected: client.ErrStepDown", cause)
	}
	if err := a.Update(ctx, holder("a")); !errors.Is(err, clientgo.ErrLost) || !errors.Is(err, client.ErrStepDown) {
		t.Fatalf("a's renewal after the step-down: err = %v, expected: ErrLost caused by client.ErrStepDown", err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("b's Lock: %v", err)
	}
	defer b.Unlock(context.Background())
	if rec, _, err := a.Get(ctx); err != nil || rec.HolderIdentity != "b" {
		t.Fatalf("Get after the step-down = %+v, %v, expected: holder b", rec, err)
	}
}
