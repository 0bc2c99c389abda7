package server

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// The per-lease metrics count what happened to each lease: a wait and
// its grant, a release, an expiry, a revoke, a step-down. Names past the
// cap are counted under (other).
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
		`tenure_lease_holders{lease="job",namespace="default"} 1`,
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

// A principal that creates lease after lease, each labelled
// tenure.dev/metrics=lease (which once bypassed the cap), cannot grow
// /metrics past --metrics-lease-names names: the rest share (other).
func TestLeaseMetricsOptInsCountAgainstTheNameCap(t *testing.T) {
	limits := testLimits()
	limits.MetricsLeaseNames = 3
	ts := startServer(t, t.TempDir(), limits)
	ctx := ctxT(t)
	a := openSession(t, ts, "a", 30*time.Second)
	const leases = 12
	for i := range leases {
		if _, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: a.GetId(), Name: fmt.Sprintf("opted-%d", i),
			Labels: map[string]string{"tenure.dev/metrics": "lease"}, GcAfter: durationpb.New(time.Hour)})); err != nil {
			t.Fatal(err)
		}
	}
	names := leaseLabelValues(t, ts)
	delete(names, otherLeases)
	if len(names) != limits.MetricsLeaseNames {
		t.Errorf("lease names with series: got = %d %v, expected: %d, the cap", len(names), names, limits.MetricsLeaseNames)
	}
	got := gatherLeaseMetrics(t, ts)
	want := fmt.Sprintf(`tenure_lease_grants_total{lease="(other)",namespace="default"} %d`, leases-limits.MetricsLeaseNames)
	if !strings.Contains(got, want+"\n") {
		t.Errorf("metrics: got =\n%s\nexpected a line %s", got, want)
	}
}

// When a lease's idle record is collected, its series go from /metrics
// and its slot under the cap goes to the next name.
func TestLeaseMetricsOfACollectedLeaseAreDeleted(t *testing.T) {
	limits := testLimits()
	limits.MetricsLeaseNames = 2
	ts := startServer(t, t.TempDir(), limits)
	a := openSession(t, ts, "a", 30*time.Second)
	acquireGC(t, ts, a.GetId(), "kept", time.Hour)
	release(t, ts, "idle", acquireGC(t, ts, a.GetId(), "idle", 50*time.Millisecond))
	if names := leaseLabelValues(t, ts); !names["idle"] {
		t.Fatalf("lease names with series: got = %v, expected: idle among them before it is collected", names)
	}
	waitFor(t, "the idle lease to be collected", func() bool {
		_, err := getLease(t, ts, "idle")
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	if names := leaseLabelValues(t, ts); names["idle"] {
		t.Errorf("metrics after idle was collected: got =\n%s\nexpected: no series of lease idle", gatherLeaseMetrics(t, ts))
	}
	acquireGC(t, ts, a.GetId(), "later", time.Hour)
	if names := leaseLabelValues(t, ts); !names["later"] || names[otherLeases] {
		t.Errorf("lease names with series: got = %v, expected: later in the slot idle left, nothing under (other)", names)
	}
	got := gatherLeaseMetrics(t, ts)
	if want := `tenure_lease_records_collected_total{namespace="default"} 1`; !strings.Contains(got, want+"\n") {
		t.Errorf("metrics: got =\n%s\nexpected a line %s", got, want)
	}
}

// leaseLabelValues is the set of lease label values of every series the
// registry gathers.
func leaseLabelValues(t *testing.T, ts *testServer) map[string]bool {
	t.Helper()
	mfs, err := ts.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if v := labelOf(m, "lease"); v != "" {
				out[v] = true
			}
		}
	}
	return out
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

// /metrics carries what pages an operator first: the Go runtime's and
// the process's figures, and which build runs.
func TestMetricsIncludeTheRuntimeTheProcessAndTheBuild(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	mfs, err := ts.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	families := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		families[mf.GetName()] = mf
	}
	want := []string{"go_goroutines", "go_gc_duration_seconds", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "tenure_build_info"}
	if runtime.GOOS == "linux" {
		want = append(want, "process_open_fds", "process_max_fds")
	}
	for _, name := range want {
		if families[name] == nil {
			t.Errorf("metric %s: got = none, expected: exported", name)
		}
	}
	if mf := families["tenure_build_info"]; mf != nil {
		m := mf.GetMetric()[0]
		if v := m.GetGauge().GetValue(); v != 1 || labelOf(m, "version") != "(devel)" || labelOf(m, "go_version") != runtime.Version() {
			t.Errorf("tenure_build_info: got = %v %v, expected: 1 with version (devel) and go_version %s", m.GetLabel(), v, runtime.Version())
		}
	}

	// What `tenure serve` passes in is what the labels say.
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo(BuildInfo{Version: "v1.2.3", Commit: "abc123", GoVersion: "go1.26.0"}))
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := got[0].GetMetric()[0]
	if labelOf(m, "version") != "v1.2.3" || labelOf(m, "commit") != "abc123" || labelOf(m, "go_version") != "go1.26.0" {
		t.Errorf("tenure_build_info: got = %v, expected: version v1.2.3, commit abc123, go_version go1.26.0", m.GetLabel())
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
