//go:build benchsync

package raftnode

import (
	"testing"
	"time"
)

// TestSyncDelay runs in a benchsync build only:
//
//	go test -tags benchsync -run TestSyncDelay ./raftnode
//
// It checks that the delay is read from the environment and added to
// every log sync, and that a mistyped one is refused by name.
func TestSyncDelay(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false},
		{"1ms", time.Millisecond, false},
		{"250us", 250 * time.Microsecond, false},
		{"0", 0, false},
		{"1", 0, true},
		{"-1ms", 0, true},
		{"slow", 0, true},
	} {
		got, err := parseSyncDelay(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseSyncDelay(%q): got = %v, %v, expected: %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}

	// syncDelay reads the variable once, at the first sync: this test
	// is the process's first.
	const delay = 30 * time.Millisecond
	t.Setenv(SyncDelayEnv, delay.String())
	for range 3 {
		start := time.Now()
		afterLogSync()
		if took := time.Since(start); took < delay {
			t.Errorf("afterLogSync with %s=%v: took %v, expected: at least %v", SyncDelayEnv, delay, took, delay)
		}
	}
}
