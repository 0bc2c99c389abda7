// Package glob matches the one pattern language of Tenure's policies:
// '*' stands for any run of characters, even none, and everything else
// for itself. It is a package of its own because the policy (auth) and
// the replicated state (statemachine) must agree on it to the letter:
// the state machine re-checks, at apply time, the identity patterns a
// policy granted.
package glob

import "strings"

// Match reports whether name matches pattern.
func Match(pattern, name string) bool {
	first, rest, wild := strings.Cut(pattern, "*")
	if !wild {
		return pattern == name
	}
	if !strings.HasPrefix(name, first) {
		return false
	}
	name = name[len(first):]
	// Greedy from the left is enough for '*' alone: each literal run
	// is taken at its first occurrence, the last one at the end.
	parts := strings.Split(rest, "*")
	for i, part := range parts {
		if i == len(parts)-1 {
			return strings.HasSuffix(name, part)
		}
		j := strings.Index(name, part)
		if j < 0 {
			return false
		}
		name = name[j+len(part):]
	}
	return true
}
