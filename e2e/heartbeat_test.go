//go:build linux

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Node heartbeats, end to end: `tenure heartbeat` processes are the
// kubelets of a small cluster, and `tenure get leases -n node-lease` and
// `tenure watch -n node-lease` are how an operator or a controller learns
// which nodes are alive and when the others went away.

const (
	hbNodes = 50
	// hbTTL is each heartbeat's session TTL; heartbeats go every hbTTL/3.
	hbTTL = 3 * time.Second
	// hbGCAfter is each heartbeat's --gc-after: how long a record stays
	// once its node is gone.
	hbGCAfter = 6 * time.Second
	// hbSlack allows for a heartbeat that went out a little late before
	// its process was killed, in the check on the test's clock. The check
	// against the server's own renewTime has none.
	hbSlack = hbTTL / 6
)

func hbZone(i int) string { return []string{"a", "b", "c"}[i%3] }

// TestHeartbeatNodeLeasesExpireAfterTheirTTLReleaseOnStopAndAreCollected
// runs 50 `tenure heartbeat node-NN --ttl 3s --gc-after 6s` processes
// against one server, with a `tenure watch -n node-lease` following from
// the start, and checks:
//
//   - all 50 node leases are held, with their zone labels;
//   - of 5 nodes killed with SIGKILL, none is shown expired before a full
//     TTL passed without a heartbeat (lastGrant.endTime − renewTime ≥ TTL)
//     nor, on the test's clock, before the kill plus 2/3 of the TTL (the
//     last heartbeat was at most TTL/3 before the kill); meanwhile the 45
//     others stay held by the grant they had. Then exactly those 5 say
//     "expired" (lastGrant.ended too), with deleteTime = endTime +
//     gcAfter, and the table says "Expired …" for them, "Held" for the 45;
//   - after gc_after the 5 records are gone and the 45 still held; the
//     watch saw each of the 5 expire and then be deleted no sooner than
//     gc_after later, and nothing but the grant of each of the 45;
//   - 5 nodes stopped with SIGTERM exit 0, and the very next read says
//     "released", not held and not expired; --live lists exactly the 40
//     left, with -l too.
func TestHeartbeatNodeLeasesExpireAfterTheirTTLReleaseOnStopAndAreCollected(t *testing.T) {
	t.Parallel() // its own processes, mostly waiting: it runs beside the package's other slow tests
	e := newCLIEnv(t)
	began := time.Now()
	watch := e.start("watch", "-n", "node-lease", "--rev", "1", "-o", "json")

	var all []string
	procs := map[string]*cliProc{}
	zones := map[string]string{}
	for i := range hbNodes {
		name := fmt.Sprintf("node-%02d", i)
		all = append(all, name)
		zones[name] = hbZone(i)
		procs[name] = e.start("heartbeat", name, "--ttl", hbTTL.String(), "--gc-after", hbGCAfter.String(), "-l", "zone="+hbZone(i))
	}
	killed := []string{"node-03", "node-13", "node-23", "node-33", "node-43"}
	stopped := []string{"node-07", "node-17", "node-27", "node-37", "node-47"}
	survivors := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return slices.Contains(killed, n) })
	remaining := slices.DeleteFunc(slices.Clone(survivors), func(n string) bool { return slices.Contains(stopped, n) })

	// tokens are the fencing tokens of the grants the heartbeats hold: a
	// node that lost its lease and took it again would have a new one.
	tokens := map[string]int64{}
	eventually(t, 30*time.Second, fmt.Sprintf("all %d node leases held", hbNodes), func() bool {
		for _, n := range all {
			if procs[n].exited() {
				t.Fatalf("tenure heartbeat %s: exited with %d before its lease was held; stderr %q", n, procs[n].code, procs[n].stderr)
			}
		}
		ls := e.leaseDocs("-n", "node-lease")
		for _, n := range all {
			if ls[n].Status.Phase != "held" {
				return false
			}
		}
		if len(ls) != hbNodes {
			t.Fatalf("node leases: got = %v, expected: exactly node-00..node-%02d", sortedKeys(ls), hbNodes-1)
		}
		for _, n := range all {
			if z := ls[n].Metadata.Labels["zone"]; z != zones[n] {
				t.Errorf("%s: label zone got = %q, expected: %q", n, z, zones[n])
			}
			tokens[n] = ls[n].Status.FencingToken
		}
		return true
	})
	t.Logf("%d node leases held %v after start", hbNodes, time.Since(began).Round(time.Millisecond))

	// stillHeld checks that each of want is held by the grant it had.
	stillHeld := func(ls map[string]nodeLeaseDoc, want []string, when string) {
		t.Helper()
		for _, n := range want {
			if l, ok := ls[n]; !ok || l.Status.Phase != "held" || l.Status.FencingToken != tokens[n] {
				t.Fatalf("%s, %s: got = phase %q token %d (listed %v), expected: held with token %d; heartbeat stderr %q",
					when, n, l.Status.Phase, l.Status.FencingToken, ok, tokens[n], procs[n].stderr)
			}
		}
	}

	// --- SIGKILL: expired after the TTL, never before ---

	// The nodes to kill first beat once after taking their leases, as
	// running nodes do, so that the kill finds them in their steady
	// state. (Before that, renewTime is the session's opening, a moment
	// before the acquire: the expiry is timed from it.)
	eventually(t, 10*time.Second, "a heartbeat after the acquire from each node to kill", func() bool {
		ls := e.leaseDocs("-n", "node-lease")
		stillHeld(ls, all, "before the kill")
		for _, n := range killed {
			acquired := microTime(t, n+" spec.acquireTime", ls[n].Spec.AcquireTime)
			if renewed := microTime(t, n+" spec.renewTime", ls[n].Spec.RenewTime); !renewed.After(acquired) {
				return false
			}
		}
		return true
	})
	killedAt := map[string]time.Time{}
	for _, n := range killed {
		killedAt[n] = time.Now()
		procs[n].signal(t, syscall.SIGKILL)
	}
	for _, n := range killed {
		if code := procs[n].wait(t, 10*time.Second); code != 128+int(syscall.SIGKILL) {
			t.Fatalf("tenure heartbeat %s after SIGKILL: exit code got = %d, expected: %d", n, code, 128+int(syscall.SIGKILL))
		}
	}
	var expired map[string]nodeLeaseDoc
	eventually(t, hbTTL+15*time.Second, "the killed nodes' leases expired", func() bool {
		ls := e.leaseDocs("-n", "node-lease")
		seen := time.Now() // the read had ended: whatever it shows happened before
		stillHeld(ls, survivors, "while the killed nodes expire")
		done := true
		for _, n := range killed {
			l := ls[n]
			switch l.Status.Phase {
			case "held":
				if l.Status.FencingToken != tokens[n] {
					t.Fatalf("%s after SIGKILL: token got = %d, expected: %d, the dead node's grant", n, l.Status.FencingToken, tokens[n])
				}
				done = false
			case "expired":
				checkExpired(t, n, l, tokens[n])
				if earliest := killedAt[n].Add(hbTTL - hbTTL/3 - hbSlack); seen.Before(earliest) {
					t.Fatalf("%s: shown expired %v after its SIGKILL, expected: not before %v (TTL %v less the heartbeat interval %v, less %v slack)",
						n, seen.Sub(killedAt[n]).Round(time.Millisecond), earliest.Sub(killedAt[n]), hbTTL, hbTTL/3, hbSlack)
				}
			default:
				t.Fatalf("%s after SIGKILL: phase got = %q, expected: held until its TTL passes, then expired", n, l.Status.Phase)
			}
		}
		expired = ls
		return done
	})
	t.Logf("killed nodes expired %v after the kill", time.Since(killedAt[killed[0]]).Round(time.Millisecond))
	var gotExpired []string
	for _, n := range sortedKeys(expired) {
		if expired[n].Status.Phase == "expired" {
			gotExpired = append(gotExpired, n)
		}
	}
	if !slices.Equal(gotExpired, killed) {
		t.Errorf("expired node leases: got = %v, expected: %v, the killed ones", gotExpired, killed)
	}
	for _, n := range killed {
		l := expired[n]
		if l.Status.GCAfter != hbGCAfter.String() {
			t.Errorf("%s: status.gcAfter got = %q, expected: %q", n, l.Status.GCAfter, hbGCAfter)
		}
		end := microTime(t, n+" lastGrant.endTime", l.Status.LastGrant.EndTime)
		if del := microTime(t, n+" status.deleteTime", l.Status.DeleteTime); del.Sub(end) != hbGCAfter {
			t.Errorf("%s: deleteTime − endTime got = %v, expected: gcAfter %v (idle since it expired)", n, del.Sub(end), hbGCAfter)
		}
	}
	statuses := e.leaseStatuses("-n", "node-lease")
	var expiredRows, heldRows []string
	for _, n := range sortedKeys(statuses) {
		switch s := statuses[n]; {
		case s == "Held":
			heldRows = append(heldRows, n)
		case strings.HasPrefix(s, "Expired ") && strings.HasSuffix(s, " ago"):
			expiredRows = append(expiredRows, n)
		default:
			t.Errorf("get leases -n node-lease, %s: STATUS got = %q, expected: Held or Expired … ago", n, s)
		}
	}
	if !slices.Equal(expiredRows, killed) || !slices.Equal(heldRows, survivors) {
		t.Errorf("get leases -n node-lease: got = Expired %v and Held %v, expected: Expired %v and Held the other %d",
			expiredRows, heldRows, killed, len(survivors))
	}

	// --- gc_after: the expired records are deleted, the held ones stay ---

	eventually(t, hbGCAfter+15*time.Second, "the expired records collected", func() bool {
		ls := e.leaseDocs("-n", "node-lease")
		stillHeld(ls, survivors, "while the expired records are collected")
		done := true
		for _, n := range killed {
			if l, ok := ls[n]; ok {
				if l.Status.Phase != "expired" {
					t.Fatalf("%s before its collection: phase got = %q, expected: expired", n, l.Status.Phase)
				}
				done = false
			}
		}
		return done
	})
	t.Logf("expired records collected %v after the kill", time.Since(killedAt[killed[0]]).Round(time.Millisecond))
	var evs []leaseEvent
	waitFor(t, 10*time.Second, "tenure watch to print the deletions", func() bool {
		evs = watched(t, watch)
		for _, n := range killed {
			if _, ok := findEvent(eventsOf(evs, n), "deleted", n); !ok {
				return false
			}
		}
		return true
	})
	for _, n := range killed {
		got := eventsOf(evs, n)
		var types []string
		for _, ev := range got {
			types = append(types, ev.Type)
		}
		if !slices.Equal(types, []string{"acquired", "expired", "deleted"}) {
			t.Errorf("watch, %s: events got = %v, expected: acquired, expired, deleted", n, types)
			continue
		}
		exp, del := got[1], got[2]
		if exp.Holder != n || exp.Token != tokens[n] || del.Holder != n || del.Token != tokens[n] {
			t.Errorf("watch, %s: got = expired by %q token %d, deleted with %q token %d, expected: %s with token %d in both",
				n, exp.Holder, exp.Token, del.Holder, del.Token, n, tokens[n])
		}
		if idle := del.Time.Sub(exp.Time); idle < hbGCAfter {
			t.Errorf("watch, %s: deleted %v after it expired, expected: not before gc_after %v", n, idle, hbGCAfter)
		}
	}
	for _, n := range survivors {
		if got := eventsOf(evs, n); len(got) != 1 || got[0].Type != "acquired" || got[0].Token != tokens[n] {
			t.Errorf("watch, %s: events got = %+v, expected: only its acquisition with token %d", n, got, tokens[n])
		}
	}

	// --- SIGTERM: released at once ---

	for _, n := range stopped {
		procs[n].stop(t)
		if want := "tenure: node-lease/" + n + " released\n"; !strings.HasSuffix(procs[n].stderr.String(), want) {
			t.Errorf("tenure heartbeat %s after SIGTERM: stderr got = %q, expected: to end with %q", n, procs[n].stderr, want)
		}
	}
	// The heartbeats have exited: the reads below come after their
	// sessions were closed, and well within a TTL of it.
	ls := e.leaseDocs("-n", "node-lease")
	stillHeld(ls, remaining, "after the SIGTERMs")
	for _, n := range stopped {
		l := ls[n]
		lg := l.Status.LastGrant
		if l.Status.Phase != "released" || lg == nil || lg.Ended != "released" || lg.HolderIdentity != n || lg.FencingToken != tokens[n] {
			t.Errorf("%s right after its heartbeat exited on SIGTERM: got = phase %q, lastGrant %+v, expected: released, its grant (%s, token %d) ended \"released\"",
				n, l.Status.Phase, lg, n, tokens[n])
		}
	}
	if got := sortedKeys(e.leaseDocs("-n", "node-lease", "--live")); !slices.Equal(got, remaining) {
		t.Errorf("get leases -n node-lease --live -o json: got = %v, expected: the %d nodes still running %v", got, len(remaining), remaining)
	}
	live := e.leaseStatuses("-n", "node-lease", "--live")
	if got := sortedKeys(live); !slices.Equal(got, remaining) {
		t.Errorf("get leases -n node-lease --live: got = %v, expected: the %d nodes still running %v", got, len(remaining), remaining)
	}
	for n, s := range live {
		if s != "Held" {
			t.Errorf("get leases -n node-lease --live, %s: STATUS got = %q, expected: Held", n, s)
		}
	}
	zoneA := slices.DeleteFunc(slices.Clone(remaining), func(n string) bool { return zones[n] != "a" })
	if got := sortedKeys(e.leaseStatuses("-n", "node-lease", "--live", "-l", "zone=a")); !slices.Equal(got, zoneA) {
		t.Errorf("get leases -n node-lease --live -l zone=a: got = %v, expected: %v", got, zoneA)
	}
	waitFor(t, 10*time.Second, "tenure watch to print the releases", func() bool {
		evs = watched(t, watch)
		for _, n := range stopped {
			if _, ok := findEvent(eventsOf(evs, n), "released", n); !ok {
				return false
			}
		}
		return true
	})
	for _, n := range stopped {
		if ev, _ := findEvent(eventsOf(evs, n), "released", n); ev.Token != tokens[n] {
			t.Errorf("watch, %s: released token got = %d, expected: %d", n, ev.Token, tokens[n])
		}
	}
	watch.stop(t)
	t.Logf("done in %v", time.Since(began).Round(time.Millisecond))
}

