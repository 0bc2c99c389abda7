package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// now is the fixed "now" of every golden file, so that ages and
// expiries print the same on every run.
var now = time.Date(2026, 11, 22, 3, 20, 0, 0, time.UTC)

// fixtureLeases covers each shape a row can take: a held mutex with a
// waiter and a lock-delay, a full semaphore, a leader with a value,
// labels and a preferred holder held for days, a lease whose holder
// expired into a lock-delay, and a released node lease that will be
// collected.
func fixtureLeases() []client.Lease {
	return []client.Lease{
		{
			Namespace: "default", Name: "nightly-report", Capacity: 1,
			Holder: "alice", Token: 42, LeaseDuration: 10 * time.Second,
			AcquireTime: now.Add(-3*time.Minute - 12*time.Second), RenewTime: now.Add(-2 * time.Second),
			Transitions: 3, LockDelay: 3 * time.Second, CreateRevision: 7, ModRevision: 42, Status: "held", MaxHold: 3 * time.Minute,
			Holders: []client.GrantInfo{{SessionID: 11, Holder: "alice", Token: 42,
				AcquireTime: now.Add(-3*time.Minute - 12*time.Second), RenewTime: now.Add(-2 * time.Second)}},
			Waiters: []client.Waiter{{SessionID: 12, Holder: "bob", Since: now.Add(-90 * time.Second)}},
		},
		{
			Namespace: "default", Name: "render-slots", Capacity: 3,
			Holder: "render-1", Token: 50, LeaseDuration: 30 * time.Second,
			AcquireTime: now.Add(-45 * time.Second), RenewTime: now.Add(-5 * time.Second),
			Transitions: 9, Labels: map[string]string{"tier": "batch", "app": "render"}, CreateRevision: 20, ModRevision: 52, Status: "held",
			Holders: []client.GrantInfo{
				{SessionID: 21, Holder: "render-1", Token: 50, AcquireTime: now.Add(-45 * time.Second), RenewTime: now.Add(-5 * time.Second)},
				{SessionID: 22, Holder: "render-2", Token: 51, AcquireTime: now.Add(-30 * time.Second)},
				{SessionID: 23, Holder: "render-3", Token: 52, AcquireTime: now.Add(-15 * time.Second), RenewTime: now.Add(-1 * time.Second)},
			},
		},
		{
			Namespace: "prod", Name: "scheduler", Capacity: 1,
			Holder: "sched-1", Token: 1234, Value: "10.0.0.7:8080", LeaseDuration: 15 * time.Second,
			AcquireTime: now.Add(-50 * time.Hour), RenewTime: now.Add(-4 * time.Second),
			Transitions: 1, Labels: map[string]string{"app": "scheduler"}, CreateRevision: 3, ModRevision: 1234, Status: "held",
			PreferredHolder: "sched-2", MaxHold: 72 * time.Hour,
			Holders: []client.GrantInfo{{SessionID: 5, Holder: "sched-1", Token: 1234, Value: "10.0.0.7:8080", Exclusive: true,
				AcquireTime: now.Add(-50 * time.Hour), RenewTime: now.Add(-4 * time.Second), StepDown: "preferred holder sched-2 is waiting"}},
		},
		{
			Namespace: "prod", Name: "payments-batch", Capacity: 1,
			Transitions: 4, LockDelay: 15 * time.Second, LockDelayOn: true, CreateRevision: 30, ModRevision: 1300, Status: "expired",
			Last: &client.EndedGrant{SessionID: 31, Holder: "batch-7", Token: 1290, AcquireTime: now.Add(-20 * time.Minute),
				RenewTime: now.Add(-50 * time.Second), EndTime: now.Add(-35 * time.Second), Ended: "expired", Reason: "session expired"},
		},
		{
			Namespace: "node-lease", Name: "worker-3", Capacity: 1,
			Transitions: 2, CreateRevision: 60, ModRevision: 1310, Status: "released",
			Labels: map[string]string{"zone": "b"}, GCAfter: time.Hour, DeleteTime: now.Add(58 * time.Minute),
			Last: &client.EndedGrant{SessionID: 40, Holder: "worker-3", Token: 1100, AcquireTime: now.Add(-3 * time.Hour),
				RenewTime: now.Add(-2 * time.Minute), EndTime: now.Add(-2 * time.Minute), Ended: "released", Reason: "session closed"},
		},
	}
}

