// Package cluster_test runs fault tests against a cluster of real
// tenure processes (internal/proccluster): leader kills under load,
// partitions, pauses, rolling restarts, with histories checked for
// linearizability (internal/linearizability). See docs/operations.md,
// "Fault tests", for the long randomized run.
package cluster_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/tenurehq/tenure/internal/proccluster"
)

func TestMain(m *testing.M) { proccluster.Main(m) }

// faultRounds is how many fault cycles a test runs: ci in CI and by
// default, TENURE_FAULT_ROUNDS when set (the long randomized run).
func faultRounds(t *testing.T, ci int) int {
	t.Helper()
	if s := os.Getenv("TENURE_FAULT_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("TENURE_FAULT_ROUNDS=%q: want a positive number", s)
		}
		return n
	}
	return ci
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of tenure processes")
	}
}

// startCluster starts three nodes with a low snapshot threshold, so that
// restarts restore snapshots and followers catch up from them too.
func startCluster(t *testing.T) *proccluster.Cluster {
	t.Helper()
	return proccluster.Start(t, 3, "--snapshot-threshold", "1024")
}
