package bench

import (
	"time"
)

// Better says which way a figure improves, and so which way its ratio
// is taken: Tenure's figure over etcd's when higher is better
// (throughput), etcd's over Tenure's when lower is (latency, CPU,
// memory). Either way a ratio above 1 means Tenure does better.
type Better string

const (
	Higher Better = "higher"
	Lower  Better = "lower"
	// Neither marks a figure that is shown but not compared, such as a
	// count of samples.
	Neither Better = ""
)

// Figure is one number a workload measured in one run.
type Figure struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"` // "/s", "ms", "µs", "MiB" or "" for a count
	Better Better  `json:"better,omitempty"`
}

// Result is one workload (or one variant of it) run against one system
// in one round.
type Result struct {
	Workload int      `json:"workload"`
	Variant  string   `json:"variant,omitempty"`
	System   System   `json:"system"`
	Round    int      `json:"round"`
	Figures  []Figure `json:"figures"`
	// Samples are latency samples in milliseconds by what they time
	// ("pair", "handoff", "resign→next"), for the charts.
	Samples map[string][]float64 `json:"samples_ms,omitempty"`
	Err     string               `json:"error,omitempty"`
	// Note says what the figures cannot: a step not reached, and why.
	Note string `json:"note,omitempty"`
	// Seconds is the run's wall time, starting and stopping the server
	// included.
	Seconds float64 `json:"seconds"`
}

func (r *Result) add(name string, v float64, unit string, b Better) {
	r.Figures = append(r.Figures, Figure{Name: name, Value: v, Unit: unit, Better: b})
}

// addLatency adds the p50 and p99 of sorted under name, and keeps the
// samples for the charts.
func (r *Result) addLatency(name string, sorted []time.Duration) {
	r.add(name+" p50", ms(percentile(sorted, 50)), "ms", Lower)
	r.add(name+" p99", ms(percentile(sorted, 99)), "ms", Lower)
	if r.Samples == nil {
		r.Samples = map[string][]float64{}
	}
	s := make([]float64, len(sorted))
	for i, d := range sorted {
		s[i] = ms(d)
	}
	r.Samples[name] = s
}

// addCPU adds the server's CPU time per op, when there were ops.
func (r *Result) addCPU(cpu time.Duration, ops int64, per string) {
	if ops > 0 {
		r.add("server CPU/"+per, float64(cpu.Microseconds())/float64(ops), "µs", Lower)
	}
}

func (r *Result) figure(name string) (Figure, bool) {
	for _, f := range r.Figures {
		if f.Name == name {
			return f, true
		}
	}
	return Figure{}, false
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(b int64) float64 { return float64(b) / (1 << 20) }
