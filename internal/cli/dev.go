package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewDevCommand builds `tenure dev`, the commands for trying Tenure out
// and developing against it on one machine. They live under their own
// name, like `consul agent -dev` and `vault server -dev`, so that nobody
// mistakes them for a way to run production.
func NewDevCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run Tenure on this machine for development",
		Example: `  tenure dev cluster
  tenure dev cluster --nodes 5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usage("dev needs a subcommand: cluster (see tenure dev --help)")
		},
	}
	cmd.AddCommand(newDevClusterCommand())
	return cmd
}

// devLayoutFile, in the dev cluster's --data-dir, records its nodes, so
// that running the command again restarts the same cluster.
const devLayoutFile = "cluster.json"

type devNode struct {
	ID   string `json:"id"`
	API  string `json:"api"`
	Peer string `json:"peer"`
	// Etcd is the node's etcd API address; layouts written before it
	// had one take the API port + 2 (etcdAddr).
	Etcd string `json:"etcd,omitempty"`
}

// etcdAddr is the node's etcd API address.
func (n devNode) etcdAddr() string {
	if n.Etcd != "" {
		return n.Etcd
	}
	host, port, _ := strings.Cut(n.API, ":")
	p, _ := strconv.Atoi(port)
	return host + ":" + strconv.Itoa(p+2)
}

type devLayout struct {
	Nodes []devNode `json:"nodes"`
}

type devOptions struct {
	nodes               int
	dataDir             string
	basePort            int
	apiPorts, peerPorts []int
	etcdPorts           []int
	logLevel            string
}

func newDevClusterCommand() *cobra.Command {
	o := devOptions{}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run a local cluster of tenure serve processes until interrupted",
		Long: `Run a cluster of --nodes tenure serve processes on 127.0.0.1, each with its
