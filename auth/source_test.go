package auth_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/auth"
)

const (
	// alicePolicy lets alice read team-a.
	alicePolicy = "roles: {r: [{namespaces: [team-a], verbs: [read]}]}\nprincipals:\n  - {name: alice, roles: [r]}\n"
	// bobPolicy lets bob read team-a too; it is longer than alicePolicy,
	// so that a watcher sees the file change even within one tick of the
	// file system's clock.
	bobPolicy = alicePolicy + "  - {name: bob, roles: [r]}\n"
	// badPolicy names a role nobody defined.
	badPolicy = alicePolicy + "  - {name: carol, roles: [typo]}\n"
)

// reloads records what a Source tells its onReload callback.
type reloads struct {
	mu    sync.Mutex // guards calls
	calls []reload
}

type reload struct {
	p   *auth.Policy
	err error
}

func (r *reloads) record(p *auth.Policy, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, reload{p, err})
}

func (r *reloads) all() []reload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reload(nil), r.calls...)
}

func writePolicy(t *testing.T, path, policy string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newSource writes policy to a fresh file and loads it.
func newSource(t *testing.T, policy string) (*auth.Source, string, *reloads) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writePolicy(t, path, policy)
	r := &reloads{}
	s, err := auth.Load(path, r.record)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return s, path, r
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s, expected: it to happen within a few ticks", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startWatch runs s.Watch every 10ms on a goroutine of its own, and
// returns a function that ends it and waits (at most 10s) for it to
// return. The test's cleanup calls that too, should the test stop early.
func startWatch(t *testing.T, s *auth.Source) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Watch(ctx, 10*time.Millisecond)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("Watch still running 10s after its context ended, expected: it to return")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Load reads the file's policy, and remembers where it came from.
func TestLoad(t *testing.T) {
	s, path, r := newSource(t, alicePolicy)
	if !s.Policy().For("alice").Known() {
		t.Errorf("alice Known() got = false, expected: true")
	}
	if got := s.Path(); got != path {
		t.Errorf("Path() got = %q, expected: %q", got, path)
	}
	if got := len(r.all()); got != 0 {
		t.Errorf("onReload calls after Load got = %d, expected: 0 (Load returns its own error)", got)
	}
}

// Load refuses a missing file or an invalid policy, saying which file.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if s, err := auth.Load(missing, nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing file) got = %v, %v, expected: an error matching fs.ErrNotExist", s, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	writePolicy(t, bad, badPolicy)
	s, err := auth.Load(bad, nil)
	if !errors.Is(err, auth.ErrPolicy) {
		t.Fatalf("Load(invalid policy) got = %v, %v, expected: an error matching ErrPolicy", s, err)
	}
	for _, w := range []string{bad, `role "typo"`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error got = %q, expected: it to hold %q", err, w)
		}
	}
}

// Reload puts a valid new file in force and tells onReload.
func TestReloadValid(t *testing.T) {
	s, path, r := newSource(t, alicePolicy)
	before := s.Policy()
	writePolicy(t, path, bobPolicy)
	if err := s.Reload(); err != nil {
		t.Fatalf("Reload got = %v, expected: nil", err)
	}
	if !s.Policy().For("bob").Known() {
		t.Errorf("bob Known() after reload got = false, expected: true")
	}
	if before.For("bob").Known() {
		t.Errorf("bob Known() in the policy from before got = true, expected: false (policies are immutable)")
	}
	calls := r.all()
	if len(calls) != 1 || calls[0].err != nil || calls[0].p != s.Policy() {
		t.Errorf("onReload calls got = %+v, expected: one, with the new policy and no error", calls)
	}
}

// Reload refuses an invalid file: the policy before it stays in force,
// and onReload hears why.
func TestReloadInvalidKeepsPolicy(t *testing.T) {
	s, path, r := newSource(t, alicePolicy)
	before := s.Policy()
	writePolicy(t, path, badPolicy)
	err := s.Reload()
	if !errors.Is(err, auth.ErrPolicy) || !strings.Contains(err.Error(), `role "typo"`) {
		t.Fatalf("Reload got = %v, expected: an ErrPolicy error naming role \"typo\"", err)
	}
	if s.Policy() != before {
		t.Errorf("Policy() after a bad reload got = a new policy, expected: the one before")
	}
	if !s.Policy().For("alice").Known() {
		t.Errorf("alice Known() after a bad reload got = false, expected: true")
	}
	calls := r.all()
	if len(calls) != 1 || calls[0].p != nil || !errors.Is(calls[0].err, auth.ErrPolicy) {
		t.Errorf("onReload calls got = %+v, expected: one, with no policy and the error", calls)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Reload of a removed file got = %v, expected: an error matching fs.ErrNotExist", err)
	}
	if s.Policy() != before {
		t.Errorf("Policy() after the file was removed got = a new policy, expected: the one before")
	}
}

// A static source never changes: Reload does nothing and Watch returns.
func TestStatic(t *testing.T) {
	p := mustParse(t, alicePolicy)
	s := auth.Static(p)
	if err := s.Reload(); err != nil {
		t.Errorf("Reload got = %v, expected: nil", err)
	}
	s.Watch(context.Background(), time.Millisecond) // returns at once, or the test times out
	if s.Policy() != p || s.Path() != "" {
		t.Errorf("got = %p, %q, expected: %p, \"\"", s.Policy(), s.Path(), p)
	}
}

// Readers see one policy or the other while Reload swaps them, never a
// torn one (run with -race).
func TestReloadConcurrentReaders(t *testing.T) {
	s, path, _ := newSource(t, alicePolicy)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !s.Policy().For("alice").Namespace(auth.Read, "team-a") {
					t.Error("alice may read team-a got = false, expected: true in either policy")
					return
				}
			}
		})
	}
	for i := range 20 {
		writePolicy(t, path, []string{alicePolicy, bobPolicy}[i%2])
		if err := s.Reload(); err != nil {
			t.Errorf("Reload %d got = %v, expected: nil", i, err)
		}
	}
	close(stop)
	wg.Wait()
}

// Watch notices the file change by itself: a valid file is put in force,
// an invalid one refused with the policy before it kept, and onReload is
// told of both. It returns when its context ends, leaving no goroutine.
func TestWatch(t *testing.T) {
	s, path, r := newSource(t, alicePolicy)
	stop := startWatch(t, s)

	writePolicy(t, path, bobPolicy)
	waitFor(t, "the watcher to put bob's policy in force", func() bool { return s.Policy().For("bob").Known() })
	good := s.Policy()

	writePolicy(t, path, badPolicy+"# padding, so the size changes too\n")
	waitFor(t, "the watcher to report the bad file", func() bool {
		calls := r.all()
		return len(calls) > 0 && calls[len(calls)-1].err != nil
	})
	if s.Policy() != good {
		t.Errorf("Policy() after the watcher saw a bad file got = a new policy, expected: the one before")
	}
	if calls := r.all(); len(calls) < 2 || calls[0].err != nil || calls[0].p == nil {
		t.Errorf("onReload calls got = %+v, expected: a good reload, then the bad one", calls)
	}

	stop()
	goleak.VerifyNone(t)
}

// Watch returns when its context ends, even if the file never changes.
func TestWatchStops(t *testing.T) {
	s, _, r := newSource(t, alicePolicy)
	stop := startWatch(t, s)
	stop()
	if got := len(r.all()); got != 0 {
		t.Errorf("onReload calls for an unchanged file got = %d, expected: 0", got)
	}
	goleak.VerifyNone(t)
}
