package bench

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestFormatNumber(t *testing.T) {
	tests := []struct {
		v    float64
		unit string
		want string
	}{
		{931.4, "/s", "931"},
		{12999.6, "/s", "13,000"},
		{1234567, "", "1,234,567"},
		{2.26, "/s", "2.3"}, // a rate under 10 keeps a decimal
		{0, "/s", "0"},
		{0.7123, "ms", "0.712"},
		{1.3245, "ms", "1.32"},
		{70.61, "ms", "70.6"},
		{801.4, "µs", "801"},
		{1663.2, "ms", "1,663"},
		{0, "ms", "0"},
		{-3.5, "MiB", "-3.50"},
	}
	for _, tt := range tests {
		if got := formatNumber(tt.v, tt.unit); got != tt.want {
			t.Errorf("formatNumber(%v, %q) got = %q, expected: %q", tt.v, tt.unit, got, tt.want)
		}
	}
}

func TestFormatRatio(t *testing.T) {
	tests := []struct {
		v    float64
		b    Better
		want string
	}{
		{1.2449, Higher, "1.24× T/E"},
		{0.5, Lower, "0.50× E/T"},
		{27.34, Lower, "27.3× E/T"},
	}
	for _, tt := range tests {
		if got := formatRatio(tt.v, tt.b); got != tt.want {
			t.Errorf("formatRatio(%v, %q) got = %q, expected: %q", tt.v, tt.b, got, tt.want)
		}
	}
}

// sampleReport is two rounds of workloads 1 and 5 against both systems,
// one etcd run failed.
func sampleReport() *Report {
	res := func(w int, s System, round int, figs ...Figure) Result {
		return Result{Workload: w, System: s, Round: round, Figures: figs}
	}
	rate := func(v float64) Figure { return Figure{Name: "pairs/s", Value: v, Unit: "/s", Better: Higher} }
	lat := func(v float64) Figure { return Figure{Name: "pair p50", Value: v, Unit: "ms", Better: Lower} }
	resign := func(v float64) Figure { return Figure{Name: "resign→next p50", Value: v, Unit: "ms", Better: Lower} }
	return &Report{
		Rounds: 2, Duration: "5s", Systems: []System{Tenure, Etcd},
		Results: []Result{
			res(1, Tenure, 1, rate(800), lat(1.2)),
			res(1, Etcd, 1, rate(200), lat(4.8)),
			res(1, Etcd, 2, rate(100), lat(5.2)),
			res(1, Tenure, 2, rate(1000), lat(1.0)),
			res(5, Tenure, 1, resign(0.4)),
			{Workload: 5, System: Etcd, Round: 1, Err: "etcd exited"},
		},
	}
}

func TestRowsRatiosAndGoals(t *testing.T) {
	rows := sampleReport().rows()
	if len(rows) != 3 {
		t.Fatalf("rows got = %d, expected: 3", len(rows))
	}
	tests := []struct {
		name           string
		row            *row
		tenure, etcd   string
		ratio, goalTxt string
	}{
		{"a rate is Tenure over etcd (one client's goal is against the pair limit, not etcd)", rows[0], "900 (800–1,000)", "150 (100–200)", "6.00× T/E", ""},
		{"a latency is etcd over Tenure, so above 1 still favours Tenure", rows[1], "1.10 ms (1.00–1.20)", "5.00 ms (4.80–5.20)", "4.55× E/T", ""},
		{"an absolute goal is judged on Tenure alone; a failed run is marked", rows[2], "0.400 ms", "failed", "", "≤ 0.500 ms: met"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ratio := ""
			if v, ok := tt.row.ratio(); ok {
				ratio = formatRatio(v, tt.row.better)
			}
			got := []string{tt.row.cell(Tenure), tt.row.cell(Etcd), ratio, tt.row.goalText()}
			want := []string{tt.tenure, tt.etcd, tt.ratio, tt.goalTxt}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("column %d got = %q, expected: %q", i, got[i], want[i])
				}
			}
		})
	}
}

func TestWriteText(t *testing.T) {
	var b strings.Builder
	if err := sampleReport().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"(1) one client, Lock+Unlock pairs\n",
		"  pairs/s   900 (800–1,000)",
		"6.00× T/E  \n",
		"(5) clean resign → next leader\n",
		"FAILED: round 1, (5) clean resign → next leader, etcd: etcd exited\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteText lacks %q; got:\n%s", want, out)
		}
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b strings.Builder
	if err := sampleReport().WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	want := `| workload | figure | Tenure | etcd | ratio | goal |
| --- | --- | --- | --- | --- | --- |
| (1) one client, Lock+Unlock pairs | pairs/s | 900 (800–1,000) | 150 (100–200) | 6.00× T/E |  |
|  | pair p50 | 1.10 ms (1.00–1.20) | 5.00 ms (4.80–5.20) | 4.55× E/T |  |
| (5) clean resign → next leader | resign→next p50 | 0.400 ms | failed |  | ≤ 0.500 ms: met |
`
	if got := b.String(); got != want {
		t.Errorf("WriteMarkdown got =\n%s\nexpected:\n%s", got, want)
	}
}

