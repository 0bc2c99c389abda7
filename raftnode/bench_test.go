package raftnode

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"
)

func BenchmarkPropose(b *testing.B) {
	for _, store := range logStores {
		b.Run(store, func(b *testing.B) {
			n := openFake(b, benchConfig(b.TempDir(), store), nil)
			waitLeader(b, n)
			// Cancellable, as a server request's context is.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if _, err := n.Propose(ctx, trivial); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			// The mean hides the disk's long tail: report the median too.
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2])/float64(time.Microsecond), "p50-µs")
		})
	}
}

func BenchmarkProposeParallel(b *testing.B) {
	for _, store := range logStores {
		b.Run(store, func(b *testing.B) {
			n := openFake(b, benchConfig(b.TempDir(), store), nil)
			waitLeader(b, n)
			// 64 proposers on any GOMAXPROCS: enough to fill raft's batches.
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := n.Propose(ctx, trivial); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// benchConfig is testConfig with raft-wal's own segment size, the one a
// server runs with.
func benchConfig(dir, logStore string) Config {
	cfg := testConfig(dir, logStore)
	cfg.WALSegmentSize = 0
	return cfg
}
