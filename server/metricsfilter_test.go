package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// /metrics shows a namespace's per-lease series only to principals that
// may read that namespace, as every other surface does; the rest of the
// page to whoever may scrape.
func TestMetricsShowLeaseSeriesOnlyOfNamespacesTheScraperMayRead(t *testing.T) {
	as := startAuthServer(t)
	ctx := ctxT(t)
	for _, team := range []string{"team-a", "team-b"} {
		c := as.clients(t, "token:"+team)
		open, err := c.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: open.Msg.Session.Id, Namespace: team, Name: team + "-secret"})); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, credentials string
		sees, hidden      []string
	}{
		{"team-a sees its own lease series and not team-b's", "token:team-a",
			[]string{`lease="team-a-secret",namespace="team-a"`, `tenure_lease_records_collected_total{namespace="team-a"}`, "tenure_raft_is_leader", "tenure_sessions"},
			[]string{"team-b"}},
		{"team-b sees its own and not team-a's", "token:team-b",
			[]string{`lease="team-b-secret",namespace="team-b"`},
			[]string{"team-a"}},
		{"a validator of team-a may scrape, but not read team-a's leases", "token:validator",
			[]string{"tenure_raft_is_leader"},
			[]string{"team-a", "team-b", "tenure_lease_holders"}},
		{"a reader of every namespace sees all", "token:reader",
			[]string{`lease="team-a-secret"`, `lease="team-b-secret"`}, nil},
		{"an admin on * sees all", "token:admin",
			[]string{`lease="team-a-secret"`, `lease="team-b-secret"`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := as.http(t, tc.credentials).Get(as.url + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			body := string(raw)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /metrics: got = %d %s, expected: 200", resp.StatusCode, body)
			}
			for _, want := range tc.sees {
				if !strings.Contains(body, want) {
					t.Errorf("got = no %s, expected it on the page", want)
				}
			}
			for _, line := range strings.Split(body, "\n") {
				for _, not := range tc.hidden {
					if !strings.HasPrefix(line, "#") && strings.Contains(line, not) {
						t.Errorf("got = %s, expected: no series naming %s", line, not)
					}
				}
			}
		})
	}
}
