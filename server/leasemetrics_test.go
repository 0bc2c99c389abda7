package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// The per-lease metrics count what happened to each lease: a wait and
// its grant, a release, an expiry, a revoke, a step-down. Names past the
// cap are counted under (other), unless the lease opts in.
func TestLeaseMetricsCountWhatHappenedToEachLease(t *testing.T) {
	limits := testLimits()
	limits.MetricsLeaseNames = 2
	ts := startServer(t, t.TempDir(), limits)
	ctx := ctxT(t)
	a := openSession(t, ts, "a", 30*time.Second)
	b := openSession(t, ts, "b", 30*time.Second)

	// job: a holds, b waits 100ms, a releases, b is granted.
	tokA := acquireGC(t, ts, a.GetId(), "job", time.Hour)
	waited := make(chan error, 1)
	go func() {
		_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.GetId(), Name: "job", Wait: true}))
		waited <- err
	}()
	waitFor(t, "b to wait for job", func() bool {
		l, err := getLease(t, ts, "job")
		return err == nil && len(l.GetWaiters()) == 1
	})
	time.Sleep(100 * time.Millisecond) // the wait the histogram must see
	release(t, ts, "job", tokA)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	// other: revoked by an operator, then a third name past the cap.
	acquireGC(t, ts, a.GetId(), "other", time.Hour)
	if _, err := ts.Leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Name: "other", Reason: "stuck"})); err != nil {
		t.Fatal(err)
	}
	acquireGC(t, ts, a.GetId(), "third", time.Hour)
	// opted: past the cap, but labelled to have its own series.
	if _, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: a.GetId(), Name: "opted",
		Labels: map[string]string{MetricsLabel: "lease"}, GcAfter: durationpb.New(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	// gone: its session never beats, and expires holding it.
	short := openSession(t, ts, "short", 300*time.Millisecond)
	acquireGC(t, ts, short.GetId(), "gone", time.Hour)
	waitFor(t, "gone to expire", func() bool {
		l, err := getLease(t, ts, "gone")
		return err == nil && l.GetStatus() == "expired"
	})
	got := gatherLeaseMetrics(t, ts)
	for _, want := range []string{
		`tenure_lease_expirations_total{lease="(other)",namespace="default"} 1`,
		`tenure_lease_lost_grants_total{lease="(other)",namespace="default"} 1`,
		`tenure_lease_grants_total{lease="job",namespace="default"} 2`,
		`tenure_lease_wait_seconds_count{lease="job",namespace="default"} 1`,
		`tenure_lease_hold_seconds_count{lease="job",namespace="default"} 1`,
		`tenure_lease_revocations_total{cause="operator",lease="other",namespace="default"} 1`,
		`tenure_lease_lost_grants_total{lease="other",namespace="default"} 1`,
		`tenure_lease_grants_total{lease="(other)",namespace="default"} 2`,
		`tenure_lease_grants_total{lease="opted",namespace="default"} 1`,
		`tenure_lease_holders{lease="job",namespace="default"} 1`,
		`tenure_lease_holders{lease="opted",namespace="default"} 1`,
		`tenure_lease_queued{lease="job",namespace="default"} 0`,
		// Born at 0, so that rate() sees a lease's first expiry.
		`tenure_lease_expirations_total{lease="job",namespace="default"} 0`,
		`tenure_lease_revocations_total{cause="max_hold",lease="other",namespace="default"} 0`,
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("metrics: got =\n%s\nexpected a line %s", got, want)
		}
	}
	if v := histogramSum(t, ts, "tenure_lease_wait_seconds", "job"); v < 0.1 {
		t.Errorf("job's wait: got = %vs, expected: at least the 100ms b waited", v)
	}
}

// Every metric passes Prometheus's own lint.
func TestMetricsPassPromlint(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	a := openSession(t, ts, "a", 30*time.Second)
	release(t, ts, "job", acquireGC(t, ts, a.GetId(), "job", time.Hour))
	mfs, err := ts.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	if len(mfs) < 20 {
		t.Errorf("metric families: got = %d, expected: the server's, raft's and the lessor's", len(mfs))
	}
}

// gatherLeaseMetrics renders the tenure_lease_ series as text lines.
func gatherLeaseMetrics(t *testing.T, ts *testServer) string {
	t.Helper()
	mfs, err := ts.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "tenure_lease_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			ls := "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				fmt.Fprintf(&b, "%s%s %v\n", mf.GetName(), ls, m.GetCounter().GetValue())
			case m.GetGauge() != nil:
				fmt.Fprintf(&b, "%s%s %v\n", mf.GetName(), ls, m.GetGauge().GetValue())
			case m.GetHistogram() != nil:
				fmt.Fprintf(&b, "%s_count%s %v\n", mf.GetName(), ls, m.GetHistogram().GetSampleCount())
			}
		}
	}
	return b.String()
}

func histogramSum(t *testing.T, ts *testServer, name, lease string) float64 {
	t.Helper()
	mfs, err := ts.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelOf(m, "lease") == lease {
				return m.GetHistogram().GetSampleSum()
			}
		}
	}
	return -1
}

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}
