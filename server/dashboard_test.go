package server

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// The Grafana dashboard in deploy/grafana reads Tenure's metrics by
// name and label. These tests hold it to what a running server exports:
// every PromQL expression in a panel, a template variable or an
// annotation is parsed, and each metric it selects, each label it
// matches, groups by or drops, must exist. A renamed metric or label
// fails here, not on an operator's screen as an empty panel.

const dashboardPath = "../deploy/grafana/tenure.json"

func TestDashboardIsAGrafanaDashboard(t *testing.T) {
	d := loadDashboard(t)
	if title, _ := d["title"].(string); title == "" {
		t.Errorf("title: got = %q, expected: a title", title)
	}
	if uid, _ := d["uid"].(string); uid == "" || len(uid) > 40 {
		t.Errorf("uid: got = %q, expected: 1 to 40 characters, as Grafana allows", uid)
	}
	if id, ok := d["id"]; !ok || id != nil {
		t.Errorf("id: got = %v, expected: null, so that an import creates the dashboard", id)
	}
	if v, _ := d["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion: got = %v, expected: 36 or later (datasource references by uid)", v)
	}
	vars := map[string]map[string]any{}
	for _, v := range listOf(d, "templating", "list") {
		vars[fmt.Sprint(v["name"])] = v
	}
	if ds := vars["datasource"]; ds["type"] != "datasource" || ds["query"] != "prometheus" {
		t.Errorf("variable datasource: got = %v, expected: a Prometheus datasource variable", ds)
	}
	for _, name := range []string{"instance", "namespace", "lease"} {
		if v := vars[name]; v["type"] != "query" {
			t.Errorf("variable %s: got = %v, expected: a query variable", name, v)
		}
	}

	panels := allPanels(listOf(d, "panels"))
	if len(panels) == 0 {
		t.Fatal("panels: got = none, expected: some")
	}
	ids := map[float64]string{}
	for _, p := range panels {
		title := fmt.Sprint(p["title"])
		id, _ := p["id"].(float64)
		if other, dup := ids[id]; dup {
			t.Errorf("panel %q: id %v is also %q's", title, id, other)
		}
		ids[id] = title
		g, _ := p["gridPos"].(map[string]any)
		x, _ := g["x"].(float64)
		w, _ := g["w"].(float64)
		if h, _ := g["h"].(float64); w <= 0 || h <= 0 || x+w > 24 {
			t.Errorf("panel %q: gridPos %v, expected: inside the 24 columns", title, g)
		}
		if p["type"] == "row" {
			continue
		}
		// Every query goes to the data source the importer picks.
		if uid := datasourceUID(p["datasource"]); uid != "${datasource}" {
			t.Errorf("panel %q: datasource uid %q, expected: ${datasource}", title, uid)
		}
		targets := listOf(p, "targets")
		if len(targets) == 0 {
			t.Errorf("panel %q: got = no targets, expected: at least one query", title)
		}
		for _, tg := range targets {
			if uid := datasourceUID(tg["datasource"]); uid != "${datasource}" {
				t.Errorf("panel %q, query %v: datasource uid %q, expected: ${datasource}", title, tg["refId"], uid)
			}
		}
	}
}

