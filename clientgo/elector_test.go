package clientgo_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/clientgo"
)

// elector runs one client-go LeaderElector on a goroutine and reports
// when it starts and stops leading.
type elector struct {
	lock    *clientgo.Lock
	started chan client.Token // the token, when OnStartedLeading runs
	stopped chan struct{}     // closed by OnStoppedLeading
	cancel  context.CancelFunc
	done    chan struct{} // closed when RunOrDie has returned
}

// runElector starts an elector on lock (or on wrap(lock) when wrap is
// set, to change what the elector sees); the test's cleanup stops it and
// waits for it.
func runElector(t *testing.T, lock *clientgo.Lock, wrap func(*clientgo.Lock) resourcelock.Interface) *elector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &elector{lock: lock, started: make(chan client.Token, 1), stopped: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	var rl resourcelock.Interface = lock
	if wrap != nil {
		rl = wrap(lock)
	}
	var once sync.Once
	cfg := electorConfig(rl, leaderelection.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			tok, _ := lock.Token()
			e.started <- tok
		},
		OnStoppedLeading: func() { once.Do(func() { close(e.stopped) }) },
	})
	go func() {
		defer close(e.done)
		leaderelection.RunOrDie(ctx, cfg)
	}()
	t.Cleanup(e.stop)
	return e
}

// stop cancels the elector's context and waits for RunOrDie to return.
func (e *elector) stop() {
	e.cancel()
	<-e.done
}

// TestElectorsHandOverOnCancel runs two real client-go electors in this
// process. When the leader's context is cancelled, ReleaseOnCancel gives
// the Tenure lease back at once (a "released" event, not an expiry), and
// the other elector leads with a higher token, while the first's token is
// no longer valid anywhere.
func TestElectorsHandOverOnCancel(t *testing.T) {
	c := newClient(t, startServer(t))
	events := watchLeases(t, c, "default")
	es := []*elector{
		runElector(t, clientgo.New(newSession(t, c, "a"), "", "controller"), nil),
		runElector(t, clientgo.New(newSession(t, c, "b"), "", "controller"), nil),
	}
	leader, follower, first := awaitLeader(t, es)

	leader.stop()
	select {
	case <-leader.stopped:
	default:
		t.Fatal("RunOrDie returned without calling OnStoppedLeading")
	}
	var second client.Token
	select {
	case second = <-follower.started:
	case <-time.After(waitLimit):
		t.Fatalf("the follower did not lead within %v of the leader's cancel", waitLimit)
	}
	if second.Token <= first.Token {
		t.Fatalf("new leader's token = %d, expected: above the old leader's %d", second.Token, first.Token)
	}
	if got := events.end(t, "controller", first.Token); got != "released" {
		t.Fatalf("the old leader's grant ended %q, expected: released (ReleaseOnCancel)", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if r, err := c.Validate(ctx, first); err != nil || r.Valid || r.Holder != follower.lock.Identity() {
		t.Fatalf("Validate(old token) = %+v, %v, expected: not valid, with the new holder named", r, err)
	}
	if r, err := c.Validate(ctx, second); err != nil || !r.Valid {
		t.Fatalf("Validate(new token) = %+v, %v, expected: valid", r, err)
	}
}

// awaitLeader waits until one of es leads and returns it, the other, and
// the leader's token.
func awaitLeader(t *testing.T, es []*elector) (leader, other *elector, tok client.Token) {
	t.Helper()
	select {
	case tok = <-es[0].started:
		return es[0], es[1], tok
	case tok = <-es[1].started:
		return es[1], es[0], tok
	case <-time.After(waitLimit):
		t.Fatalf("no elector led within %v", waitLimit)
	}
	return nil, nil, client.Token{}
}

// skewed is a Lock whose Get tells the elector that every record has
// already expired: what a candidate whose clock runs fast, or that
// missed the leader's renewals, would conclude. The record lasts no time
// (LeaseDurationSeconds 0), and its raw form never changes, so the
// elector never sees the leader renew. It counts the Updates this
// provokes.
type skewed struct {
	*clientgo.Lock
	updates atomic.Int64
}

func (s *skewed) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, _, err := s.Lock.Get(ctx)
	if rec != nil {
		rec.LeaseDurationSeconds = 0
	}
	return rec, []byte("frozen"), err
}

func (s *skewed) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity != "" {
		s.updates.Add(1)
	}
	return s.Lock.Update(ctx, ler)
}

// TestTenureDecidesNotTheClock: a candidate whose elector believes the
// leader's record expired tries to take the lease again and again, and
// never leads while the leader's session lives; once the leader gives
// the lease back, it leads.
func TestTenureDecidesNotTheClock(t *testing.T) {
	c := newClient(t, startServer(t))
	a := runElector(t, clientgo.New(newSession(t, c, "a"), "", "controller"), nil)
	var first client.Token
	select {
	case first = <-a.started:
	case <-time.After(waitLimit):
		t.Fatalf("a did not lead within %v", waitLimit)
	}

	var sk *skewed
	b := runElector(t, clientgo.New(newSession(t, c, "b"), "", "controller"), func(l *clientgo.Lock) resourcelock.Interface {
		sk = &skewed{Lock: l}
		return sk
	})
	// Let b's elector try to take over several times, each time told
	// by its record that a's lease has expired.
	deadline := time.Now().Add(waitLimit)
	for sk.updates.Load() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("b tried to take over %d times within %v, expected: at least 5", sk.updates.Load(), waitLimit)
		}
		time.Sleep(retryPeriod)
	}
	select {
	case tok := <-b.started:
		t.Fatalf("b led with token %v while a's session lived", tok)
	default:
	}
	if !a.lock.Valid() {
		t.Fatal("a's grant is not valid after b's attempts")
	}

	a.stop()
	select {
	case tok := <-b.started:
		if tok.Token <= first.Token {
			t.Fatalf("b's token = %d, expected: above a's %d", tok.Token, first.Token)
		}
	case <-time.After(waitLimit):
		t.Fatalf("b did not lead within %v of a's release", waitLimit)
	}
}
