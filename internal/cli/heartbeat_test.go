package cli

import (
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

// TestHeartbeatIntervalIsShownToTheMillisecond: a TTL that does not
// divide by 3 shows its interval rounded, not to the nanosecond.
func TestHeartbeatIntervalIsShownToTheMillisecond(t *testing.T) {
	lease := client.LeaseName{Namespace: client.NodeLeaseNamespace, Name: "worker-7"}
	for ttl, want := range map[time.Duration]string{
		4 * time.Second:  "tenure: node-lease/worker-7 is held (token 9); heartbeats every 1.333s",
		40 * time.Second: "tenure: node-lease/worker-7 is held (token 9); heartbeats every 13.333s",
		3 * time.Second:  "tenure: node-lease/worker-7 is held (token 9); heartbeats every 1s",
	} {
		if got := heldLine(lease, 9, ttl); got != want {
			t.Errorf("--ttl %v: got = %q, expected: %q", ttl, got, want)
		}
	}
}
