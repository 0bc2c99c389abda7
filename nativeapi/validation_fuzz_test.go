package nativeapi

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
)

// FuzzValidation feeds arbitrary strings to the validation helpers. None
// may panic; every rejection wraps ErrInvalid with a message naming the
// field; whatever is accepted meets the rule the error messages state,
// and an accepted label can be selected.
func FuzzValidation(f *testing.F) {
	seeds := []struct {
		s, v string
		d    int64
	}{
		{"", "", 0},
		{"default", "v", int64(time.Second)},
		{"team-a", "x", int64(2 * time.Second)},
		{"Bad_NS", "", -1},
		{"-x", "", math.MaxInt64},
		{"x-", "", math.MinInt64},
		{strings.Repeat("a", 63), "", 1},
		{strings.Repeat("a", 64), strings.Repeat("v", 33), int64(time.Hour)},
		{"a\u0007b", "\x00", 0},
		{"\xff\xfe", "", 0},
		{"nightly-report", "10.0.0.1:80", 0},
		{"app=web,tier!=db,canary,!gone", "web", 0},
		{"a==b", "b", 0},
		{"a=b=c", "", 0},
		{"a=b,,c", "", 0},
		{" , ", "", 0},
		{"example.com/tier", "db", 0},
		{"a,b/c", "x", 0},
		{"a=b/c", "x", 0},
		{" x/y", "v", 0},
		{"Example.COM/tier", "v", 0},
		{"/x", "", 0},
		{"a/b/c", "", 0},
		{"\u0085", "", 0},
		{"k", "-v", 0},
		{"k", "v.v_v-v", 0},
	}
	for _, s := range seeds {
		f.Add(s.s, s.v, s.d)
	}
	lim := Limits{MaxCapacity: 10000, MaxRequestBytes: 1 << 20, LeaseGCAfter: time.Hour}
	lim.MaxNameBytes = 16
	lim.MaxValueBytes = 32
	lim.MaxLabels = 3
	lim.MinTTL = 100 * time.Millisecond
	lim.MaxTTL = 10 * time.Second
	lim.DefaultTTL = time.Second
	f.Fuzz(func(t *testing.T, s, v string, d int64) {
		if ns, err := lim.namespace(s); err != nil {
			checkInvalid(t, err, "namespace", "DNS label")
		} else if s == "" && ns != api.DefaultNamespace || s != "" && ns != s {
			t.Fatalf("namespace(%q) got = %q, expected: %q or the default", s, ns, s)
		} else if !isDNSLabel(ns) {
			t.Fatalf("namespace(%q) accepted, expected: rejected, not a DNS label", s)
		}

		if err := lim.name("name", s); err != nil {
			checkInvalid(t, err, "name")
		} else {
			if s == "" || len(s) > lim.MaxNameBytes || !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
				t.Fatalf("name(%q) accepted, expected: rejected (non-empty valid UTF-8 without control characters, at most %d bytes)", s, lim.MaxNameBytes)
			}
		}
		if err := lim.leaseName(s); err != nil {
			checkInvalid(t, err, "name")
		} else if lim.name("name", s) != nil || strings.Contains(s, "/") {
			t.Fatalf("leaseName(%q) accepted, expected: rejected (a name without '/')", s)
		}

		if err := lim.value("value", v); err != nil {
			checkInvalid(t, err, "value", fmt.Sprint(lim.MaxValueBytes))
			if len(v) <= lim.MaxValueBytes {
				t.Fatalf("value of %d bytes rejected, expected: accepted up to %d", len(v), lim.MaxValueBytes)
			}
		} else if len(v) > lim.MaxValueBytes {
			t.Fatalf("value of %d bytes accepted, expected: rejected over %d", len(v), lim.MaxValueBytes)
		}

		if got, err := lim.ttl("ttl", nil, lim.DefaultTTL); err != nil || got != lim.DefaultTTL {
			t.Fatalf("ttl(absent) got = %v, %v, expected: the default %v", got, err, lim.DefaultTTL)
		}
		// A present TTL is never taken as the default, "0s" included.
		want := time.Duration(d)
		if got, err := lim.ttl("ttl", durationpb.New(want), lim.DefaultTTL); err != nil {
			checkInvalid(t, err, "ttl", "--min-ttl")
			if want >= lim.MinTTL && want <= lim.MaxTTL {
				t.Fatalf("ttl(%v) rejected, expected: accepted within %v..%v", want, lim.MinTTL, lim.MaxTTL)
			}
		} else if got != want || got < lim.MinTTL || got > lim.MaxTTL {
			t.Fatalf("ttl(%v) got = %v, expected: %v within %v..%v", want, got, want, lim.MinTTL, lim.MaxTTL)
		}

		checkLabels(t, lim, map[string]string{s: v})
		// s as a list of key=value pairs gives several labels at once.
		pairs := map[string]string{}
		for term := range strings.SplitSeq(s, ",") {
			k, val, _ := strings.Cut(term, "=")
			pairs[k] = val
		}
		checkLabels(t, lim, pairs)

		sel, err := parseSelector(s)
		if err != nil {
			checkInvalid(t, err, "label selector")
			return
		}
		if strings.TrimSpace(s) == "" && (len(sel) != 0 || !sel.matches(map[string]string{s: v})) {
			t.Fatalf("parseSelector(%q) got = %v, expected: an empty selector matching everything", s, sel)
		}
		sel.matches(nil)
		sel.matches(map[string]string{s: v})
		sel.matches(pairs)
		for _, r := range sel {
			if labelKey(r.key) != nil {
				t.Fatalf("parseSelector(%q) accepted key %q, expected: rejected", s, r.key)
			}
		}
	})
}

