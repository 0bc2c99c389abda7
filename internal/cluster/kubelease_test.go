package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// syncBuffer is a bytes.Buffer the nodes' loggers share.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A Kubernetes Lease's handover, written through a follower, is applied
// by all three nodes and counted in each one's metrics, but audited
// once, by the leader.
func TestKubernetesLeaseHandoverIsAuditedOncePerCluster(t *testing.T) {
	logs := &syncBuffer{}
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}), cluster.WithKubernetesPrefix("/registry"),
		cluster.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	lead, followers := leaderAndFollowers(t, c)
	ec := etcdClient(t, followers[0])
	ctx := waitCtx(t)
	lease := func(holder string, transitions int) string {
		now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00")
		return fmt.Sprintf(`{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"kube-scheduler","namespace":"kube-system"},"spec":{"holderIdentity":%q,"leaseDurationSeconds":15,"acquireTime":%q,"renewTime":%q,"leaseTransitions":%d}}`, holder, now, now, transitions)
	}
	for i, holder := range []string{"node-1_a", "node-2_b"} {
		if _, err := whileUnavailable(ctx, func(ctx context.Context) (any, error) {
			return ec.Put(ctx, "/registry/leases/kube-system/kube-scheduler", lease(holder, i))
		}); err != nil {
			t.Fatal(err)
		}
	}
	labels := map[string]string{"namespace": "(kubernetes)/kube-system", "lease": "kube-scheduler"}
	for _, n := range c.Nodes() {
		caughtUp(t, lead, n)
		if got := counter(t, n, "tenure_lease_grants_total", labels); got != 2 {
			t.Errorf("%s: kube-scheduler's grants: got = %v, expected: 2, on every node", n, got)
		}
	}
	handovers := regexp.MustCompile(`(?m)^.*msg=audit .*action=kubernetes.lease.handover target=\(kubernetes\)/kube-system/kube-scheduler .*$`).FindAllString(logs.String(), -1)
	if len(handovers) != 1 || !regexp.MustCompile(`node=`+regexp.QuoteMeta(lead.ID())+`\b`).MatchString(handovers[0]) {
		t.Errorf("handover audit lines: got = %q, expected: one, written by the leader %s", handovers, lead)
	}
}