func fixtureSessions() []client.SessionInfo {
	return []client.SessionInfo{
		{ID: 11, Identity: "alice", TTL: 10 * time.Second, OpenTime: now.Add(-4 * time.Minute), LastHeartbeat: now.Add(-2 * time.Second),
			Leases: []string{"default/nightly-report"}},
		{ID: 12, Identity: "bob", TTL: 10 * time.Second, Labels: map[string]string{"team": "data"}, OpenTime: now.Add(-95 * time.Second),
			LastHeartbeat: now.Add(-3 * time.Second), Waiting: []string{"default/nightly-report"}, Keys: 2},
		{ID: 13, Identity: "fresh", TTL: 2 * time.Minute, OpenTime: now},
	}
}

// golden compares got with testdata/name, or rewrites the file with
// -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/cli -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: got =\n%s\nexpected:\n%s", path, got, want)
	}
}

func TestPrintLeasesGolden(t *testing.T) {
	leases := fixtureLeases()
	tests := []struct {
		golden        string
		leases        []client.Lease
		format        string
		allNamespaces bool
	}{
		{"leases_table.golden", leases[:2], "", false},
		{"leases_table_explicit.golden", leases[:2], "table", false},
		{"leases_table_all_namespaces.golden", leases, "", true},
		{"leases_wide.golden", leases[:2], "wide", false},
		{"leases_wide_all_namespaces.golden", leases, "wide", true},
		{"leases_json.golden", leases, "json", true},
		{"leases_yaml.golden", leases, "yaml", true},
		{"leases_empty_table.golden", nil, "", false},
		{"leases_empty_json.golden", nil, "json", false},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printLeases(&buf, tt.leases, tt.format, tt.allNamespaces, now); err != nil {
				t.Fatalf("printLeases: %v", err)
			}
			golden(t, tt.golden, buf.Bytes())
		})
	}
}

// The table form must match what `-o table` prints, column for column.
func TestPrintLeasesTableIsDefault(t *testing.T) {
	var def, table bytes.Buffer
	if err := printLeases(&def, fixtureLeases(), "", true, now); err != nil {
		t.Fatal(err)
	}
	if err := printLeases(&table, fixtureLeases(), "table", true, now); err != nil {
		t.Fatal(err)
	}
	if def.String() != table.String() {
		t.Errorf("-o table: got =\n%s\nexpected the default:\n%s", table.String(), def.String())
	}
}

func TestPrintDocGolden(t *testing.T) {
	leases := fixtureLeases()
	for _, tt := range []struct {
		golden string
		lease  client.Lease
		format string
	}{
		{"lease_held_yaml.golden", leases[0], "yaml"},
		{"lease_held_json.golden", leases[0], "json"},
		{"lease_semaphore_yaml.golden", leases[1], "yaml"},
		{"lease_leader_yaml.golden", leases[2], "yaml"},
		{"lease_free_yaml.golden", leases[3], "yaml"},
		{"lease_free_json.golden", leases[3], "json"},
		{"lease_released_yaml.golden", leases[4], "yaml"},
	} {
		t.Run(tt.golden, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printDoc(&buf, tt.format, toLeaseDoc(tt.lease)); err != nil {
				t.Fatalf("printDoc: %v", err)
			}
			golden(t, tt.golden, buf.Bytes())
		})
	}
}

func TestPrintSessionsGolden(t *testing.T) {
	for _, tt := range []struct {
		golden   string
		sessions []client.SessionInfo
		format   string
	}{
		{"sessions_table.golden", fixtureSessions(), ""},
		{"sessions_json.golden", fixtureSessions(), "json"},
		{"sessions_yaml.golden", fixtureSessions(), "yaml"},
		{"sessions_empty_table.golden", nil, ""},
	} {
		t.Run(tt.golden, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printSessions(&buf, tt.sessions, tt.format, now); err != nil {
				t.Fatalf("printSessions: %v", err)
			}
			golden(t, tt.golden, buf.Bytes())
		})
	}
}

