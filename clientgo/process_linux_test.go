package clientgo_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenurehq/tenure/fence"
)

// child is one elector process (electorMain).
type child struct {
	id   string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // Wait's answer, set before done is closed
}

// startChild starts this test binary as the elector id. The kernel kills
// it if the test process dies first; the test's cleanup kills it if it
// still runs, and prints its output if the test failed.
func startChild(t *testing.T, id, tenure, resource string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ch := &child{id: id, out: &syncBuffer{}, done: make(chan struct{})}
	ch.cmd = exec.Command(exe, "-test.run=^$")
	ch.cmd.Env = append(os.Environ(), envIdentity+"="+id, envTenure+"="+tenure, envResource+"="+resource)
	ch.cmd.Stdout, ch.cmd.Stderr = ch.out, ch.out
	ch.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		ch.err = ch.cmd.Wait()
		close(ch.done)
	}()
	t.Cleanup(func() {
		select {
		case <-ch.done:
		default:
			ch.cmd.Process.Signal(syscall.SIGCONT)
			ch.cmd.Process.Kill()
			<-ch.done
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", id, ch.out)
		}
	})
	return ch
}

func (ch *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := ch.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, ch.id, err)
	}
}

// wait waits for the process to exit and returns Wait's answer.
func (ch *child) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-ch.done:
		return ch.err
	case <-time.After(waitLimit):
		t.Fatalf("%s did not exit within %v", ch.id, waitLimit)
		return nil
	}
}

// exitCleanly sends SIGTERM and expects exit status 0 (a data race in
// the child would make it 66).
func (ch *child) exitCleanly(t *testing.T) {
	t.Helper()
	ch.signal(t, syscall.SIGTERM)
	if err := ch.wait(t); err != nil {
		t.Errorf("%s after SIGTERM: %v, expected: exit status 0", ch.id, err)
	}
}

// syncBuffer is a bytes.Buffer that a process's output and the test can
// share.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestElectorProcesses runs three client-go electors on clientgo.Lock as
// separate processes, each writing while it leads to a resource that
// checks the fencing token with the Tenure server, and fails the leaders
// in turn:
//
//   - SIGKILL: the leader's session expires after its TTL, and a
//     follower takes over.
//   - SIGSTOP, then SIGCONT once a follower has taken over: the paused
//     leader's session expires; woken, its elector still believes it
//     leads until RenewDeadline passes, and its writes with the old token
//     are refused. It then campaigns again as a follower.
//   - SIGTERM: the leader stops writing, its elector releases the lease
//     (ReleaseOnCancel), and the follower takes over without waiting for
//     the TTL: Tenure records the grant as released, not expired.
//
// Throughout, the resource's record must show one leader at a time
// (checkHistory), every write sent after its elector stopped leading must
// be refused, and every process must exit.
func TestElectorProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three elector processes through a kill, a pause and a handover")
	}
	addr := startServer(t)
	c := newClient(t, addr)
	events := watchLeases(t, c, "default")
	res := &resource{policy: fence.Validate(c)}
	srv := httptest.NewServer(res)
	t.Cleanup(srv.Close)
	children := map[string]*child{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("elector-%d", i)
		children[id] = startChild(t, id, addr, srv.URL)
	}
	defer func() {
		for _, p := range checkHistory(res.history()) {
			t.Error(p)
		}
		if t.Failed() {
			var b strings.Builder
			for _, w := range res.history() {
				fmt.Fprintln(&b, w)
			}
			t.Logf("the resource's record:\n%s", b.String())
		}
	}()
	acceptedAfter := func(token int64) func(write) bool {
		return func(w write) bool { return w.Accepted && w.Token > token }
	}

	first := res.await(t, "a first leader's write", acceptedAfter(0))
	t.Logf("%s leads with token %d", first.Identity, first.Token)

	// SIGKILL: nothing is released; Tenure expires the session.
	killed := children[first.Identity]
	killed.signal(t, syscall.SIGKILL)
	var exit *exec.ExitError
	if err := killed.wait(t); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("%s after SIGKILL: %v, expected: killed by SIGKILL", killed.id, err)
	}
	killedAt := time.Now()
	second := res.await(t, "a follower's write after the leader was killed", acceptedAfter(first.Token))
	t.Logf("%s took over with token %d, %v after the kill", second.Identity, second.Token, time.Since(killedAt).Round(time.Millisecond))
	if second.Identity == first.Identity {
		t.Fatalf("the killed %s wrote with token %d", first.Identity, second.Token)
	}
	if got := events.end(t, electorLease, first.Token); got != "expired" {
		t.Fatalf("the killed leader's grant ended %q, expected: expired", got)
	}

	// SIGSTOP until the last follower has taken over, then SIGCONT.
	paused := children[second.Identity]
	paused.signal(t, syscall.SIGSTOP)
	third := res.await(t, "a follower's write while the leader is paused", acceptedAfter(second.Token))
	t.Logf("%s took over with token %d while %s was paused", third.Identity, third.Token, paused.id)
	paused.signal(t, syscall.SIGCONT)
	if got := events.end(t, electorLease, second.Token); got != "expired" {
		t.Fatalf("the paused leader's grant ended %q, expected: expired", got)
	}
	lateOfPaused := res.await(t, "the resumed leader's write from OnStoppedLeading", func(w write) bool {
		return w.Late && w.Token == second.Token
	})
	if lateOfPaused.Accepted {
		t.Errorf("the resumed leader's late write was accepted: %v", lateOfPaused)
	}
	stale := 0
	for _, w := range res.history() {
		if w.Identity == paused.id && w.Token == second.Token && !w.Accepted && !w.Late {
			stale++
		}
	}
	t.Logf("the resource refused %d writes %s sent after it resumed, believing it still led", stale, paused.id)

	// SIGTERM: a graceful handover to the resumed elector, the only
	// other one alive.
	term := children[third.Identity]
	termAt := time.Now()
	term.exitCleanly(t)
	fourth := res.await(t, "a follower's write after the leader's SIGTERM", acceptedAfter(third.Token))
	t.Logf("%s took over with token %d, %v after the SIGTERM", fourth.Identity, fourth.Token, time.Since(termAt).Round(time.Millisecond))
	if fourth.Identity != paused.id {
		t.Fatalf("after the handover %s wrote, expected: %s, the only elector left", fourth.Identity, paused.id)
	}
	if got := events.end(t, electorLease, third.Token); got != "released" {
		t.Fatalf("the terminated leader's grant ended %q, expected: released, without waiting for its session's TTL", got)
	}
	lateOfTerm := res.await(t, "the terminated leader's write from OnStoppedLeading", func(w write) bool {
		return w.Late && w.Token == third.Token
	})
	if lateOfTerm.Accepted {
		t.Errorf("the terminated leader's late write, sent after it released the lease, was accepted: %v", lateOfTerm)
	}

	paused.exitCleanly(t)
}
