package cli

import "testing"

func TestByteSizeFlag(t *testing.T) {
	cases := []struct {
		in   string
		want byteSize
		err  bool
	}{
		{in: "4194304", want: 4 << 20},
		{in: "4MiB", want: 4 << 20},
		{in: "4M", want: 4 << 20},
		{in: "512KiB", want: 512 << 10},
		{in: "1GiB", want: 1 << 30},
		{in: "0", want: 0},
		{in: " 64MiB ", want: 64 << 20},
		{in: "64MB", err: true},
		{in: "-1MiB", err: true},
		{in: "lots", err: true},
		{in: "", err: true},
	}
	for _, tc := range cases {
		var b byteSize
		err := b.Set(tc.in)
		if tc.err {
			if err == nil {
				t.Errorf("Set(%q): got = %v, expected: an error", tc.in, b)
			}
			continue
		}
		if err != nil || b != tc.want {
			t.Errorf("Set(%q): got = %v, %v, expected: %v", tc.in, b, err, tc.want)
		}
	}
	if got := byteSize(64 << 20).String(); got != "64MiB" {
		t.Errorf("String: got = %q, expected: 64MiB", got)
	}
}