// checkExpired checks the record of a node lease shown expired: its last
// grant is the dead node's, ended "expired", a full TTL or more after the
// last heartbeat the server had from it.
func checkExpired(t *testing.T, name string, l nodeLeaseDoc, token int64) {
	t.Helper()
	lg := l.Status.LastGrant
	if lg == nil || lg.HolderIdentity != name || lg.FencingToken != token || lg.Ended != "expired" {
		t.Fatalf("%s shown expired: lastGrant got = %+v, expected: %s's grant with token %d, ended \"expired\"", name, lg, name, token)
	}
	renew := microTime(t, name+" lastGrant.renewTime", lg.RenewTime)
	end := microTime(t, name+" lastGrant.endTime", lg.EndTime)
	// Both are cut to microseconds, which may take up to 1µs off the
	// difference.
	if end.Sub(renew) < hbTTL-time.Microsecond {
		t.Fatalf("%s: expired %v after its last heartbeat (renewTime %s, endTime %s), expected: at least the TTL %v",
			name, end.Sub(renew), lg.RenewTime, lg.EndTime, hbTTL)
	}
}

// TestHeartbeatIdentityLeasesListedLiveBySelector runs three `tenure
// heartbeat -n identity` processes, the identity leases of two api
// instances and a db, and checks that `get leases -n identity -l app=api
// --live` lists exactly the two api ones, and after one of them is
// stopped with SIGTERM exactly the other, while without --live the
// stopped one is still listed as released.
func TestHeartbeatIdentityLeasesListedLiveBySelector(t *testing.T) {
	e := newCLIEnv(t)
	procs := map[string]*cliProc{}
	for _, nl := range [][2]string{{"api-1", "app=api"}, {"api-2", "app=api"}, {"db-1", "app=db"}} {
		procs[nl[0]] = e.start("heartbeat", nl[0], "-n", "identity", "--ttl", "10s", "-l", nl[1])
	}
	eventually(t, 20*time.Second, "the three identity leases held", func() bool {
		for n, p := range procs {
			if p.exited() {
				t.Fatalf("tenure heartbeat %s -n identity: exited with %d; stderr %q", n, p.code, p.stderr)
			}
		}
		ls := e.leaseDocs("-n", "identity")
		return len(ls) == 3 && ls["api-1"].Status.Phase == "held" && ls["api-2"].Status.Phase == "held" && ls["db-1"].Status.Phase == "held"
	})
	e.expect(0, "No leases found.\n", "", "get", "leases", "-n", "node-lease")

	expectStatuses := func(want map[string]string, args ...string) {
		t.Helper()
		args = append([]string{"-n", "identity"}, args...)
		got := e.leaseStatuses(args...)
		for n, s := range got {
			if strings.HasPrefix(s, "Released ") && strings.HasSuffix(s, " ago") {
				got[n] = "Released"
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("get leases %s: got = %v, expected: %v", strings.Join(args, " "), got, want)
		}
	}
	expectStatuses(map[string]string{"api-1": "Held", "api-2": "Held"}, "-l", "app=api", "--live")
	expectStatuses(map[string]string{"db-1": "Held"}, "-l", "app=db", "--live")

	procs["api-1"].stop(t)
	expectStatuses(map[string]string{"api-2": "Held"}, "-l", "app=api", "--live")
	expectStatuses(map[string]string{"api-1": "Released", "api-2": "Held"}, "-l", "app=api")
	expectStatuses(map[string]string{"api-2": "Held", "db-1": "Held"}, "--live")
	if got := sortedKeys(e.leaseDocs("-n", "identity", "-l", "app=api", "--live")); !slices.Equal(got, []string{"api-2"}) {
		t.Errorf("get leases -n identity -l app=api --live -o json: got = %v, expected: [api-2]", got)
	}
}