// Every metric and label the dashboard names is one the server exports.
func TestDashboardQueriesNameExportedMetricsAndLabels(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	exerciseMetrics(t, ts)
	metrics := exportedMetrics(t, ts.cfg.Registry)

	exprs := dashboardExprs(t, loadDashboard(t))
	if len(exprs) < 20 {
		t.Fatalf("expressions: got = %d, expected: every panel's, variable's and annotation's", len(exprs))
	}
	for _, e := range exprs {
		for _, p := range checkPromQL(metrics, e.expr) {
			t.Errorf("%s: %s\n\t%s", e.where, p, e.expr)
		}
	}

	// The check itself must catch what it is for, or a pass above
	// means nothing.
	for _, tc := range []struct {
		name, expr, want string
	}{
		{"a misspelt metric is caught", `max(tenure_raft_is_leaderr)`, "tenure_raft_is_leaderr does not exist"},
		{"a counter read as a histogram is caught", `rate(tenure_lease_grants_total_bucket[5m])`, "does not exist"},
		{"a histogram read by its family name is caught", `max(tenure_lease_hold_seconds)`, "is a histogram"},
		{"a matcher on a label the metric lacks is caught", `tenure_lease_records_collected_total{lease="x"}`, `label "lease"`},
		{"a by() label the argument lacks is caught", `max by (namespace, lease) (tenure_lessor_expiries_proposed_total)`, `by (namespace, lease)`},
		{"a label dropped by an inner aggregation is caught", `max by (lease) (sum by (namespace) (tenure_lease_holders))`, `by (lease)`},
		{"a quantile over buckets without le is caught", `histogram_quantile(0.99, max by (namespace) (rate(tenure_lease_wait_seconds_bucket[5m])))`, "without le"},
		{"a join of different label sets is caught", `max by (instance) (tenure_raft_is_leader) - max by (namespace) (tenure_lease_holders)`, "no series match"},
		{"a metric that is not Tenure's is caught", `up`, "not a Tenure metric"},
		{"a summary read by buckets is caught", `rate(go_gc_duration_seconds_bucket[5m])`, "is not a histogram"},
		{"a summary's sum has no quantile", `rate(go_gc_duration_seconds_sum{quantile="1"}[5m])`, `label "quantile"`},
		{"a variable whose label the metric lacks is caught", `label_values(tenure_raft_is_leader, lease)`, `label "lease"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems := checkPromQL(metrics, tc.expr)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("problems with %s: got = %q, expected: one saying %q", tc.expr, problems, tc.want)
			}
		})
	}
}

// exerciseMetrics gives the labelled vectors series: two sessions, a
// wait for a lease with a step-down and a release, a revoke, a session
// that expires holding a lease, and a lease record collected.
func exerciseMetrics(t *testing.T, ts *testServer) {
	t.Helper()
	ctx := ctxT(t)
	a := openSession(t, ts, "a", 30*time.Second)
	b := openSession(t, ts, "b", 30*time.Second)

	tok := acquireGC(t, ts, a.GetId(), "job", time.Hour)
	granted := make(chan error, 1)
	go func() {
		_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.GetId(), Name: "job", Wait: true}))
		granted <- err
	}()
	waitForWaiters(t, ts, "job", 1)
	if _, err := setPreferred(t, ts, "job", "b"); err != nil { // a is asked to step down
		t.Fatal(err)
	}
	release(t, ts, "job", tok)
	if err := <-granted; err != nil {
		t.Fatal(err)
	}

	acquireGC(t, ts, a.GetId(), "revoked", time.Hour)
	if _, err := ts.Leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Name: "revoked", Reason: "dashboard test"})); err != nil {
		t.Fatal(err)
	}

	short := openSession(t, ts, "short", 200*time.Millisecond)
	acquireGC(t, ts, short.GetId(), "expired", time.Hour)
	release(t, ts, "idle", acquireGC(t, ts, a.GetId(), "idle", 50*time.Millisecond))
	waitFor(t, "the short session to expire", func() bool {
		l, err := getLease(t, ts, "expired")
		return err == nil && l.GetStatus() == "expired"
	})
	waitFor(t, "the idle lease to be collected", func() bool {
		_, err := getLease(t, ts, "idle")
		return connect.CodeOf(err) == connect.CodeNotFound
	})
}

// metricInfo is what the registry says of one metric family.
type metricInfo struct {
	labels    map[string]bool
	histogram bool
	// summary: a quantile label on the family, and _sum and _count
	// series (go_gc_duration_seconds).
	summary bool
	// described is set for a family known only from its descriptor: a
	// vector none of whose series the test's operations created.
	described bool
}

// exportedMetrics lists the families reg gathers, with the labels of
// their series, then adds those it only describes (vectors without
// series yet) with the labels their descriptors declare.
func exportedMetrics(t *testing.T, reg *prometheus.Registry) map[string]metricInfo {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]metricInfo{}
	for _, mf := range mfs {
		info := metricInfo{labels: map[string]bool{}, histogram: mf.GetType() == dto.MetricType_HISTOGRAM, summary: mf.GetType() == dto.MetricType_SUMMARY}
		if info.summary {
			info.labels["quantile"] = true
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				info.labels[lp.GetName()] = true
			}
		}
		out[mf.GetName()] = info
	}
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	var onlyDescribed []string
	for d := range ch {
		name, labels, ok := parseDesc(d.String())
		if !ok {
			t.Fatalf("descriptor %s: not in the form this test reads (did client_golang change Desc.String?)", d)
		}
		if _, seen := out[name]; !seen {
			out[name] = metricInfo{labels: labels, described: true}
			onlyDescribed = append(onlyDescribed, name)
		}
	}
	if len(onlyDescribed) > 0 {
		t.Logf("without series, checked against their descriptors: %s", strings.Join(onlyDescribed, ", "))
	}
	return out
}

var descForm = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{(.*)\}, variableLabels: \{([^}]*)\}\}$`)

// parseDesc reads a metric's name and label names from a Desc's String,
// the only way client_golang shows them.
func parseDesc(s string) (name string, labels map[string]bool, ok bool) {
	m := descForm.FindStringSubmatch(s)
	if m == nil {
		return "", nil, false
	}
	labels = map[string]bool{}
	for _, c := range regexp.MustCompile(`(\w+)="`).FindAllStringSubmatch(m[2], -1) {
		labels[c[1]] = true
	}
	for l := range strings.SplitSeq(m[3], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels[l] = true
		}
	}
	return m[1], labels, true
}

func loadDashboard(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// listOf follows keys through nested objects to a list of objects.
func listOf(v map[string]any, keys ...string) []map[string]any {
	var cur any = v
	for _, k := range keys {
		m, _ := cur.(map[string]any)
		cur = m[k]
	}
	items, _ := cur.([]any)
	var out []map[string]any
	for _, it := range items {
		if m, ok := it.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// allPanels flattens panels and the panels of collapsed rows.
func allPanels(panels []map[string]any) []map[string]any {
	var out []map[string]any
	for _, p := range panels {
		out = append(out, p)
		out = append(out, allPanels(listOf(p, "panels"))...)
	}
	return out
}

func datasourceUID(ds any) string {
	m, _ := ds.(map[string]any)
	uid, _ := m["uid"].(string)
	return uid
}

type dashboardExpr struct{ where, expr string }

// dashboardExprs is every PromQL expression in d: panel queries,
// query variables and Prometheus annotations.
func dashboardExprs(t *testing.T, d map[string]any) []dashboardExpr {
	t.Helper()
	var out []dashboardExpr
	for _, p := range allPanels(listOf(d, "panels")) {
		for _, tg := range listOf(p, "targets") {
			expr, ok := tg["expr"].(string)
			if !ok {
				t.Errorf("panel %q, query %v: got = no expr, expected: a PromQL query", p["title"], tg["refId"])
				continue
			}
			out = append(out, dashboardExpr{fmt.Sprintf("panel %q, query %v", p["title"], tg["refId"]), expr})
		}
	}
	for _, v := range listOf(d, "templating", "list") {
		if v["type"] != "query" {
			continue
		}
		q := v["query"]
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		out = append(out, dashboardExpr{fmt.Sprintf("variable %v", v["name"]), fmt.Sprint(q)})
		if def, ok := v["definition"].(string); ok && def != q {
			out = append(out, dashboardExpr{fmt.Sprintf("variable %v, definition", v["name"]), def})
		}
	}
	for _, a := range listOf(d, "annotations", "list") {
		if expr, ok := a["expr"].(string); ok {
			out = append(out, dashboardExpr{fmt.Sprintf("annotation %q", a["name"]), expr})
		}
	}
	return out
}
