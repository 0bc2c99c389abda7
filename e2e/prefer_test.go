package e2e

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLIPreferredHolderTakesOverFromARunningElect: with sched-1 leading
// under `tenure elect` and sched-2 waiting behind sched-0, naming sched-2
// the preferred holder makes sched-1 stop its command gracefully (its
// TERM trap runs) and resign, and sched-2 — not sched-0, first in line —
// is elected next, with a higher token. The holder is asked, never
// robbed: until its command has stopped, the lease is still its own.
func TestCLIPreferredHolderTakesOverFromARunningElect(t *testing.T) {
	e := newCLIEnv(t)
	candidate := func(id string) *cliProc {
		// The trap stands for a leader's graceful shutdown: it is slow,
		// so that the test sees the lease still held while it runs.
		return e.start("elect", "--identity", id, "--ttl", "10s", "--kill-grace", "2s", "sched", "--", "sh", "-c",
			`trap 'echo stopping > stopping-`+id+`; sleep 1; echo stopped > stopped-`+id+`; exit 0' TERM; `+
				`echo "$TENURE_FENCING_TOKEN" > leader-`+id+`; while :; do sleep 0.1; done`)
	}
	one := candidate("sched-1")
	tok1, err := strconv.ParseInt(strings.TrimSpace(e.waitFile("leader-sched-1", 10*time.Second)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	zero := candidate("sched-0")
	e.waitWaiter("sched", "sched-0")
	two := candidate("sched-2")
	e.waitWaiter("sched", "sched-2")

	r := e.run("lease", "prefer", "sched", "sched-2")
	if r.code != 0 || !strings.Contains(r.stdout, "preferred holder sched-2 (held by sched-1") {
		t.Fatalf("lease prefer: got = %v, expected: exit 0 naming the holder that will step down", r)
	}
	if got := e.lease("sched").Spec.HolderIdentity; got == nil || *got != "sched-1" {
		t.Fatalf("holder right after the preference was set: got = %v, expected: sched-1, until it releases", got)
	}

	// sched-1's command is told to stop, finishes its shutdown, and
	// elect exits non-zero saying why.
	e.waitFile("stopping-sched-1", 10*time.Second)
	e.waitFile("stopped-sched-1", 10*time.Second)
	if code := one.wait(t, 10*time.Second); code == 0 || !strings.Contains(one.stderr.String(), "stepped down from default/sched") {
		t.Errorf("sched-1 after the preference: got = exit %d, stderr %q, expected: a non-zero exit saying it stepped down", code, one.stderr)
	}
	tok2, err := strconv.ParseInt(strings.TrimSpace(e.waitFile("leader-sched-2", 10*time.Second)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if tok2 <= tok1 {
		t.Errorf("sched-2's token: got = %d, expected: above sched-1's %d", tok2, tok1)
	}
	if e.exists("leader-sched-0") {
		t.Errorf("sched-0 was elected, expected: the preferred sched-2 ahead of it")
	}
	if l := e.lease("sched"); l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "sched-2" {
		t.Errorf("holder after the handover: got = %v, expected: sched-2", l.Spec.HolderIdentity)
	}

	// The preference is cleared; sched-2 leads on, and stepping it down
	// by hand hands over to sched-0 in queue order.
	if r := e.run("lease", "prefer", "sched", "--clear"); r.code != 0 {
		t.Errorf("lease prefer --clear: got = %v, expected: exit 0", r)
	}
	two.signal(t, syscall.SIGTERM)
	two.wait(t, 10*time.Second)
	e.waitFile("leader-sched-0", 10*time.Second)
	zero.signal(t, syscall.SIGTERM)
	zero.wait(t, 10*time.Second)
}
