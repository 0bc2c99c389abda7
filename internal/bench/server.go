package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tenurehq/tenure/internal/proccluster/delayline"
)

// Server is a running system under test, one node or a cluster, that the
// harness started as child processes on free 127.0.0.1 ports with its
// data in a directory of its own. The caller must call Stop, which stops
// every node and removes the data.
type Server struct {
	System    System
	Endpoints []string // client addresses, host:port
	// EtcdEndpoints are Tenure's etcd API addresses, when the spec
	// asked for them (EtcdAPI).
	EtcdEndpoints []string
	procs         []*proc
	thread        *forkThread        // the procs are started on it
	proxies       []*delayline.Proxy // in front of each node's peer port, with PeerRTT
	dir           string
	metrics       []string // each node's /metrics URL
}

// ServerSpec says how to start the servers.
type ServerSpec struct {
	TenureBinary string // runs "serve"
	EtcdBinary   string
	// EtcdAPI has Tenure also serve its etcd API (--etcd-listen), for
	// etcd's client to drive it.
	EtcdAPI bool
	// Dir is where data directories and logs are made ("" = the system's
	// temporary directory).
	Dir string
	// PeerRTT, when positive, puts a delaying proxy (package delayline)
	// in front of every cluster node's peer port and has the nodes reach
	// each other through it, so that every raft round trip between nodes
	// takes PeerRTT longer, for Tenure and etcd alike. Clients' calls are
	// not delayed.
	PeerRTT time.Duration
	// SyncDelay, when positive, is added after every sync of Tenure's
	// log store (TENURE_BENCH_SYNC_DELAY); TenureBinary must be a
	// benchsync build (CheckBenchSync). With EtcdTracer, every sync of
	// etcd's is slowed as much (etcdsync.go); without, etcd's disk is
	// left as it is.
	SyncDelay time.Duration
	// EtcdTracer is the strace that delays etcd's syncs, "" for none.
	EtcdTracer string
	// ProfileDir, when set, has both servers serve Go's profiles
	// (--enable-pprof) and the harness save a CPU profile and an
	// execution trace of every node across each measured window there
	// (profile.go).
	ProfileDir string
	// TenureArgs are more flags for every tenure serve, after the
	// harness's own: a workload's settings (the growth workload lifts
	// the history retention and the watch limit).
	TenureArgs []string
}

// Start starts sys with nodes nodes (1 or 3) and returns once every node
// answers its health check and, for a cluster, a leader is elected.
func (sp ServerSpec) Start(ctx context.Context, sys System, nodes int) (*Server, error) {
	var last error
	// A port found free can be taken by someone else before the server
	// binds it; a second try with other ports settles that.
	for range 3 {
		s, err := sp.start(ctx, sys, nodes)
		if err == nil {
			return s, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

func (sp ServerSpec) start(ctx context.Context, sys System, nodes int) (*Server, error) {
	dir, err := os.MkdirTemp(sp.Dir, "tenure-bench-"+string(sys)+"-")
	if err != nil {
		return nil, fmt.Errorf("make a data directory: %w", err)
	}
	s := &Server{System: sys, dir: dir, thread: newForkThread()}
	ports, err := freePorts(3 * nodes)
	if err != nil {
		s.Stop()
		return nil, err
	}
	api := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[3*i]) }
	peer := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[3*i+1]) }
	// peerAdvertise is where the other nodes reach node i's peer port:
	// its proxy, when there is one.
	peerAdvertise := peer
	if sp.PeerRTT > 0 && nodes > 1 {
		for i := range nodes {
			p, err := delayline.Listen("127.0.0.1:0", peer(i), sp.PeerRTT)
			if err != nil {
				s.Stop()
				return nil, err
			}
			s.proxies = append(s.proxies, p)
		}
		peerAdvertise = func(i int) string { return s.proxies[i].Addr() }
	}
	etcdAPI := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[3*i+2]) }
	for i := range nodes {
		s.Endpoints = append(s.Endpoints, api(i))
		switch {
		case sys == Etcd:
			s.EtcdEndpoints = append(s.EtcdEndpoints, api(i))
		case sp.EtcdAPI:
			s.EtcdEndpoints = append(s.EtcdEndpoints, etcdAPI(i))
		}
		s.metrics = append(s.metrics, "http://"+api(i)+"/metrics")
	}
	for i := range nodes {
		name := fmt.Sprintf("%s node %d", sys, i+1)
		data := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		logPath := filepath.Join(dir, fmt.Sprintf("node%d.log", i+1))
		var bin string
		var args, env []string
		switch sys {
		case Tenure:
			bin = sp.TenureBinary
			args = []string{"serve", "--listen", api(i), "--peer-listen", peer(i), "--data-dir", data, "--log-level", "warn"}
			if s.proxies != nil {
				args = append(args, "--peer-advertise", peerAdvertise(i))
			}
			if sp.SyncDelay > 0 {
				env = []string{syncDelayEnv + "=" + sp.SyncDelay.String()}
			}
			if sp.EtcdAPI {
				args = append(args, "--etcd-listen", etcdAPI(i))
			}
			if sp.ProfileDir != "" {
				args = append(args, "--enable-pprof")
			}
			args = append(args, sp.TenureArgs...)
			if nodes > 1 {
				var others []string
				for j := range nodes {
					if j != i {
						others = append(others, api(j))
					}
				}
				args = append(args, "--bootstrap-expect", strconv.Itoa(nodes), "--join", strings.Join(others, ","))
			}
		case Etcd:
			bin = sp.EtcdBinary
			var cluster []string
			for j := range nodes {
				cluster = append(cluster, fmt.Sprintf("n%d=http://%s", j+1, peerAdvertise(j)))
			}
			args = []string{
				"--name", fmt.Sprintf("n%d", i+1), "--data-dir", data,
				"--listen-client-urls", "http://" + api(i), "--advertise-client-urls", "http://" + api(i),
				"--listen-peer-urls", "http://" + peer(i), "--initial-advertise-peer-urls", "http://" + peerAdvertise(i),
				"--initial-cluster", strings.Join(cluster, ","),
				"--initial-cluster-state", "new", "--initial-cluster-token", filepath.Base(dir),
				"--logger", "zap", "--log-level", "warn",
			}
			if sp.ProfileDir != "" {
				args = append(args, "--enable-pprof")
			}
			if sp.SyncDelay > 0 && sp.EtcdTracer != "" {
				args = append(append(straceArgs(sp.SyncDelay), bin), args...)
				bin = sp.EtcdTracer
			}
		default:
			s.Stop()
			return nil, fmt.Errorf("unknown system %q", sys)
		}
		if bin == "" {
			s.Stop()
			return nil, fmt.Errorf("no %s binary given", sys)
		}
		p, err := startProc(s.thread, name, bin, args, env, logPath)
		if err != nil {
			s.Stop()
			return nil, err
		}
		p.traced = sys == Etcd && bin == sp.EtcdTracer
		s.procs = append(s.procs, p)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := waitFor(ctx, s.procs, s.ready); err != nil {
		s.Stop()
		return nil, fmt.Errorf("start %s: %w", sys, err)
	}
	return s, nil
}

