//go:build linux

package e2e

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// --- inspecting ---

func TestCLIInspect(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "No leases found.\n", "", "get", "leases")
	e.expect(0, "No sessions found.\n", "", "get", "sessions")

	holder := e.start("lock", "--identity", "inspector", "-n", "ops", "report", "--", "sh", "-c", `echo $TENURE_FENCING_TOKEN > token; sleep 30`)
	token := e.waitFile("token", 10*time.Second)

	// Leases: kubectl's columns, NAMESPACE only across namespaces.
	e.expect(0, "No leases found.\n", "", "get", "leases")
	r := e.run("get", "leases", "-n", "ops")
	if !regexp.MustCompile(`^NAME +HOLDER +STATUS +AGE\nreport +inspector +Held +\d+s\n$`).MatchString(r.stdout) || r.code != 0 {
		t.Errorf("get leases -n ops: got = %v, expected: a row for report held by inspector", r)
	}
	r = e.run("get", "leases", "-A", "-o", "wide")
	wide := `^NAMESPACE +NAME +HOLDER +STATUS +AGE +TOKEN +TTL +EXPIRES-IN +MAX-HOLD +WAITERS +TRANSITIONS +VALUE\nops +report +inspector +Held +\d+s +` + token + ` +10s +\d+s +<none> +0 +0 +<none>\n$`
	if !regexp.MustCompile(wide).MatchString(r.stdout) || r.code != 0 {
		t.Errorf("get leases -A -o wide: got = %v, expected: to match %q", r, wide)
	}
	r = e.run("get", "lease", "report", "-n", "ops", "-o", "yaml")
	for _, want := range []string{"kind: Lease\n", "  holderIdentity: inspector\n", "  leaseDurationSeconds: 10\n", "  fencingToken: " + token + "\n", "  namespace: ops\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get lease report -o yaml: got = %v, expected: %q in it", r, want)
		}
	}
	r = e.run("get", "leases", "-A", "-o", "json")
	var list struct {
		Kind  string      `json:"kind"`
		Items []leaseJSON `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 1 || strconv.FormatInt(list.Items[0].Status.FencingToken, 10) != token {
		t.Errorf("get leases -A -o json: got = %v (%v), expected: a List with the one lease", r, err)
	}
	e.expect(0, "No leases found.\n", "", "get", "leases", "-A", "-l", "app=none")
	if r := e.run("get", "lease", "nope"); r.code != 1 || !strings.HasPrefix(r.stderr, "Error: ") {
		t.Errorf("get lease nope: got = %v, expected: exit 1 and an error", r)
	}

	// Sessions: the holder's session, with its lease.
	r = e.run("get", "sessions")
	sessions := `^ID +IDENTITY +TTL +AGE +LAST-HEARTBEAT +LEASES +WAITING\n\d+ +inspector +10s +\d+s +(<none>|\d+s ago) +ops/report +<none>\n$`
	if !regexp.MustCompile(sessions).MatchString(r.stdout) || r.code != 0 {
		t.Errorf("get sessions: got = %v, expected: to match %q", r, sessions)
	}
	r = e.run("get", "sessions", "-o", "json")
	var sl struct {
		Items []struct {
			Identity string   `json:"identity"`
			Leases   []string `json:"leases"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sl); err != nil || len(sl.Items) != 1 || sl.Items[0].Identity != "inspector" || strings.Join(sl.Items[0].Leases, ",") != "ops/report" {
		t.Errorf("get sessions -o json: got = %v (%v), expected: inspector holding ops/report", r, err)
	}

	// Validate: the holder's token is valid, an older one is not.
	e.expect(0, "valid: token "+token+" holds ops/report (holder inspector)\n", "", "validate", "-n", "ops", "report", "--token", token)
	e.expect(1, "not valid: the current holder of ops/report is inspector with token "+token+"\n", "", "validate", "-n", "ops", "report", "--token", "1")

	// Watch, in its table form: the grant, then its end.
	w := e.start("watch", "-A", "--rev", "1")
	acquired := regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  acquired +ops/report holder=inspector token=` + token + ` revision=` + token + `$`)
	waitFor(t, 10*time.Second, "tenure watch to print the grant", func() bool { return acquired.MatchString(w.stdout.String()) })
	holder.signal(t, syscall.SIGTERM)
	holder.wait(t, 10*time.Second)
	released := regexp.MustCompile(`(?m)^\S+  released +ops/report holder=inspector token=` + token + `( reason="[^"]*")? revision=\d+$`)
	waitFor(t, 10*time.Second, "tenure watch to print the release", func() bool { return released.MatchString(w.stdout.String()) })
	w.signal(t, syscall.SIGINT)
	if code := w.wait(t, 10*time.Second); code != 0 {
		t.Errorf("watch after SIGINT: exit code got = %d, expected: 0 (stderr %q)", code, w.stderr)
	}
	e.expect(0, "No sessions found.\n", "", "get", "sessions")
	r = e.run("get", "leases", "-n", "ops")
	if !regexp.MustCompile(`^NAME +HOLDER +STATUS +AGE\nreport +<none> +Released \d+s ago +<none>\n$`).MatchString(r.stdout) {
		t.Errorf("get leases -n ops after the release: got = %v, expected: report with no holder, released", r)
	}
}
