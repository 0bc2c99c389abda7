package bench

import (
	"testing"
	"time"
)

// One commit's floor: a round trip and a sync, plus on a cluster the
// peer round trip, plus Tenure's injected sync delay (never etcd's,
// whose disk the harness leaves alone).
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
}