data in --data-dir/nodeN and its log in --data-dir/nodeN.log, and print each
node's endpoint, then a "ready" line once they have elected a leader. Node N
(from 1) serves its API on --base-port + 10(N-1), raft on the port after,
and the etcd v3 API (for etcdctl and etcd clients) on the one after that;
--api-ports, --peer-ports and --etcd-ports choose the ports instead
(without --etcd-ports, each node's etcd port is its API port + 2).

Kill a node (its pid is printed) to watch the others carry on; the cluster
keeps running while a node is down. SIGINT or SIGTERM (Ctrl-C) are passed to
every node, which shut down cleanly; a second one kills them. Running the
same command again restarts the same cluster from its data: the nodes and
ports are kept in --data-dir/cluster.json. Remove --data-dir to start
afresh. Left out, --data-dir is tenure/dev-cluster in the user's cache
directory, not the working directory; the first line printed names it.`,
		Example: `  tenure dev cluster
  tenure dev cluster --nodes 5 --data-dir /tmp/tenure-5
  TENURE_ENDPOINTS=127.0.0.1:7480,127.0.0.1:7490,127.0.0.1:7500 tenure members`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.dataDir == "" {
				o.dataDir = defaultDevDataDir()
			}
			layout, err := o.layout(cmd)
			if err != nil {
				return err
			}
			return runDevCluster(cmd, o, layout)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.nodes, "nodes", 3, "how many nodes, each a voter")
	f.StringVar(&o.dataDir, "data-dir", "", "directory for every node's data and log")
	f.Lookup("data-dir").DefValue = "tenure/dev-cluster in the user's cache directory ($XDG_CACHE_HOME or ~/.cache on Linux)"
	f.IntVar(&o.basePort, "base-port", 7480, "the first node's API port; node N's is this + 10(N-1), its raft port the next one")
	f.IntSliceVar(&o.apiPorts, "api-ports", nil, "each node's API port, instead of --base-port (one per node)")
	f.IntSliceVar(&o.peerPorts, "peer-ports", nil, "each node's raft port, with --api-ports")
	f.IntSliceVar(&o.etcdPorts, "etcd-ports", nil, "each node's etcd API port, with --api-ports (default each API port + 2)")
	f.StringVar(&o.logLevel, "log-level", "info", "the nodes' --log-level")
	cmd.MarkFlagsRequiredTogether("api-ports", "peer-ports")
	cmd.MarkFlagsMutuallyExclusive("base-port", "api-ports")
	cmd.MarkFlagsMutuallyExclusive("base-port", "etcd-ports")
	return cmd
}

// layout is the cluster the flags describe, or the one --data-dir holds
// already, which the flags must then not contradict.
func (o devOptions) layout(cmd *cobra.Command) (devLayout, error) {
	switch o.logLevel {
	case "debug", "info", "warn", "error":
	default:
		return devLayout{}, usage("--log-level %q: use debug, info, warn or error", o.logLevel)
	}
	fl := cmd.Flags()
	nodes := o.nodes
	if fl.Changed("api-ports") && !fl.Changed("nodes") {
		nodes = len(o.apiPorts)
	}
	if nodes < 1 || nodes > 9 {
		return devLayout{}, usage("--nodes %d: give 1 to 9", nodes)
	}
	var want devLayout
	if fl.Changed("api-ports") {
		if len(o.apiPorts) != nodes || len(o.peerPorts) != nodes {
			return devLayout{}, usage("--api-ports and --peer-ports need one port per node: got %d and %d for %d nodes", len(o.apiPorts), len(o.peerPorts), nodes)
		}
		seen := map[int]bool{}
		for _, p := range slices.Concat(o.apiPorts, o.peerPorts) {
			if p < 1 || p > 65535 {
				return devLayout{}, usage("port %d: give 1 to 65535", p)
			}
			if seen[p] {
				return devLayout{}, usage("port %d is given twice in --api-ports and --peer-ports", p)
			}
			seen[p] = true
		}
		if fl.Changed("etcd-ports") {
			if len(o.etcdPorts) != nodes {
				return devLayout{}, usage("--etcd-ports needs one port per node: got %d for %d nodes", len(o.etcdPorts), nodes)
			}
		} else {
			o.etcdPorts = nil
			for _, p := range o.apiPorts {
				o.etcdPorts = append(o.etcdPorts, p+2)
			}
		}
		for i, p := range o.etcdPorts {
			if p < 1 || p > 65535 || seen[p] {
				return devLayout{}, usage("etcd port %d of node %d: out of range, or given already (choose them with --etcd-ports)", p, i+1)
			}
			seen[p] = true
		}
	} else if top := o.basePort + 10*(nodes-1) + 2; o.basePort < 1 || top > 65535 {
		return devLayout{}, usage("--base-port %d: the ports of %d nodes must lie in 1 to 65535", o.basePort, nodes)
	}
	for i := range nodes {
		api, peer := o.basePort+10*i, o.basePort+10*i+1
		etcd := api + 2
		if fl.Changed("api-ports") {
			api, peer, etcd = o.apiPorts[i], o.peerPorts[i], o.etcdPorts[i]
		}
		want.Nodes = append(want.Nodes, devNode{
			ID:   "node" + strconv.Itoa(i+1),
			API:  "127.0.0.1:" + strconv.Itoa(api),
			Peer: "127.0.0.1:" + strconv.Itoa(peer),
			Etcd: "127.0.0.1:" + strconv.Itoa(etcd),
		})
	}

	b, err := os.ReadFile(filepath.Join(o.dataDir, devLayoutFile))
	if errors.Is(err, fs.ErrNotExist) {
		return want, nil
	}
	if err != nil {
		return devLayout{}, fmt.Errorf("read the dev cluster's layout: %w", err)
	}
	var have devLayout
	if err := json.Unmarshal(b, &have); err != nil || len(have.Nodes) == 0 {
		return devLayout{}, fmt.Errorf("%s: not a dev cluster's layout (%v): remove --data-dir %s to start afresh", filepath.Join(o.dataDir, devLayoutFile), err, o.dataDir)
	}
	for i := range have.Nodes {
		have.Nodes[i].Etcd = have.Nodes[i].etcdAddr()
	}
	changed := fl.Changed("nodes") || fl.Changed("base-port") || fl.Changed("api-ports")
	if changed && !slices.Equal(have.Nodes, want.Nodes) {
		return devLayout{}, usage("--data-dir %s holds a %d-node cluster on API ports %s; run it without --nodes and port flags to restart it, or remove %s to start another",
			o.dataDir, len(have.Nodes), have.apiPorts(), o.dataDir)
	}
	return have, nil
}

func (l devLayout) apiPorts() string {
	ports := make([]string, len(l.Nodes))
	for i, n := range l.Nodes {
		_, ports[i], _ = strings.Cut(n.API, ":")
	}
	return strings.Join(ports, ",")
}

func (l devLayout) endpoints() string {
	eps := make([]string, len(l.Nodes))
	for i, n := range l.Nodes {
		eps[i] = n.API
	}
	return strings.Join(eps, ",")
}

func (l devLayout) etcdEndpoints() string {
	eps := make([]string, len(l.Nodes))
	for i, n := range l.Nodes {
		eps[i] = n.etcdAddr()
	}
	return strings.Join(eps, ",")
}

// devProc is one running node.
type devProc struct {
	node   devNode
	cmd    *exec.Cmd
	exited bool
}

type devExit struct {
	i   int
	err error
}

func runDevCluster(cmd *cobra.Command, o devOptions, layout devLayout) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := os.MkdirAll(o.dataDir, 0o750); err != nil {
		return fmt.Errorf("create --data-dir: %w", err)
	}
	b, _ := json.MarshalIndent(layout, "", "  ")
	if _, err := writeFileAtomic(filepath.Join(o.dataDir, devLayoutFile), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	}); err != nil {
		return fmt.Errorf("record the dev cluster's layout: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the tenure executable to run the nodes: %w", err)
	}
	fmt.Fprintf(out, "data in %s (remove it to start afresh)\n", o.dataDir)

	// Caught here, besides Main's context, to learn which signal came so
	// as to pass the same one on. Registered before any node starts, so
	// that no signal is missed.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	procs := make([]*devProc, len(layout.Nodes))
	exits := make(chan devExit, len(layout.Nodes))
	stopAll := func(sig os.Signal) {
		for _, p := range procs {
			if p != nil && !p.exited {
				_ = p.cmd.Process.Signal(sig)
			}
		}
	}
	running := 0
	for i, n := range layout.Nodes {
		p, err := startDevNode(exe, o, layout, n)
		if err != nil {
			stopAll(syscall.SIGKILL)
			for range running {
				<-exits
			}
			return err
		}
		procs[i] = p
		running++
		go func() { exits <- devExit{i, p.cmd.Wait()} }()
		fmt.Fprintf(out, "%s  pid %d  api %s  peer %s  etcd %s  log %s\n", n.ID, p.cmd.Process.Pid, n.API, n.Peer, n.etcdAddr(), devLogPath(o.dataDir, n))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	go func() {
		if leader, err := waitDevLeader(ctx, layout); err == nil {
			ready <- leader
		}
	}()

	stopping := false
	for running > 0 {
		select {
		case leader := <-ready:
			fmt.Fprintf(out, "ready: %s leads; export TENURE_ENDPOINTS=%s\n", leader, layout.endpoints())
			fmt.Fprintf(out, "etcd clients: export ETCDCTL_API=3 ETCDCTL_ENDPOINTS=%s\n", layout.etcdEndpoints())
		case sig := <-sigs:
			if stopping {
				fmt.Fprintf(errOut, "killing %d nodes\n", running)
				stopAll(syscall.SIGKILL)
				continue
			}
			stopping = true
			cancel()
			fmt.Fprintf(errOut, "stopping %d nodes (%v); interrupt again to kill them\n", running, sig)
			stopAll(sig)
		case e := <-exits:
			running--
			p := procs[e.i]
			p.exited = true
			if !stopping {
				fmt.Fprintf(errOut, "%s (pid %d) exited: %s; %d nodes still run (see %s)\n",
					p.node.ID, p.cmd.Process.Pid, exitText(e.err), running, devLogPath(o.dataDir, p.node))
			}
		}
	}
	if !stopping {
		return unmet(errors.New("every node exited"))
	}
	return nil
}

// defaultDevDataDir is where a dev cluster keeps its data unless told:
// under the user's cache directory, so that trying Tenure out in a
// checkout leaves nothing in it (an untracked directory there makes a
// release build "dirty"), and the next run still finds the same
// cluster. Without a cache directory ($HOME unset), the temporary one.
func defaultDevDataDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf("tenure-dev-cluster-%d", os.Getuid()))
	}
	return filepath.Join(dir, "tenure", "dev-cluster")
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func devLogPath(dataDir string, n devNode) string {
	return filepath.Join(dataDir, n.ID+".log")
}

// startDevNode starts node n of layout: tenure serve with its log
// appended to its log file. A first start forms the cluster with the
// others (--bootstrap-expect, --join); later ones find the cluster in
// the node's data dir and ignore both flags.
func startDevNode(exe string, o devOptions, layout devLayout, n devNode) (*devProc, error) {
	args := []string{"serve",
		"--listen", n.API, "--peer-listen", n.Peer, "--node-id", n.ID, "--etcd-listen", n.etcdAddr(),
		"--data-dir", filepath.Join(o.dataDir, n.ID), "--log-level", o.logLevel,
		// Segments are preallocated whole: raft-wal's 64MiB per node is
		// a lot of disk for a cluster that holds little.
		"--wal-segment-size", "4MiB",
	}
	if len(layout.Nodes) > 1 {
		var others []string
		for _, m := range layout.Nodes {
			if m != n {
				others = append(others, m.API)
			}
		}
		args = append(args, "--bootstrap-expect", strconv.Itoa(len(layout.Nodes)), "--join", strings.Join(others, ","))
	}
	log, err := os.OpenFile(devLogPath(o.dataDir, n), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("%s: open its log: %w", n.ID, err)
	}
	defer log.Close() // the child has its own descriptor
	fmt.Fprintf(log, "=== %s tenure %s\n", time.Now().Format(time.RFC3339), strings.Join(args, " "))
	c := exec.Command(exe, args...)
	c.Stdout, c.Stderr = log, log
	c.SysProcAttr = devNodeAttr()
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", n.ID, exe, err)
	}
	return &devProc{node: n, cmd: c}, nil
}

// waitDevLeader asks the nodes who leads until one of them says it leads
// and is ready, and returns its ID.
func waitDevLeader(ctx context.Context, layout devLayout) (string, error) {
	c, err := client.New(ctx, strings.Split(layout.endpoints(), ","),
		client.WithRequestTimeout(time.Second), client.WithRetry(2*len(layout.Nodes), 50*time.Millisecond),
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return "", err
	}
	defer c.Close()
	for {
		members, err := c.Members(ctx)
		if err == nil {
			for _, m := range members {
				if m.Role == "leader" && m.Ready {
					return m.ID, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
