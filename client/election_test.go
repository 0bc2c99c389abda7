package client

import (
	"slices"
	"testing"
)

// What RunElection's OnNewLeader and OnNoLeader hear of what Observe
// reports: a leader per term, never a blank one, and a gap once.
func TestReportLeadersNamesEachTermOnceAndNeverABlankLeader(t *testing.T) {
	a1 := Leader{Identity: "a", Value: "a:1", Token: 10, Revision: 10}
	a2 := Leader{Identity: "a", Value: "a:2", Token: 10, Revision: 11} // proclaimed
	b := Leader{Identity: "b", Value: "b:1", Token: 13, Revision: 13}
	aAgain := Leader{Identity: "a", Value: "a:1", Token: 20, Revision: 20}
	for _, tc := range []struct {
		name     string
		observed []Leader
		want     []string
	}{
		{
			name:     "a leader, a proclaimed value, a gap, then the next leader",
			observed: []Leader{a1, a2, {Revision: 12}, b},
			want:     []string{"new a", "none", "new b"},
		},
		{
			name:     "nobody leads at the start, then a leader",
			observed: []Leader{{Revision: 5}, a1},
			want:     []string{"none", "new a"},
		},
		{
			name:     "a handover with no gap reported",
			observed: []Leader{a1, b},
			want:     []string{"new a", "new b"},
		},
		{
			name:     "the same identity elected again is a new term",
			observed: []Leader{a1, {Revision: 12}, aAgain},
			want:     []string{"new a", "none", "new a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan Leader, len(tc.observed))
			for _, l := range tc.observed {
				ch <- l
			}
			close(ch)
			var got []string
			reportLeaders(ch, Callbacks{
				OnNewLeader: func(identity string) { got = append(got, "new "+identity) },
				OnNoLeader:  func() { got = append(got, "none") },
			})
			if !slices.Equal(got, tc.want) {
				t.Errorf("callbacks: got = %q, expected: %q", got, tc.want)
			}
		})
	}
}

// Either callback may be left nil.
func TestReportLeadersWithOneCallback(t *testing.T) {
	ch := make(chan Leader, 3)
	ch <- Leader{Identity: "a", Token: 1, Revision: 1}
	ch <- Leader{Revision: 2}
	ch <- Leader{Identity: "b", Token: 3, Revision: 3}
	close(ch)
	var got []string
	reportLeaders(ch, Callbacks{OnNewLeader: func(identity string) { got = append(got, identity) }})
	if want := []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("OnNewLeader: got = %q, expected: %q", got, want)
	}
}
