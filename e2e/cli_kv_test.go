//go:build linux

package e2e

import (
	"syscall"
	"testing"
	"time"
)

// --- keys ---

// TestCLIKVWalkthrough is the etcdctl lock walkthrough, line by line, on
// a fresh server: revisions count from 1, so the failure messages are
// exact.
func TestCLIKVWalkthrough(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "unlocked\n", "", "kv", "set", "my-lock", "unlocked")                            // rev 2 (a new store is at 1)
	e.expect(0, "alice\n", "", "kv", "set", "my-lock", "alice", "--swap-with-value", "unlocked") // rev 3
	e.expect(1, "", "Error: compare failed ([unlocked != alice]) [3]\n", "kv", "set", "my-lock", "bob", "--swap-with-value", "unlocked")
	e.expect(0, "alice\n", "", "kv", "get", "my-lock")
	e.expect(0, "unlocked\n", "", "kv", "set", "my-lock", "unlocked", "--swap-with-value", "alice") // rev 4
	e.expect(0, "unlocked\n", "", "kv", "get", "my-lock")

	// The leased form: a TTL, renewed by the holder.
	e.expect(0, "alice\n", "", "kv", "mk", "my-lock2", "alice", "--ttl", "10") // rev 5
	e.expect(1, "", "Error: key already exists (my-lock2) [5]\n", "kv", "mk", "my-lock2", "bob", "--ttl", "10")
	e.expect(0, "alice\n", "", "kv", "set", "my-lock2", "alice", "--ttl", "10", "--swap-with-value", "alice") // rev 6
	e.expect(1, "", "Error: compare failed ([bob != alice]) [6]\n", "kv", "set", "my-lock2", "bob", "--ttl", "10", "--swap-with-value", "bob")
	e.expect(0, "alice\n", "", "kv", "get", "my-lock2")
}

func TestCLIKVBasics(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "OK\n", "", "kv", "put", "jobs/a", "1")
	e.expect(0, "OK\n", "", "kv", "put", "jobs/b", "2")
	e.expect(0, "OK\n", "", "kv", "put", "other", "x")
	e.expect(0, "1\n", "", "kv", "get", "jobs/a")
	e.expect(1, "", "Error: key not found (jobs/c)\n", "kv", "get", "jobs/c")
	e.expect(0, "jobs/a\n1\njobs/b\n2\n", "", "kv", "range", "jobs/")
	e.expect(0, "jobs/a\n1\n", "", "kv", "range", "jobs/", "--limit", "1")
	e.expect(0, "", "", "kv", "range", "none/")
	// Keys have etcd's clock: a new store is at revision 1, so the three
	// puts were revisions 2, 3 and 4.
	e.expect(1, "", "Error: key not found (jobs/c) [4]\n", "kv", "set", "jobs/c", "3", "--swap-with-value", "x")
	// jobs/b was written at revision 3.
	e.expect(1, "", "Error: compare failed ([1 != 3]) [4]\n", "kv", "set", "jobs/b", "3", "--swap-with-revision", "1")
	e.expect(0, "3\n", "", "kv", "set", "jobs/b", "3", "--swap-with-revision", "3") // rev 5
	e.expect(0, "1\n", "", "kv", "del", "jobs/a")                                   // rev 6
	e.expect(0, "0\n", "", "kv", "del", "jobs/a")
	e.expect(0, "1\n", "", "kv", "del", "--prefix", "jobs/") // rev 7
	e.expect(0, "", "", "kv", "range", "jobs/")
	e.expect(0, "x\n", "", "kv", "get", "other")

	// A watch replays from a revision, then follows live changes, a key
	// expiring included, until interrupted.
	w := e.start("kv", "watch", "--prefix", "jobs/", "--rev", "1")
	replay := "PUT\njobs/a\n1\nPUT\njobs/b\n2\nPUT\njobs/b\n3\nDELETE\njobs/a\n\nDELETE\njobs/b\n\n"
	waitFor(t, 10*time.Second, "the watch to replay history", func() bool { return w.stdout.String() == replay })
	e.expect(0, "OK\n", "", "kv", "put", "jobs/t", "short-lived", "--ttl", "2")
	live := replay + "PUT\njobs/t\nshort-lived\nEXPIRE\njobs/t\n\n"
	waitFor(t, 10*time.Second, "the watch to see the put and the expiry", func() bool { return w.stdout.String() == live })
	e.expect(1, "", "Error: key not found (jobs/t)\n", "kv", "get", "jobs/t")
	w.signal(t, syscall.SIGINT)
	if code := w.wait(t, 10*time.Second); code != 0 || w.stderr.String() != "" {
		t.Errorf("kv watch after SIGINT: got = exit %d, stderr %q, expected: exit 0 and no error", code, w.stderr)
	}

	// A single-key watch sees only that key.
	k := e.start("kv", "watch", "other", "--rev", "1")
	waitFor(t, 10*time.Second, "the single-key watch", func() bool { return k.stdout.String() == "PUT\nother\nx\n" })
	k.signal(t, syscall.SIGTERM)
	if code := k.wait(t, 10*time.Second); code != 0 {
		t.Errorf("kv watch after SIGTERM: exit code got = %d, expected: 0", code)
	}
}
