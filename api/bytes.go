package api

import (
	"strings"
	"unicode/utf8"
)

// Keys and values are bytes (DESIGN.md, safety rule 11), and a protobuf
// string holds only UTF-8, so a key or value that is not UTF-8 travels
// in a message's bytes field beside its string field, and the string
// field shows it by EscapeNonUTF8. A program reads the bytes field; the
// string is for people and for curl.

// EscapeNonUTF8 returns s itself when it is UTF-8. Otherwise it returns s
// with each byte that is not part of a UTF-8 character written as \xNN
// (two lower-case hex digits) and each backslash doubled, so that the
// escaped form reads back to s unambiguously, and is UTF-8.
func EscapeNonUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteByte(hex[s[i]>>4])
			b.WriteByte(hex[s[i]&0xf])
		case r == '\\':
			b.WriteString(`\\`)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
