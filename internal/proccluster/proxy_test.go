package proccluster

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/testnet"
)

// oneNode is a cluster of one node with no process: its three proxies
// front an echo server, so a test can drive the proxies alone.
func oneNode(t *testing.T) *Cluster {
	t.Helper()
	c := &Cluster{t: t, groups: make([]int, 1)}
	n := &Node{c: c}
	c.Nodes = []*Node{n}
	target := testnet.Echo(t)
	n.apiProxy = newProxy(c, 0, testnet.Listen(t), target, false)
	n.peerProxy = newProxy(c, 0, testnet.Listen(t), target, true)
	n.etcdProxy = newProxy(c, 0, testnet.Listen(t), target, false)
	t.Cleanup(func() {
		n.apiProxy.close()
		n.peerProxy.close()
		n.etcdProxy.close()
	})
	return c
}

type line struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialLine(t *testing.T, addr string) *line {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &line{t: t, c: c, r: bufio.NewReader(c)}
}

// roundTrip sends a line and times its echo.
func (l *line) roundTrip() time.Duration {
	l.t.Helper()
	start := time.Now()
	if _, err := l.c.Write([]byte("ping\n")); err != nil {
		l.t.Fatal(err)
	}
	got, err := l.r.ReadString('\n')
	if err != nil || got != "ping\n" {
		l.t.Fatalf("echo: got = %q, %v, expected: %q", got, err, "ping\n")
	}
	return time.Since(start)
}

// TestPeerProxyDelaysAndAPartitionStillCutsIt checks that the cluster's
// latency delays the peer proxy's links (also those already open when it
// changes) and not the API proxy's, and that a partition cuts a delayed
// link at once, dropping what is still in its delay line.
func TestPeerProxyDelaysAndAPartitionStillCutsIt(t *testing.T) {
	c := oneNode(t)
	n := c.Nodes[0]
	peer := dialLine(t, n.peerProxy.addr())
	peer.roundTrip()
	for _, rtt := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond} {
		c.SetLatency(rtt)
		for range 3 {
			if took := peer.roundTrip(); took < rtt {
				t.Errorf("peer round trip at latency %v: got = %v, expected: at least %v", rtt, took, rtt)
			}
		}
	}
	fresh := dialLine(t, n.peerProxy.addr())
	if took := fresh.roundTrip(); took < 50*time.Millisecond {
		t.Errorf("round trip on a link opened after SetLatency(50ms): got = %v, expected: at least 50ms", took)
	}

	// A long delay keeps the ping in the delay line while the partition
	// comes: it must never arrive.
	c.SetLatency(time.Hour)
	if _, err := peer.c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	c.Isolate(0) // the test's own connections are cut off from node 0
	if got, err := peer.r.ReadString('\n'); err == nil {
		t.Errorf("read on a cut delayed link: got = %q, expected: the connection ended", got)
	}
	again := dialLine(t, n.peerProxy.addr())
	if got, err := again.r.ReadString('\n'); err == nil {
		t.Errorf("read on a link dialed during the partition: got = %q, expected: the connection ended", got)
	}
}

// TestLinkLatencyDelaysOnlyThatPairOfNodes sets a latency between the
// leader and one follower of a running cluster and checks every raft
// link's delay: the proxies must tell which node dialed each.
func TestLinkLatencyDelaysOnlyThatPairOfNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three tenure processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := StartWith(t, 3, WithPeerRTT(time.Millisecond))
	leader := c.WaitLeader(ctx)
	follower := (leader + 1) % 3
	const rtt = 4 * time.Millisecond
	c.SetLinkLatency(leader, follower, rtt)
	// A write commits: the cluster works with its links delayed.
	c.WaitCaughtUp(ctx)
	delayed := 0
	for _, n := range c.Nodes {
		p := n.peerProxy
		p.mu.Lock()
		for l := range p.links {
			want := time.Millisecond / 2
			if pair(l.from, p.to) == pair(leader, follower) {
				want = rtt / 2
				delayed++
			}
			if got := l.delay(); got != want {
				t.Errorf("link from %d to node %d: one-way delay got = %v, expected: %v", l.from, p.to, got, want)
			}
		}
		p.mu.Unlock()
	}
	if delayed == 0 {
		t.Errorf("links between leader %d and follower %d: got = none, expected: the leader's raft connections to it", leader, follower)
	}
}
