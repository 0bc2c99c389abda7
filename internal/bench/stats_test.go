package bench

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"no samples give zero", nil, 50, 0},
		{"one sample is every percentile", []time.Duration{7}, 99, 7},
		{"p50 of 100 is the 50th", hundred, 50, 50 * time.Millisecond},
		{"p99 of 100 is the 99th, not the maximum", hundred, 99, 99 * time.Millisecond},
		{"p100 is the maximum", hundred, 100, 100 * time.Millisecond},
		{"p99 of 10 is the maximum: nearest rank rounds up", hundred[:10], 99, 10 * time.Millisecond},
		{"p50 of 4 is the 2nd", hundred[:4], 50, 2 * time.Millisecond},
		{"a tiny percentile is still the first sample", hundred, 0.001, time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("percentile(%d samples, %v) got = %v, expected: %v", len(tt.sorted), tt.p, got, tt.want)
			}
		})
	}
}

func TestSpreadOf(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		want   spread
	}{
		{"nothing", nil, spread{}},
		{"one round", []float64{3}, spread{3, 3, 3, 1}},
		{"an odd count takes the middle, whatever the order", []float64{9, 1, 5}, spread{5, 1, 9, 3}},
		{"an even count takes the mean of the middle two", []float64{4, 1, 2, 10}, spread{3, 1, 10, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := spreadOf(tt.values); got != tt.want {
				t.Errorf("spreadOf(%v) got = %+v, expected: %+v", tt.values, got, tt.want)
			}
		})
	}
}
