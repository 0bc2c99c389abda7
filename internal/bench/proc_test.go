package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and a ')' must not shift the fields.
	stat := "4242 (tenure (x) serve) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 12 0 100 0 0\n"
	got, err := parseStatCPU([]byte(stat))
	if want := 325 * time.Second / clockTick; err != nil || got != want {
		t.Errorf("parseStatCPU got = %v, %v, expected: %v, nil", got, err, want)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1")); err == nil {
		t.Error("parseStatCPU of a short line got = nil error, expected: an error")
	}
}

func TestParseBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// idle and iowait are not busy, and guest is inside user already.
	stat := "cpu  100 2 30 5000 40 5 6 7 50 0\ncpu0 50 1 15 2500 20 2 3 3 25 0\n"
	got, err := parseBusy([]byte(stat))
	if want := 150 * time.Second / clockTick; err != nil || got != want {
		t.Errorf("parseBusy got = %v, %v, expected: %v, nil", got, err, want)
	}
	if _, err := parseBusy([]byte("intr 1 2 3\n")); err == nil {
		t.Error("parseBusy without a cpu line got = nil error, expected: an error")
	}
}

func TestParseStatusRSS(t *testing.T) {
	got, err := parseStatusRSS([]byte("Name:\ttenure\nVmHWM:\t  9000 kB\nVmRSS:\t  2048 kB\n"))
	if err != nil || got != 2048<<10 {
		t.Errorf("parseStatusRSS got = %d, %v, expected: %d, nil", got, err, 2048<<10)
	}
	if _, err := parseStatusRSS([]byte("Name:\tzombie\n")); err == nil {
		t.Error("parseStatusRSS without VmRSS got = nil error, expected: an error")
	}
}

func TestReadUsageOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	u, err := readUsage(os.Getpid())
	if err != nil || u.RSS <= 0 {
		t.Errorf("readUsage(self) got = %+v, %v, expected: some memory, nil", u, err)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP tenure_lessor_expiries_proposed_total Expiries.
# TYPE tenure_lessor_expiries_proposed_total counter
tenure_lessor_expiries_proposed_total{kind="key"} 4
tenure_lessor_expiries_proposed_total{kind="session"} 3
tenure_lessor_expiries_proposed_total_extra 100
tenure_lessor_heartbeats_total 1.5e+06
`
	tests := []struct {
		name  string
		match []string
		want  float64
	}{
		{"tenure_lessor_expiries_proposed_total", nil, 7},
		{"tenure_lessor_expiries_proposed_total", []string{`kind="session"`}, 3},
		{"tenure_lessor_heartbeats_total", nil, 1.5e6},
		{"absent_total", nil, 0},
	}
	for _, tt := range tests {
		got, err := sumMetric(strings.NewReader(text), tt.name, tt.match)
		if err != nil || got != tt.want {
			t.Errorf("sumMetric(%s, %v) got = %v, %v, expected: %v, nil", tt.name, tt.match, got, err, tt.want)
		}
	}
}