// ready checks every node's health endpoint: Tenure's /readyz answers
// 200 once the node knows a leader (or leads and has caught up); etcd's
// /health says "true" once the node has a leader and can serve.
func (s *Server) ready(ctx context.Context) error {
	hc := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	path := "/readyz"
	if s.System == Etcd {
		path = "/health"
	}
	for _, ep := range s.Endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep+path, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || (s.System == Etcd && !strings.Contains(string(body), `"true"`)) {
			return fmt.Errorf("%s%s: %s %s", ep, path, resp.Status, strings.TrimSpace(string(body)))
		}
	}
	return nil
}

// Usage is the nodes' CPU time and resident memory, summed.
func (s *Server) Usage() (usage, error) {
	var total usage
	for _, p := range s.procs {
		u, err := readUsage(p.serverPid())
		if err != nil {
			return usage{}, fmt.Errorf("%s: %w", p.name, err)
		}
		total.CPU += u.CPU
		total.RSS += u.RSS
	}
	return total, nil
}

// Metric sums the samples of the Prometheus metric name (any labels that
// include every one in match, given as `key="value"`) over every node's
// /metrics.
func (s *Server) Metric(ctx context.Context, name string, match ...string) (float64, error) {
	var sum float64
	for i := range s.metrics {
		v, err := s.nodeMetric(ctx, i, name, match...)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// nodeMetric is Metric of node i alone.
func (s *Server) nodeMetric(ctx context.Context, i int, name string, match ...string) (float64, error) {
	hc := http.Client{Timeout: 5 * time.Second}
	u := s.metrics[i]
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("read metrics: %w", err)
	}
	defer resp.Body.Close()
	v, err := sumMetric(resp.Body, name, match)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", u, err)
	}
	return v, nil
}

// sumMetric adds up the samples of metric name in Prometheus' text format
// whose labels contain every string in match.
func sumMetric(r io.Reader, name string, match []string) (float64, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				continue
			}
			labels, rest = rest[:end+1], rest[end+1:]
		}
		all := true
		for _, m := range match {
			all = all && strings.Contains(labels, m)
		}
		if !all {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", name, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// Running reports whether every node still runs: a node that died during
// a workload makes its figures meaningless.
func (s *Server) Running() error {
	var errs []error
	for _, p := range s.procs {
		if !p.running() {
			errs = append(errs, fmt.Errorf("%s exited (%v); its log:\n%s", p.name, p.waitErr, tail(p.logPath, 20)))
		}
	}
	return errors.Join(errs...)
}

// Stop stops every node (SIGTERM, SIGKILL after 5s) and removes the data
// directory. Safe to call twice.
func (s *Server) Stop() {
	for _, p := range s.procs {
		p.stop(5 * time.Second)
	}
	s.procs = nil
	if s.thread != nil {
		s.thread.close()
		s.thread = nil
	}
	for _, p := range s.proxies {
		p.Close()
	}
	s.proxies = nil
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
		s.dir = ""
	}
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment
// ago. They are held open until all are found, so that none repeats.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port on 127.0.0.1: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
