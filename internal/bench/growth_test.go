package bench

import (
	"math"
	"slices"
	"testing"
)

func TestFitLine(t *testing.T) {
	tests := []struct {
		name      string
		xs, ys    []float64
		slope, r2 float64
	}{
		{"points on a line fit it exactly", []float64{1000, 10000, 100000}, []float64{5e6, 14e6, 104e6}, 1000, 1},
		{"a flat line has slope 0 and explains everything", []float64{1, 2, 3}, []float64{7, 7, 7}, 0, 1},
		{"one x cannot be fitted", []float64{5, 5}, []float64{1, 2}, 0, 0},
	}
	for _, tt := range tests {
		slope, r2 := fitLine(tt.xs, tt.ys)
		if math.Abs(slope-tt.slope) > 1e-9 || math.Abs(r2-tt.r2) > 1e-9 {
			t.Errorf("%s: got = %v, %v, expected: %v, %v", tt.name, slope, r2, tt.slope, tt.r2)
		}
	}
}

func TestGrowthStepsCheck(t *testing.T) {
	if err := (GrowthSteps{Keys: []int{10, 100}}).Check(); err != nil {
		t.Errorf("increasing steps: got = %v, expected: nil", err)
	}
	for _, bad := range []GrowthSteps{{Keys: []int{100, 10}}, {Sessions: []int{0, 10}}, {History: []int{10, 10}}} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v: got = nil, expected: an error", bad)
		}
	}
	def := growthSizesFor(false, 0)
	g := def.with(GrowthSteps{Watchers: []int{5, 50}})
	if len(g.watchers) != 2 || !slices.Equal(g.keys, def.keys) {
		t.Errorf("with: got = watchers %v, keys %v, expected: the watchers given and the default keys", g.watchers, g.keys)
	}
}
