package api

import (
	"testing"
	"unicode/utf8"
)

func TestEscapeNonUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{`a\b`, `a\b`}, // UTF-8: shown as it is
		{"пример", "пример"},
		{"\uFFFD", "\uFFFD"}, // the replacement character itself is UTF-8
		{"\xff\xfe", `\xff\xfe`},
		{"/c/\xff", `/c/\xff`},
		{"/u/\xd0\xc0", `/u/\xd0\xc0`}, // п's range end
		{"\xd0\xbf\xff", `п\xff`},
		{"a\\\xff", `a\\\xff`},
		{"\x00\xc0\x80", "\x00" + `\xc0\x80`}, // NUL is UTF-8; an overlong NUL is not
		{"\xed\xa0\x80", `\xed\xa0\x80`},      // a surrogate
	}
	for _, tt := range tests {
		got := EscapeNonUTF8(tt.in)
		if got != tt.want {
			t.Errorf("EscapeNonUTF8(%q): got = %q, expected: %q", tt.in, got, tt.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("EscapeNonUTF8(%q) = %q: not UTF-8", tt.in, got)
		}
	}
}
