package cli

import (
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag value in bytes, written as a number with an
// optional binary unit: 4194304, 4096KiB, 4MiB, 1GiB (K, M, G also mean
// KiB, MiB, GiB).
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

func (b *byteSize) Set(s string) error {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size (write e.g. 4194304, 512KiB, 64MiB or 1GiB)", s)
	}
	*b = byteSize(n * mult)
	return nil
}

func (b byteSize) String() string {
	for _, u := range byteUnits[:3] {
		if b != 0 && int64(b)%u.mult == 0 {
			return strconv.FormatInt(int64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

func (b *byteSize) Type() string { return "size" }