func TestToLeaseDoc(t *testing.T) {
	leases := fixtureLeases()
	tests := []struct {
		name  string
		lease client.Lease
		check func(t *testing.T, d leaseDoc)
	}{
		{"a held lease has Kubernetes' spec fields and its token as status", leases[0], func(t *testing.T, d leaseDoc) {
			if d.Spec.HolderIdentity == nil || *d.Spec.HolderIdentity != "alice" {
				t.Errorf("spec.holderIdentity: got = %v, expected: alice", d.Spec.HolderIdentity)
			}
			if d.Spec.LeaseDurationSeconds == nil || *d.Spec.LeaseDurationSeconds != 10 {
				t.Errorf("spec.leaseDurationSeconds: got = %v, expected: 10", d.Spec.LeaseDurationSeconds)
			}
			if d.Status.FencingToken != 42 || d.Metadata.ResourceVersion != "42" {
				t.Errorf("token, resourceVersion: got = %d, %q, expected: 42, \"42\"", d.Status.FencingToken, d.Metadata.ResourceVersion)
			}
			if len(d.Status.Waiters) != 1 || d.Status.Waiters[0].HolderIdentity != "bob" {
				t.Errorf("status.waiters: got = %+v, expected: bob", d.Status.Waiters)
			}
			if d.Status.LockDelay != "3s" || d.Status.LockDelayActive {
				t.Errorf("lock-delay: got = %q active %v, expected: \"3s\" inactive", d.Status.LockDelay, d.Status.LockDelayActive)
			}
		}},
		{"a free lease has no holder fields and an empty, not null, waiter list", leases[3], func(t *testing.T, d leaseDoc) {
			if d.Spec.HolderIdentity != nil || d.Spec.AcquireTime != nil || d.Spec.RenewTime != nil || d.Spec.LeaseDurationSeconds != nil {
				t.Errorf("spec: got = %+v, expected: no holder fields", d.Spec)
			}
			if d.Status.Waiters == nil || len(d.Status.Waiters) != 0 {
				t.Errorf("status.waiters: got = %#v, expected: an empty list", d.Status.Waiters)
			}
			if !d.Status.LockDelayActive {
				t.Errorf("status.lockDelayActive: got = false, expected: true")
			}
		}},
		{"a grant without a renew time leaves renewTime out", leases[1], func(t *testing.T, d leaseDoc) {
			if got := d.Status.Holders[1].RenewTime; got != "" {
				t.Errorf("holders[1].renewTime: got = %q, expected: empty", got)
			}
			if got := d.Status.Holders[0].RenewTime; got != "2026-11-22T03:19:55.000000Z" {
				t.Errorf("holders[0].renewTime: got = %q, expected: 2026-11-22T03:19:55.000000Z", got)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, toLeaseDoc(tt.lease)) })
	}
}

func TestPrintUnknownFormatIsUsageError(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"printLeases", printLeases(&bytes.Buffer{}, fixtureLeases(), "xml", false, now)},
		{"printSessions", printSessions(&bytes.Buffer{}, fixtureSessions(), "xml", now)},
		{"printDoc", printDoc(&bytes.Buffer{}, "xml", toLeaseDoc(fixtureLeases()[0]))},
	} {
		var ee *exitError
		if !errors.As(tt.err, &ee) || ee.code != ExitUsage {
			t.Errorf("%s -o xml: got = %v, expected: a usage error (exit %d)", tt.name, tt.err, ExitUsage)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{999 * time.Millisecond, "0s"},
		{45 * time.Second, "45s"},
		{time.Minute, "60s"},
		{119 * time.Second, "119s"},
		{2 * time.Minute, "2m"},
		{3*time.Minute + 12*time.Second, "3m12s"},
		{9*time.Minute + 59*time.Second, "9m59s"},
		{10 * time.Minute, "10m"},
		{179 * time.Minute, "179m"},
		{3 * time.Hour, "3h"},
		{5*time.Hour + 30*time.Minute, "5h30m"},
		{47 * time.Hour, "47h"},
		{48 * time.Hour, "2d"},
		{50 * time.Hour, "2d2h"},
		{30 * 24 * time.Hour, "30d"},
		{3 * 365 * 24 * time.Hour, "3y"},
	} {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%v): got = %q, expected: %q", tt.d, got, tt.want)
		}
	}
}

func TestHolderList(t *testing.T) {
	grants := func(names ...string) []client.GrantInfo {
		var gs []client.GrantInfo
		for _, n := range names {
			gs = append(gs, client.GrantInfo{Holder: n})
		}
		return gs
	}
	for _, tt := range []struct {
		name  string
		lease client.Lease
		want  string
	}{
		{"a mutex shows its holder", client.Lease{Holder: "a", Holders: grants("a")}, "a"},
		{"two holders are both shown", client.Lease{Holder: "a", Holders: grants("a", "b")}, "a,b"},
		{"beyond two the rest are counted", client.Lease{Holder: "a", Holders: grants("a", "b", "c", "d")}, "a,b (+2)"},
	} {
		if got := holderList(tt.lease); got != tt.want {
			t.Errorf("%s: got = %q, expected: %q", tt.name, got, tt.want)
		}
	}
}