func TestParseWorkloads(t *testing.T) {
	got, err := ParseWorkloads([]string{"3", "one-client", " 3 ", "cluster", "commit", "failover"})
	if err != nil || !slices.Equal(got, []int{3, 1, 10, 11, 12}) {
		t.Errorf("ParseWorkloads got = %v, %v, expected: [3 1 10 11 12], nil", got, err)
	}
	if _, err := ParseWorkloads([]string{"14"}); err == nil || !strings.Contains(err.Error(), `unknown workload "14"`) {
		t.Errorf("ParseWorkloads([14]) got = %v, expected: an unknown workload error", err)
	}
}

// Through etcd's client the goals are issue 23's: 1.5× etcd's
// throughput, and strictly less server CPU per operation.
func TestGoalsThroughEtcdClient(t *testing.T) {
	cpu := func(v float64) Figure { return Figure{Name: "server CPU/pair", Value: v, Unit: "µs", Better: Lower} }
	rate := func(v float64) Figure { return Figure{Name: "pairs/s", Value: v, Unit: "/s", Better: Higher} }
	rep := &Report{Client: ClientEtcd, Rounds: 1, Duration: "5s", Systems: []System{Tenure, Etcd}, Results: []Result{
		{Workload: 1, System: Tenure, Round: 1, Figures: []Figure{rate(160), cpu(50)}},
		{Workload: 1, System: Etcd, Round: 1, Figures: []Figure{rate(100), cpu(50)}},
	}}
	rows := rep.rows()
	if got := rows[0].goalText(); got != "≥ 1.5×: met" {
		t.Errorf("pairs/s goal got = %q, expected: %q", got, "≥ 1.5×: met")
	}
	if got := rows[1].goalText(); got != "> 1×: not met" {
		t.Errorf("equal CPU per pair got = %q, expected: %q", got, "> 1×: not met")
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Tenure driven through etcd's Go client") {
		t.Errorf("WriteText does not say what drove Tenure; got:\n%s", b.String())
	}
}

// The goals for the 3-node cluster are per variant of workload 10: one
// client's share of the pair limit measured in the run, the others'
// ratios; a p99 meets its goal when it is no worse than etcd's.
func TestGoalsOnThreeNodes(t *testing.T) {
	rep := &Report{Client: ClientTenure, Rounds: 1, Duration: "5s", Systems: []System{Tenure, Etcd}, Results: []Result{
		{Workload: 10, Variant: clusterOneClient, System: Tenure, Round: 1, Figures: []Figure{
			{Name: "of the pair limit", Value: 85, Unit: "%", Better: Higher}, {Name: "pair p99", Value: 6, Unit: "ms", Better: Lower}}},
		{Workload: 10, Variant: clusterOneClient, System: Etcd, Round: 1, Figures: []Figure{
			{Name: "of the pair limit", Value: 70, Unit: "%", Better: Higher}, {Name: "pair p99", Value: 6, Unit: "ms", Better: Lower}}},
		{Workload: 10, Variant: clusterContended, System: Tenure, Round: 1, Figures: []Figure{{Name: "handoffs/s", Value: 900, Unit: "/s", Better: Higher}}},
		{Workload: 10, Variant: clusterContended, System: Etcd, Round: 1, Figures: []Figure{{Name: "handoffs/s", Value: 150, Unit: "/s", Better: Higher}}},
		{Workload: 10, Variant: "4: resign → next leader", System: Tenure, Round: 1, Figures: []Figure{{Name: "resign→next p50", Value: 2, Unit: "ms", Better: Lower}}},
	}}
	want := []string{"≥ 90.0 %: not met", "≥ 1×: met", "≥ 6×: met", ""}
	rows := rep.rows()
	if len(rows) != len(want) {
		t.Fatalf("rows got = %d, expected: %d", len(rows), len(want))
	}
	for i, x := range rows {
		if got := x.goalText(); got != want[i] {
			t.Errorf("%s %s goal got = %q, expected: %q", x.variant, x.figure, got, want[i])
		}
	}
}

func TestCheckClient(t *testing.T) {
	if got, err := CheckClient(ClientEtcd, nil); err != nil || !slices.Equal(got, []int{1, 2, 3, 4, 5, 7, 10, 11}) {
		t.Errorf("CheckClient(etcd, all) got = %v, %v, expected: [1 2 3 4 5 7 10 11], nil", got, err)
	}
	if _, err := CheckClient(ClientEtcd, []int{1, 12}); !errors.Is(err, ErrNotThroughEtcdClient) || !strings.Contains(err.Error(), "workload 12 failover") {
		t.Errorf("CheckClient(etcd, [1 12]) got = %v, expected: ErrNotThroughEtcdClient naming workload 12", err)
	}
	if got, err := CheckClient(ClientTenure, nil); err != nil || got != nil {
		t.Errorf("CheckClient(tenure, all) got = %v, %v, expected: nil (every workload), nil", got, err)
	}
}
