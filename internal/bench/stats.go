package bench

import (
	"math"
	"slices"
	"time"
)

// percentile is the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest sample at or above p percent of
// them, so p99 of 100 samples is the 99th, and of 10 samples the 10th
// (the maximum). 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// spread is one figure over the rounds: its median and range.
type spread struct {
	Median, Min, Max float64
	N                int
}

// spreadOf summarises values; the median of an even count is the mean of
// the middle two.
func spreadOf(values []float64) spread {
	if len(values) == 0 {
		return spread{}
	}
	v := slices.Clone(values)
	slices.Sort(v)
	mid := len(v) / 2
	median := v[mid]
	if len(v)%2 == 0 {
		median = (v[mid-1] + v[mid]) / 2
	}
	return spread{Median: median, Min: v[0], Max: v[len(v)-1], N: len(v)}
}

// latencies collects one goroutine's latency samples; merge them after
// the goroutines are done.
type latencies []time.Duration

func mergeSorted(parts ...latencies) []time.Duration {
	var all []time.Duration
	for _, p := range parts {
		all = append(all, p...)
	}
	slices.Sort(all)
	return all
}