func TestPrintLeaseEvent(t *testing.T) {
	ev := client.LeaseEvent{Revision: 43, Type: "revoked", Namespace: "default", Name: "nightly-report",
		SessionID: 11, Holder: "alice", Token: 42, Reason: "wedged", Time: now.Add(1500 * time.Millisecond)}
	for _, tt := range []struct {
		name   string
		ev     client.LeaseEvent
		format string
		want   string
	}{
		{"a table line has the time, type, lease, holder, token, reason and revision", ev, "",
			"2026-11-22T03:20:01.500Z  revoked          default/nightly-report holder=alice token=42 reason=\"wedged\" revision=43\n"},
		{"a value is quoted", client.LeaseEvent{Revision: 5, Type: "value-set", Namespace: "prod", Name: "scheduler", Holder: "s", Token: 4, Value: "10.0.0.7:8080", Time: now}, "",
			"2026-11-22T03:20:00.000Z  value-set        prod/scheduler holder=s token=4 value=\"10.0.0.7:8080\" revision=5\n"},
		{"a lock-delay end has no holder or token", client.LeaseEvent{Revision: 9, Type: "lock-delay-ended", Namespace: "default", Name: "x", Time: now}, "",
			"2026-11-22T03:20:00.000Z  lock-delay-ended default/x revision=9\n"},
		{"-o json prints one object per line", ev, "json",
			`{"revision":43,"time":"2026-11-22T03:20:01.5Z","type":"revoked","namespace":"default","name":"nightly-report","holder":"alice","sessionID":11,"token":42,"reason":"wedged"}` + "\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printLeaseEvent(&buf, tt.ev, tt.format); err != nil {
				t.Fatal(err)
			}
			if buf.String() != tt.want {
				t.Errorf("got = %q, expected: %q", buf.String(), tt.want)
			}
		})
	}
}

func TestFormatLeader(t *testing.T) {
	for _, tt := range []struct {
		name string
		l    client.Leader
		want string
	}{
		{"a leader shows identity, quoted value and token", client.Leader{Identity: "a", Value: "h:1", Token: 7, Revision: 8}, `revision=8 leader=a value="h:1" token=7`},
		{"an empty value is shown as empty quotes", client.Leader{Identity: "a", Token: 7, Revision: 7}, `revision=7 leader=a value="" token=7`},
		{"no leader is <none>", client.Leader{Revision: 9}, `revision=9 leader=<none>`},
	} {
		if got := formatLeader(tt.l); got != tt.want {
			t.Errorf("%s: got = %q, expected: %q", tt.name, got, tt.want)
		}
	}
}

func TestPrintKeyEvent(t *testing.T) {
	var buf bytes.Buffer
	printKeyEvent(&buf, client.WatchEvent{Type: client.EventPut, KV: client.KeyValue{Key: "k", Value: "v"}})
	printKeyEvent(&buf, client.WatchEvent{Type: client.EventDelete, KV: client.KeyValue{Key: "k"}})
	printKeyEvent(&buf, client.WatchEvent{Type: client.EventExpire, KV: client.KeyValue{Key: "t"}})
	if want := "PUT\nk\nv\nDELETE\nk\n\nEXPIRE\nt\n\n"; buf.String() != want {
		t.Errorf("got = %q, expected: %q", buf.String(), want)
	}
}