// checkLabels checks labels(): a rejection names the labels, and every
// accepted label is printable and can be selected by key=value.
func checkLabels(t *testing.T, lim Limits, labels map[string]string) {
	t.Helper()
	if err := lim.labels("session", labels); err != nil {
		checkInvalid(t, err, "session")
		return
	}
	if len(labels) > lim.MaxLabels {
		t.Fatalf("labels %q accepted, expected: rejected over %d labels", labels, lim.MaxLabels)
	}
	for k, v := range labels {
		if !utf8.ValidString(k+v) || strings.ContainsFunc(k+v, unicode.IsControl) || strings.ContainsFunc(k+v, unicode.IsSpace) {
			t.Fatalf("label %q=%q accepted, expected: rejected (control, space or invalid UTF-8)", k, v)
		}
		for _, expr := range []string{k + "=" + v, k + "==" + v, k} {
			sel, err := parseSelector(expr)
			if err != nil {
				t.Fatalf("label %q=%q accepted, but selector %q is rejected: %v", k, v, expr, err)
			}
			if !sel.matches(labels) {
				t.Fatalf("label %q=%q accepted, but selector %q = %v does not match it", k, v, expr, sel)
			}
		}
		sel, err := parseSelector("!" + k)
		if err != nil {
			t.Fatalf("label %q=%q accepted, but selector %q is rejected: %v", k, v, "!"+k, err)
		}
		if sel.matches(labels) {
			t.Fatalf("label %q=%q accepted, but selector %q matches it", k, v, "!"+k)
		}
	}
}

// checkInvalid checks a validation error: it wraps ErrInvalid, and the
// message clients see is not empty and mentions each of mentions.
func checkInvalid(t *testing.T, err error, mentions ...string) {
	t.Helper()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("got = %v, expected: an error wrapping ErrInvalid", err)
	}
	msg := errorMessage(err).Error()
	if msg == "" || msg == ErrInvalid.Error() {
		t.Fatalf("got = %q, expected: a message naming the problem", msg)
	}
	for _, m := range mentions {
		if !strings.Contains(msg, m) {
			t.Fatalf("got = %q, expected: a message mentioning %q", msg, m)
		}
	}
}

// isDNSLabel is RFC 1123's label, written out without a regexp: 1 to 63
// lowercase letters, digits and '-', not starting or ending with '-'.
func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
