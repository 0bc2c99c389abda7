package bench

import (
	"testing"
	"time"
)

// One commit's floor: a round trip and a sync, plus on a cluster the
// peer round trip, plus the injected sync delay: Tenure's, and etcd's
// only when it runs under a tracer that adds it.
func TestTheCommitFloorCountsWhatEachSystemPays(t *testing.T) {
	f := floor{sync: 200 * time.Microsecond, rtt: 40 * time.Microsecond}
	spec := ServerSpec{PeerRTT: 300 * time.Microsecond, SyncDelay: time.Millisecond}
	for _, tt := range []struct {
		sys   System
		nodes int
		want  time.Duration
	}{
		{Tenure, 1, 1240 * time.Microsecond},
		{Etcd, 1, 240 * time.Microsecond},
		{Tenure, 3, 1540 * time.Microsecond},
		{Etcd, 3, 540 * time.Microsecond},
	} {
		if got := f.commit(spec, tt.sys, tt.nodes); got != tt.want {
			t.Errorf("%s on %d nodes: got = %v, expected: %v", tt.sys, tt.nodes, got, tt.want)
		}
	}
	// etcd under a tracer that delays its syncs pays the delay as well.
	spec.EtcdTracer = "/usr/bin/strace"
	if got, want := f.commit(spec, Etcd, 3), 1540*time.Microsecond; got != want {
		t.Errorf("etcd on 3 nodes, its syncs delayed: got = %v, expected: %v", got, want)
	}
}

// On a cluster the floor is also given at the sync the nodes measured in
// the window (the mean of their log syncs, delay and all) in place of
// the disk's alone, and one client's pairs are compared with it; a
// window in which no node synced adds nothing.
func TestTheClusterFloorTakesTheNodesOwnSync(t *testing.T) {
	f := floor{sync: 80 * time.Microsecond, rtt: 20 * time.Microsecond}
	spec := ServerSpec{PeerRTT: 300 * time.Microsecond, SyncDelay: time.Millisecond}
	var r Result
	r.addClusterFloor(f, spec, syncs{count: 10, seconds: 1}, syncs{count: 110, seconds: 1.148}, 250)
	for name, want := range map[string]float64{
		"log sync mean, all nodes":              1.48,
		"one commit's floor at the nodes' sync": 1.8,
		"of the pair limit at the nodes' sync":  90, // 250/s of 1/(2 × 1.8 ms)
	} {
		got, ok := r.figure(name)
		if !ok || got.Value < want-1e-3 || got.Value > want+1e-3 {
			t.Errorf("%s: got = %v (present %v), expected: %v", name, got.Value, ok, want)
		}
	}
	var none Result
	none.addClusterFloor(f, spec, syncs{count: 5, seconds: 1}, syncs{count: 5, seconds: 1}, 250)
	if len(none.Figures) != 0 {
		t.Errorf("no sync in the window: got = %v, expected: no figure", none.Figures)
	}
}
