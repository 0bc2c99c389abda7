package api

import (
	"regexp"
	"testing"
)

// isDNSLabel replaced a regexp on the hot path; it must agree with it on
// every string, including the edges of each character class.
func TestIsDNSLabelAgreesWithTheKubernetesPattern(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	alphabet := []byte{'a', 'z', '0', '9', '-', '`', '{', '/', ':', 'A', 'Z', '.', '_', 0, 0xff}
	var strs []string
	var grow func(prefix []byte, n int)
	grow = func(prefix []byte, n int) {
		strs = append(strs, string(prefix))
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			grow(append(prefix, c), n-1)
		}
	}
	grow(nil, 3)
	strs = append(strs, "kube-system", "default", "a-b-c", "ünicode", "team\x00")
	for _, s := range strs {
		if got, want := isDNSLabel(s), re.MatchString(s); got != want {
			t.Errorf("isDNSLabel(%q): got = %v, expected: %v (the pattern)", s, got, want)
		}
	}
}