func TestPrintMembers(t *testing.T) {
	members := []client.Member{
		{ID: "node1", APIAddress: "10.0.0.5:7480", PeerAddress: "10.0.0.5:7481", Voter: true, Leader: true,
			MemberStatus: client.MemberStatus{Role: "leader", LeaderID: "node1", Term: 4, CommitIndex: 120, AppliedIndex: 120, LastLogIndex: 120, Ready: true, Version: 2, ClusterVersion: 1}},
		{ID: "node2", APIAddress: "10.0.0.6:7480", PeerAddress: "10.0.0.6:7481", Voter: true, Self: true,
			MemberStatus: client.MemberStatus{Role: "follower", LeaderID: "node1", Term: 4, CommitIndex: 120, AppliedIndex: 118, LastLogIndex: 120, LastContact: 42 * time.Millisecond, Ready: true, Version: 2, ClusterVersion: 2}},
		{ID: "node3", APIAddress: "10.0.0.7:7480", PeerAddress: "10.0.0.7:7481", Voter: true, Err: "unreachable: connection refused"},
		{ID: "node4", PeerAddress: "10.0.0.8:7481", Err: "has not advertised an API address yet"},
	}
	tests := []struct {
		format, want string
	}{
		{"", "" +
			"ID      API-ADDRESS     PEER-ADDRESS    ROLE                  VOTER\n" +
			"node1   10.0.0.5:7480   10.0.0.5:7481   leader                yes\n" +
			"node2   10.0.0.6:7480   10.0.0.6:7481   follower (answered)   yes\n" +
			"node3   10.0.0.7:7480   10.0.0.7:7481   unreachable           yes\n" +
			"node4   <none>          10.0.0.8:7481   unreachable           no\n"},
		{"wide", "" +
			"ID      API-ADDRESS     PEER-ADDRESS    ROLE                  VOTER   TERM        COMMIT      APPLIED     LAST-CONTACT   VERSION\n" +
			"node1   10.0.0.5:7480   10.0.0.5:7481   leader                yes     4           120         120         <none>         2 (cluster 1)\n" +
			"node2   10.0.0.6:7480   10.0.0.6:7481   follower (answered)   yes     4           120         118         42ms ago       2\n" +
			"node3   10.0.0.7:7480   10.0.0.7:7481   unreachable           yes     <unknown>   <unknown>   <unknown>   <unknown>      <unknown>\n" +
			"node4   <none>          10.0.0.8:7481   unreachable           no      <unknown>   <unknown>   <unknown>   <unknown>      <unknown>\n"},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := printMembers(&buf, members, tt.format); err != nil {
			t.Fatal(err)
		}
		if got := buf.String(); got != tt.want {
			t.Errorf("-o %q: got =\n%s\nexpected:\n%s", tt.format, got, tt.want)
		}
	}
}

// A leader that the answering node cannot reach is still marked as the
// leader it believes in.
func TestMemberRoleMarksAnUnreachableLeader(t *testing.T) {
	if got := memberRole(client.Member{Leader: true, Err: "unreachable"}); got != "leader, unreachable" {
		t.Errorf("got = %q, expected: %q", got, "leader, unreachable")
	}
}

func TestPrintMembersJSONHasEveryField(t *testing.T) {
	members := []client.Member{
		{ID: "node1", APIAddress: "10.0.0.5:7480", PeerAddress: "10.0.0.5:7481", Voter: true, Leader: true, Self: true,
			MemberStatus: client.MemberStatus{Role: "leader", LeaderID: "node1", LeaderAPIAddress: "10.0.0.5:7480", Term: 4, CommitIndex: 120, AppliedIndex: 119, LastLogIndex: 121, Revision: 77, Ready: true}},
		{ID: "node3", APIAddress: "10.0.0.7:7480", PeerAddress: "10.0.0.7:7481", Voter: true, Err: "unreachable: connection refused"},
	}
	var buf bytes.Buffer
	if err := printMembers(&buf, members, "json"); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, buf.String())
	}
	if len(doc.Items) != 2 {
		t.Fatalf("items got = %d, expected: 2\n%s", len(doc.Items), buf.String())
	}
	want := map[string]any{
		"id": "node1", "apiAddress": "10.0.0.5:7480", "peerAddress": "10.0.0.5:7481", "voter": true, "leader": true, "self": true,
	}
	for k, v := range want {
		if doc.Items[0][k] != v {
			t.Errorf("node1 %s got = %v, expected: %v", k, doc.Items[0][k], v)
		}
	}
	status, _ := doc.Items[0]["status"].(map[string]any)
	for k, v := range map[string]any{"role": "leader", "leaderID": "node1", "leaderAPIAddress": "10.0.0.5:7480", "term": 4.0,
		"commitIndex": 120.0, "appliedIndex": 119.0, "lastLogIndex": 121.0, "lastContact": "0s", "revision": 77.0, "ready": true} {
		if status[k] != v {
			t.Errorf("node1 status.%s got = %v, expected: %v", k, status[k], v)
		}
	}
	if _, ok := doc.Items[1]["status"]; ok || doc.Items[1]["error"] != "unreachable: connection refused" {
		t.Errorf("node3 got = %v, expected: no status, and the error", doc.Items[1])
	}
}
