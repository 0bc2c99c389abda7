package proccluster

import "time"

// Option changes how StartWith runs a cluster.
type Option func(*options)

type options struct {
	args      []string
	peerRTT   time.Duration
	syncDelay time.Duration
}

// WithArgs adds extra to every node's command line.
func WithArgs(extra ...string) Option {
	return func(o *options) { o.args = append(o.args, extra...) }
}

// WithPeerRTT adds rtt to every round trip between nodes from the start,
// as SetLatency does.
func WithPeerRTT(rtt time.Duration) Option {
	return func(o *options) { o.peerRTT = max(rtt, 0) }
}

// WithSyncDelay runs the nodes from BenchBinary with
// TENURE_BENCH_SYNC_DELAY=d: every sync of their raft log store takes d
// longer, as on a slower disk.
func WithSyncDelay(d time.Duration) Option {
	return func(o *options) { o.syncDelay = max(d, 0) }
}

// SetLatency adds rtt to every round trip between nodes (rtt/2 each
// way), on open connections too, replacing what SetLinkLatency set; 0
// takes it away. Only the peer (raft) proxies delay: clients' calls and
// the writes a follower forwards to the leader through the API proxies
// are not delayed. Safe for concurrent use.
func (c *Cluster) SetLatency(rtt time.Duration) {
	c.mu.Lock()
	c.rtt, c.linkRTT = max(rtt, 0), nil
	c.mu.Unlock()
	c.retune()
}

// SetLinkLatency adds rtt to every round trip between nodes a and b, in
// both directions, on open connections too. Telling which node opened a
// connection needs Linux's /proc, as partitions do; the test is skipped
// elsewhere. Safe for concurrent use from the test goroutine.
func (c *Cluster) SetLinkLatency(a, b int, rtt time.Duration) {
	c.t.Helper()
	if a == b || a < 0 || b < 0 || a >= len(c.Nodes) || b >= len(c.Nodes) {
		c.t.Fatalf("SetLinkLatency(%d, %d): need two different nodes of 0..%d", a, b, len(c.Nodes)-1)
	}
	if !canIdentify {
		c.t.Skip("latency per link needs Linux's /proc to tell which node dialed a proxy")
	}
	c.mu.Lock()
	if c.linkRTT == nil {
		c.linkRTT = map[[2]int]time.Duration{}
	}
	c.linkRTT[pair(a, b)] = max(rtt, 0)
	c.mu.Unlock()
	c.retune()
}

func pair(a, b int) [2]int { return [2]int{min(a, b), max(a, b)} }

// oneWay is the delay of each direction of a connection from (a node
// index, external or unknown) to node to's peer proxy.
func (c *Cluster) oneWay(from, to int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rtt, ok := c.linkRTT[pair(from, to)]; ok && from >= 0 {
		return rtt / 2
	}
	return c.rtt / 2
}

// perLink reports whether links need their dialers known for their
// delays.
func (c *Cluster) perLink() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.linkRTT) > 0
}

// retune gives every open peer link the delay the settings now ask for,
// attributing the unattributed links first if per-link settings need it.
func (c *Cluster) retune() {
	owners := func(int, int) int { return unknown }
	if c.perLink() {
		owners = c.owners()
	}
	for _, n := range c.Nodes {
		n.peerProxy.retune(owners)
	}
}
