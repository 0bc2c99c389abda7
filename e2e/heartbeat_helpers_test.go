//go:build linux

package e2e

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nodeLeaseDoc is the part of an item of `tenure get leases -o json` that
// the heartbeat tests read.
type nodeLeaseDoc struct {
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		AcquireTime string `json:"acquireTime"`
		RenewTime   string `json:"renewTime"`
	} `json:"spec"`
	Status struct {
		Phase        string `json:"phase"`
		FencingToken int64  `json:"fencingToken"`
		LastGrant    *struct {
			HolderIdentity string `json:"holderIdentity"`
			FencingToken   int64  `json:"fencingToken"`
			RenewTime      string `json:"renewTime"`
			EndTime        string `json:"endTime"`
			Ended          string `json:"ended"`
			Reason         string `json:"reason"`
		} `json:"lastGrant"`
		GCAfter    string `json:"gcAfter"`
		DeleteTime string `json:"deleteTime"`
	} `json:"status"`
}

// leaseDocs runs `tenure get leases ARGS -o json` and returns the leases
// by name.
func (e *cliEnv) leaseDocs(args ...string) map[string]nodeLeaseDoc {
	e.t.Helper()
	args = append(append([]string{"get", "leases"}, args...), "-o", "json")
	r := e.run(args...)
	var list struct {
		Items []nodeLeaseDoc `json:"items"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil {
		e.t.Fatalf("tenure %s: got = %v, expected: a List of leases", strings.Join(args, " "), r)
	}
	out := make(map[string]nodeLeaseDoc, len(list.Items))
	for _, l := range list.Items {
		out[l.Metadata.Name] = l
	}
	return out
}

// leaseStatuses runs `tenure get leases ARGS` and returns the STATUS
// column by NAME. The table is tab-aligned, so every cell starts where its
// header does; STATUS may hold spaces ("Expired 3s ago").
func (e *cliEnv) leaseStatuses(args ...string) map[string]string {
	e.t.Helper()
	args = append([]string{"get", "leases"}, args...)
	r := e.run(args...)
	if r.code != 0 || r.stderr != "" {
		e.t.Fatalf("tenure %s: got = %v, expected: exit 0 and a table", strings.Join(args, " "), r)
	}
	out := map[string]string{}
	if r.stdout == "No leases found.\n" {
		return out
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	head := lines[0]
	status, age := strings.Index(head, "STATUS"), strings.Index(head, "AGE")
	if !strings.HasPrefix(head, "NAME ") || status < 0 || age < status {
		e.t.Fatalf("tenure %s: header got = %q, expected: NAME HOLDER STATUS AGE", strings.Join(args, " "), head)
	}
	for _, line := range lines[1:] {
		if len(line) <= age {
			e.t.Fatalf("tenure %s: row got = %q, expected: a cell under each header of %q", strings.Join(args, " "), line, head)
		}
		out[strings.Fields(line)[0]] = strings.TrimSpace(line[status:age])
	}
	return out
}

// sortedKeys are a map's keys, sorted.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// microTime parses a time of a lease document.
func microTime(t *testing.T, what, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s: got = %q, expected: an RFC 3339 time (%v)", what, s, err)
	}
	return ts
}

// watched parses what `tenure watch -o json` has printed so far, whole
// lines only.
func watched(t *testing.T, w *cliProc) []leaseEvent {
	t.Helper()
	var evs []leaseEvent
	for _, line := range strings.Split(w.stdout.String(), "\n") {
		if line == "" || !strings.HasSuffix(line, "}") {
			continue
		}
		var ev leaseEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("tenure watch -o json: line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// eventsOf are the events of one lease, in revision order.
func eventsOf(evs []leaseEvent, name string) []leaseEvent {
	return slices.DeleteFunc(slices.Clone(evs), func(ev leaseEvent) bool { return ev.Name != name })
}

// stop sends SIGTERM and expects the process to exit 0, as a heartbeat or
// a watch does when asked to stop.
func (p *cliProc) stop(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("tenure %s after SIGTERM: exit code got = %d, expected: 0 (stderr %q)", strings.Join(p.args, " "), code, p.stderr)
	}
}
