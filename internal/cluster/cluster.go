package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// Option changes how New builds the cluster.
type Option func(*options)

type options struct {
	limits server.Limits
	raft   []func(*raftnode.Config)
	logger *slog.Logger
	etcd   *server.Compaction // nil: no etcd API
	kube   string             // server.Config.KubernetesPrefix
}

// WithEtcd serves the etcd v3 API on every node too (Node.EtcdAddr),
// with automatic compaction c.
func WithEtcd(c server.Compaction) Option { return func(o *options) { o.etcd = &c } }

// WithKubernetesPrefix shows the Kubernetes Leases under prefix on
// every node (server.Config.KubernetesPrefix); off by default.
func WithKubernetesPrefix(prefix string) Option { return func(o *options) { o.kube = prefix } }

// WithLimits sets every node's limits; the default is
// server.DefaultLimits with a 100ms minimum TTL, so that expiry tests
// take a fraction of a second.
func WithLimits(l server.Limits) Option { return func(o *options) { o.limits = l } }

// WithRaft changes every node's raft configuration after the cluster has
// filled it in, e.g. to lengthen the timeouts.
func WithRaft(change func(*raftnode.Config)) Option {
	return func(o *options) { o.raft = append(o.raft, change) }
}

// WithLogger sends every node's log to l, each record tagged with the
// node's ID. By default logs are discarded, unless TENURE_TEST_LOG is set,
// which sends them to stderr at debug level.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// ElectionTimeout is every node's: short enough that a failover takes
// well under a second, long enough that a follower fsyncing under -race
// on two cores does not miss heartbeats (every 20ms) and start needless
// elections.
const ElectionTimeout = 200 * time.Millisecond

// Cluster is n Tenure servers in one process. The methods that change it
// are meant for the test goroutine; the others are safe anywhere.
type Cluster struct {
	t      testing.TB
	opts   options
	voters []raftnode.Peer
	nodes  []*Node

	mu        sync.Mutex // guards every node's srv, reg and group, and nextGroup
	nextGroup int

	net *raftnode.MemNetwork // carries every node's raft messages
}

// Node is one server of a Cluster. Its accessors are safe for concurrent
// use.
type Node struct {
	c    *Cluster
	id   string // raft ID, also its raft address on the in-memory network
	dir  string
	addr string // the API's "127.0.0.1:port", the same across restarts
	etcd string // the etcd API's, with WithEtcd; also kept across restarts
	api  API
	// http carries api's calls. Stop closes its idle connections first:
	// an idle HTTP/2 connection holds the server's Shutdown for the
	// second HTTP/2 gives a client to leave after GOAWAY.
	http *http.Transport

	// guarded by c.mu
	srv   *server.Server // nil while stopped
	reg   *prometheus.Registry
	group int // nodes in the same group reach each other
}

// API is the generated Connect clients of one node's API, over cleartext
// HTTP/2 so that streams work.
type API struct {
	Sessions tenurev1connect.SessionServiceClient
	Leases   tenurev1connect.LeaseServiceClient
	KV       tenurev1connect.KVServiceClient
	Cluster  tenurev1connect.ClusterServiceClient
}

// New starts an n-node cluster, n0…n(n-1), every node bootstrapped with
// the same n voters, and returns once one of them is a promoted leader.
// It fails the test if that takes more than 10 seconds, and stops every
// node when the test ends.
func New(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("cluster: %d nodes, expected at least 1", n)
	}
	o := options{limits: server.DefaultLimits()}
	o.limits.MinTTL = 100 * time.Millisecond
	switch {
	case os.Getenv("TENURE_TEST_LOG") != "":
		o.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	default:
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, opt := range opts {
		opt(&o)
	}

	c := &Cluster{t: t, opts: o, net: raftnode.NewMemNetwork()}
	for i := range n {
		id := fmt.Sprintf("n%d", i)
		c.voters = append(c.voters, raftnode.Peer{ID: id, Address: id})
		// Data directories first: t.TempDir removes them in a cleanup
		// that runs after the cluster's own, registered below.
		c.nodes = append(c.nodes, &Node{c: c, id: id, dir: t.TempDir()})
	}
	t.Cleanup(c.close)
	for _, node := range c.nodes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("cluster: %v", err)
		}
		node.addr = ln.Addr().String()
		if o.etcd != nil {
			eln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatalf("cluster: %v", err)
			}
			node.etcd = eln.Addr().String()
			eln.Close() // start listens on it again, as Restart does
		}
		var protocols http.Protocols
		protocols.SetUnencryptedHTTP2(true)
		node.http = &http.Transport{Protocols: &protocols}
		hc := &http.Client{Transport: node.http}
		url := node.URL()
		node.api = API{
			Sessions: tenurev1connect.NewSessionServiceClient(hc, url),
			Leases:   tenurev1connect.NewLeaseServiceClient(hc, url),
			KV:       tenurev1connect.NewKVServiceClient(hc, url),
			Cluster:  tenurev1connect.NewClusterServiceClient(hc, url),
		}
		if err := c.start(node, ln); err != nil {
			t.Fatalf("cluster: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatalf("cluster: %v", err)
	}
	return c
}

