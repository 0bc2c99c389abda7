package nativeapi

import (
	"strings"
)

// requirement is one term of a label selector.
type requirement struct {
	key    string
	op     string // "=", "!=", "exists", "!exists"
	values string
}

// selector is a parsed Kubernetes-style equality selector:
// "a=b,c!=d,e,!f". An empty selector matches everything.
type selector []requirement

func parseSelector(s string) (selector, error) {
	var sel selector
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for term := range strings.SplitSeq(s, ",") {
		term = strings.TrimSpace(term)
		var r requirement
		switch {
		case term == "":
			return nil, Invalid("label selector %q has an empty term", s)
		case strings.Contains(term, "!="):
			k, v, _ := strings.Cut(term, "!=")
			r = requirement{key: strings.TrimSpace(k), op: "!=", values: strings.TrimSpace(v)}
		case strings.Contains(term, "=="):
			k, v, _ := strings.Cut(term, "==")
			r = requirement{key: strings.TrimSpace(k), op: "=", values: strings.TrimSpace(v)}
		case strings.Contains(term, "="):
			k, v, _ := strings.Cut(term, "=")
			r = requirement{key: strings.TrimSpace(k), op: "=", values: strings.TrimSpace(v)}
		case strings.HasPrefix(term, "!"):
			r = requirement{key: strings.TrimSpace(term[1:]), op: "!exists"}
		default:
			r = requirement{key: term, op: "exists"}
		}
		if err := labelKey(r.key); err != nil {
			return nil, Invalid("label selector %q: %v", s, err)
		}
		if (r.op == "=" || r.op == "!=") && !labelValueRE.MatchString(r.values) {
			return nil, Invalid("label selector %q: value %q is not a valid label value", s, r.values)
		}
		sel = append(sel, r)
	}
	return sel, nil
}

func (sel selector) matches(labels map[string]string) bool {
	for _, r := range sel {
		v, ok := labels[r.key]
		switch r.op {
		case "=":
			if !ok || v != r.values {
				return false
			}
		case "!=":
			if ok && v == r.values {
				return false
			}
		case "exists":
			if !ok {
				return false
			}
		case "!exists":
			if ok {
				return false
			}
		}
	}
	return true
}
