//go:build !benchsync

package raftnode

// afterLogSync is called by the WAL right after each write they
// made durable returns. In a release build it does nothing; a build with
// -tags benchsync makes it sleep TENURE_BENCH_SYNC_DELAY, a slower disk
// for measurements (syncdelay_benchsync.go).
func afterLogSync() {}