// start opens node's server on ln, on a new transport at the node's raft
// address, and wires it to the nodes of its group.
func (c *Cluster) start(node *Node, ln net.Listener) error {
	rc := raftnode.Config{
		NodeID:  node.id,
		DataDir: node.dir,
		Network: c.net,
		// Ignored on a restart, which finds state in DataDir.
		Bootstrap:     true,
		InitialVoters: c.voters,
		// Each segment is preallocated whole; raft-wal's 64MiB, times
		// the nodes of every test, is disk for nothing.
		WALSegmentSize:  1 << 20,
		ElectionTimeout: ElectionTimeout,
	}
	for _, change := range c.opts.raft {
		change(&rc)
	}
	reg := prometheus.NewRegistry()
	cfg := server.Config{
		Listener: ln,
		Raft:     rc,
		Limits:   c.opts.limits,
		Logger:   c.opts.logger.With("node", node.id),
		Registry: reg,

		KubernetesPrefix: c.opts.kube,
	}
	if c.opts.etcd != nil {
		eln, err := net.Listen("tcp", node.etcd)
		if err != nil {
			ln.Close()
			return fmt.Errorf("start %s: etcd API: %w", node.id, err)
		}
		// etcd users' password hashes at bcrypt's least cost: at etcd's
		// (10), each user add and login took seconds under the race
		// detector on a loaded machine (what is tested is who may log in,
		// not the hash's strength).
		cfg.Etcd = server.EtcdConfig{Listener: eln, Compaction: *c.opts.etcd, BcryptCost: bcrypt.MinCost}
	}
	srv, err := server.Open(cfg)
	if err != nil {
		ln.Close()
		if cfg.Etcd.Listener != nil {
			cfg.Etcd.Listener.Close()
		}
		return fmt.Errorf("start %s: %w", node.id, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	node.srv, node.reg = srv, reg
	c.wireLocked()
	return nil
}

// wireLocked connects every running node to the running nodes of its
// group and disconnects it from all others, both ways.
func (c *Cluster) wireLocked() {
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			switch {
			case a == b:
			case a.srv != nil && b.srv != nil && a.group == b.group:
				c.net.Connect(a.id, b.id)
			default:
				c.net.Disconnect(a.id, b.id)
			}
		}
	}
}

// close stops every node.
func (c *Cluster) close() {
	for _, n := range c.nodes {
		if n.http == nil {
			continue // New failed before reaching it
		}
		if err := c.Stop(n); err != nil {
			c.t.Errorf("cluster: stop %s: %v", n.id, err)
		}
		n.http.CloseIdleConnections()
	}
}

