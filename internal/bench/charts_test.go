package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestWriteChartsDrawsWhatRan(t *testing.T) {
	rep := sampleReport()
	rep.Results[0].Samples = map[string][]float64{"pair": {0.9, 1.1, 1.3, 2.5}}
	rep.Results[1].Samples = map[string][]float64{"pair": {3, 4, 5, 0}} // 0 cannot be drawn on a log scale
	for _, n := range []string{"1 goroutines", "16 goroutines"} {
		for _, s := range []System{Tenure, Etcd} {
			rep.Results = append(rep.Results, Result{Workload: 9, Variant: n, System: s, Round: 1,
				Figures: []Figure{{Name: "pairs/s", Value: 500, Unit: "/s", Better: Higher}}})
		}
	}
	dir := t.TempDir()
	files, err := rep.WriteCharts(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("%s: not an SVG file (%v)", f, err)
		}
	}
	// Workloads 3 and 5 have no samples: their latency charts are left out.
	want := []string{"throughput.svg", "latency-one-client.svg", "scaling.svg"}
	if !slices.Equal(names, want) {
		t.Errorf("charts got = %v, expected: %v", names, want)
	}
}

func TestCDF(t *testing.T) {
	pts := cdf([]float64{3, 1, 2, 0, -1}, 10)
	if len(pts) != 3 || pts[0].X != 1 || pts[2].X != 3 || pts[2].Y != 1 {
		t.Errorf("cdf got = %v, expected: (1,1/3) (2,2/3) (3,1)", pts)
	}
	many := make([]float64, 1000)
	for i := range many {
		many[i] = float64(i + 1)
	}
	if pts := cdf(many, 100); len(pts) > 101 || pts[len(pts)-1].Y != 1 {
		t.Errorf("cdf of 1000 samples into 100 points got = %d points ending at %v, expected: at most 101 ending at 1", len(pts), pts[len(pts)-1])
	}
}

func TestWriteChartsDrawsGrowth(t *testing.T) {
	rep := &Report{Rounds: 1, Systems: []System{Tenure, Etcd}}
	for _, s := range []System{Tenure, Etcd} {
		for _, n := range []int{1000, 10000} {
			rep.Results = append(rep.Results, Result{Workload: 13, Variant: "keys " + thousands(int64(n)), System: s, Round: 1, Figures: []Figure{
				{Name: "size", Value: float64(n)}, {Name: "server RSS", Value: float64(n) / 1000, Unit: "MiB"},
				{Name: "(1) pairs/s", Value: 500, Unit: "/s"}, {Name: "(1) pair p50", Value: 1.5, Unit: "ms"},
				{Name: "(2) pairs/s", Value: 3000, Unit: "/s"}, {Name: "(2) pair p50", Value: 15, Unit: "ms"},
			}})
		}
		rep.Results = append(rep.Results, Result{Workload: 13, Variant: "keys", System: s, Round: 1, Figures: []Figure{
			{Name: "server RSS at start", Value: 30, Unit: "MiB"}, {Name: "RSS per key (slope)", Value: 1000, Unit: "B"},
		}})
	}
	files, err := rep.WriteCharts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	// Only the keys ran: the other dimensions' charts are left out.
	want := []string{"growth-keys-latency.svg", "growth-keys-rss.svg", "growth-keys-throughput.svg"}
	if !slices.Equal(names, want) {
		t.Errorf("charts got = %v, expected: %v", names, want)
	}
}
