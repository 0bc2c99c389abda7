//go:build linux

package e2e

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestCLIWaitSurvivesRestart: `tenure lock --wait` and `tenure elect`
// wait behind holders while the server is killed with SIGKILL, stays
// down for 2s and starts again on the same data dir and address. Neither
// waiter gives up — no "not leader" or refused connection ends a wait,
// only --wait, a signal or the session's loss does — and each runs its
// command once its holder's command finishes, with a fencing token above
// the holder's. The holders keep their grants, and their commands run
// undisturbed, across the restart.
func TestCLIWaitSurvivesRestart(t *testing.T) {
	e := newCLIEnv(t)
	// The sessions outlive the outage: the restarted node gives each a
	// full TTL again once it is promoted.
	const ttl = "30s"
	holdUntilReleased := func(held, release string) string {
		return `echo $TENURE_FENCING_TOKEN > ` + held + `; while [ ! -e ` + release + ` ]; do sleep 0.05; done`
	}
	lockHolder := e.start("lock", "--ttl", ttl, "--identity", "lock-holder", "restart-lock", "--",
		"sh", "-c", holdUntilReleased("lock-held", "lock-release"))
	electHolder := e.start("elect", "--ttl", ttl, "--identity", "elect-holder", "restart-elect", "--",
		"sh", "-c", holdUntilReleased("elect-held", "elect-release"))
	lockToken := mustInt(t, e.waitFile("lock-held", 10*time.Second))
	electToken := mustInt(t, e.waitFile("elect-held", 10*time.Second))

	lockWaiter := e.start("lock", "--ttl", ttl, "--wait", "2m", "--identity", "lock-waiter", "restart-lock", "--",
		"sh", "-c", `echo $TENURE_FENCING_TOKEN > lock-got`)
	electWaiter := e.start("elect", "--ttl", ttl, "--identity", "elect-waiter", "restart-elect", "--",
		"sh", "-c", `echo $TENURE_FENCING_TOKEN > elect-got`)
	e.waitWaiter("restart-lock", "lock-waiter")
	e.waitWaiter("restart-elect", "elect-waiter")

	e.srv.kill()
	time.Sleep(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.srv.start(ctx)

	for _, p := range []*cliProc{lockHolder, electHolder, lockWaiter, electWaiter} {
		if p.exited() {
			t.Fatalf("tenure %v: got = exit %d across the restart (stderr %q), expected: still running", p.args, p.code, p.stderr)
		}
	}
	for _, f := range []string{"lock-got", "elect-got"} {
		if e.exists(f) {
			t.Fatalf("%s: got = written while the holder holds, expected: not yet", f)
		}
	}

	for _, c := range []struct {
		holder, waiter      *cliProc
		release, got, holds string
		holderToken         int64
	}{
		{lockHolder, lockWaiter, "lock-release", "lock-got", "restart-lock", lockToken},
		{electHolder, electWaiter, "elect-release", "elect-got", "restart-elect", electToken},
	} {
		if err := os.WriteFile(e.path(c.release), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if code := c.holder.wait(t, 20*time.Second); code != 0 {
			t.Errorf("tenure %v (holder): got = exit %d, stderr %q, expected: exit 0", c.holder.args, code, c.holder.stderr)
		}
		if code := c.waiter.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("tenure %v (waiter): got = exit %d, stderr %q, expected: exit 0 after running its command", c.waiter.args, code, c.waiter.stderr)
		}
		if got := mustInt(t, e.waitFile(c.got, 10*time.Second)); got <= c.holderToken {
			t.Errorf("%s: waiter's fencing token got = %d, expected: above the holder's %d", c.holds, got, c.holderToken)
		}
	}
}