// Nodes returns every node, running or not, in ID order.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// Node returns node i, whose ID is "n<i>".
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// Leader waits until a running node serves a linearizable read, which
// only a promoted leader in touch with a quorum does, and returns it. A
// deposed leader that still believes it leads is never returned. It
// fails when ctx ends first.
func (c *Cluster) Leader(ctx context.Context) (*Node, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, n := range c.nodes {
			if n.Running() && n.serving(ctx) {
				return n, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no promoted leader: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// probeKey is read to ask a node whether it leads; it is never written.
const probeKey = "tenure-cluster-probe"

// serving reports whether n answers a linearizable read: found or not,
// the answer came from the leader.
func (n *Node) serving(ctx context.Context) bool {
	// A partitioned leader holds a read until it steps down; the probe
	// moves on to the next node well before then.
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	// Without forwarding, or a follower would answer with the leader's
	// answer.
	req := connect.NewRequest(&tenurev1.GetRequest{Key: probeKey})
	req.Header().Set(server.ForwardedHeader, "cluster-probe")
	_, err := n.api.KV.Get(ctx, req)
	return err == nil || connect.CodeOf(err) == connect.CodeNotFound
}

// Followers waits for a leader as Leader does and returns the other
// running nodes.
func (c *Cluster) Followers(ctx context.Context) ([]*Node, error) {
	leader, err := c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Node
	for _, n := range c.nodes {
		if n != leader && n.Running() {
			out = append(out, n)
		}
	}
	return out, nil
}

// Partition cuts the raft traffic between nodes and the rest of the
// cluster, both ways; nodes still reach each other, and every API still
// answers clients. Heal undoes it.
func (c *Cluster) Partition(nodes ...*Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextGroup++
	for _, n := range nodes {
		n.group = c.nextGroup
	}
	c.wireLocked()
}

// Disconnect cuts n off from every other node: Partition(n).
func (c *Cluster) Disconnect(n *Node) { c.Partition(n) }

// Heal reconnects every running node to every other.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		n.group = 0
	}
	c.wireLocked()
}

// Stop crashes n as far as the others can tell: it is cut off first, then
// closed (which waits up to the server's shutdown grace for calls under
// way). Its data directory stays for Restart. Stopping a stopped node
// does nothing.
func (c *Cluster) Stop(n *Node) error {
	c.mu.Lock()
	srv := n.srv
	n.srv, n.reg = nil, nil
	if srv != nil {
		c.wireLocked() // the others no longer reach it, nor it them
	}
	c.mu.Unlock()
	if srv == nil {
		return nil
	}
	n.http.CloseIdleConnections()
	return srv.Close()
}

// Shutdown stops n the way SIGTERM stops tenure serve: still connected,
// it finishes the calls under way and, if it leads, hands leadership to
// another voter before closing. Restart brings it back.
func (c *Cluster) Shutdown(n *Node) error {
	c.mu.Lock()
	srv := n.srv
	c.mu.Unlock()
	if srv == nil {
		return nil
	}
	n.http.CloseIdleConnections()
	err := srv.Close()
	c.mu.Lock()
	n.srv, n.reg = nil, nil
	c.wireLocked()
	c.mu.Unlock()
	return err
}

// Restart starts a stopped node again on its data directory and API
// address, as the same raft node, in the group it was in. It returns once
// the server is open, not once it has caught up or been elected.
func (c *Cluster) Restart(n *Node) error {
	if n.Running() {
		return fmt.Errorf("cluster: %s is running", n.id)
	}
	ln, err := net.Listen("tcp", n.addr)
	if err != nil {
		return fmt.Errorf("cluster: listen on %s again: %w", n.addr, err)
	}
	return c.start(n, ln)
}

// ID is the node's raft ID, "n<i>", which is also its raft address.
func (n *Node) ID() string { return n.id }

// Addr is the node's API endpoint, "127.0.0.1:port", the same across
// restarts.
func (n *Node) Addr() string { return n.addr }

// EtcdAddr is the node's etcd API endpoint, "127.0.0.1:port", the same
// across restarts; "" unless the cluster was made WithEtcd.
func (n *Node) EtcdAddr() string { return n.etcd }

// DataDir is the node's data directory, which outlives its restarts.
func (n *Node) DataDir() string { return n.dir }

// URL is "http://" + Addr.
func (n *Node) URL() string { return "http://" + n.addr }

// API returns Connect clients of the node's API. They stay valid across
// restarts; calls fail while the node is stopped.
func (n *Node) API() API { return n.api }

// Running reports whether the node is started.
func (n *Node) Running() bool {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return n.srv != nil
}

// Server returns the node's server, nil while it is stopped.
func (n *Node) Server() *server.Server {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return n.srv
}

// Metrics returns the registry of the node's current run (each restart
// starts a new one), or an error while it is stopped.
func (n *Node) Metrics() (prometheus.Gatherer, error) {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	if n.reg == nil {
		return nil, errors.New("cluster: " + n.id + " is stopped")
	}
	return n.reg, nil
}

func (n *Node) String() string { return n.id }
