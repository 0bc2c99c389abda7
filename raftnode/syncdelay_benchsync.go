//go:build benchsync

package raftnode

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// SyncDelayEnv names the environment variable a benchsync build reads
// once: a Go duration added after every log sync.
const SyncDelayEnv = "TENURE_BENCH_SYNC_DELAY"

// syncDelay reads TENURE_BENCH_SYNC_DELAY on first use. A value that is
// not a duration panics with its name: a measurement on a mistyped
// delay would silently be one at no delay.
var syncDelay = sync.OnceValue(func() time.Duration {
	d, err := parseSyncDelay(os.Getenv(SyncDelayEnv))
	if err != nil {
		panic(err)
	}
	return d
})

func parseSyncDelay(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("raftnode: %s=%q: want a duration of 0 or more, such as 1ms", SyncDelayEnv, s)
	}
	return d, nil
}

// afterLogSync sleeps TENURE_BENCH_SYNC_DELAY after each durable write
// of the WAL, on the goroutine that wrote: what a disk whose sync
// takes that much longer costs.
func afterLogSync() {
	if d := syncDelay(); d > 0 {
		time.Sleep(d)
	}
}
