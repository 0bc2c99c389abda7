package cluster

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdClient waits for a leader, then returns etcd's client on node 0's
// etcd API, closed when the test ends: how the tests of the page, the CLI
// and the Kubernetes view put etcd locks and Leases in place. A failure
// ends the test.
func (c *Cluster) EtcdClient(ctx context.Context) *clientv3.Client {
	c.t.Helper()
	if _, err := c.Leader(ctx); err != nil {
		c.t.Fatal(err)
	}
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Node(0).EtcdAddr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { ec.Close() })
	return ec
}
