package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tenurehq/tenure/internal/bench"
)

type benchOptions struct {
	against      string
	client       string
	duration     time.Duration
	rounds       int
	workloads    []string
	short        bool
	charts       string
	etcd         string
	jsonPath     string
	markdown     string
	tenureBinary string
	quiet        bool
	peerRTT      time.Duration
	syncDelay    time.Duration
	profile      string
	growth       bench.GrowthSteps
}

// NewBenchCommand builds `tenure bench`, the side-by-side benchmark of
// issue 10: it starts the servers itself, so it needs no --endpoints.
func NewBenchCommand() *cobra.Command {
	o := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark Tenure, side by side with etcd, on servers it starts itself",
		Long: `Run the benchmark workloads against Tenure and, with --against etcd, against
etcd on the same machine in the same run, and print each figure's median and
range over the rounds with the ratio.

Every run starts a fresh server (tenure serve from this binary, or etcd from
PATH or --etcd) as a child process on free 127.0.0.1 ports with its data in
a temporary directory, and stops it afterwards. Within a round the two
systems alternate, and the order flips every round, so that load that drifts
on the machine favours neither. Both servers fsync every acknowledged write.
Install etcd with scripts/install-etcd.sh (Debian's etcd-server).

With --client etcd, Tenure too is driven through etcd's Go client (clientv3
and its concurrency package) on its etcd API, tenure serve --etcd-listen:
the same code as etcd, so the comparison is of the servers alone. It runs
workloads 1-5 and 7, and the goals shown are issue 23's (1.5x etcd's
throughput, less server CPU per operation).

Workloads (names or numbers for --workloads):
  1 one-client   one client, Lock+Unlock pairs
  2 64-clients   64 goroutines on their own locks over 4 connections
  3 contended    16 contenders on one lock: handoffs, latency, fairness
  4 heartbeats   most sessions kept alive at TTL 10s with no expiry
  5 resign       clean resign → next leader
  6 crash        holder crash → next leader, TTL 5s
  7 cas          compare-and-swap, 64 goroutines on their own keys
  8 memory       server memory per 10,000 idle sessions, 100,000 held locks
  9 scaling      workload 2 at 1, 4, 16, 64 and 256 goroutines
  10 cluster     workloads 1-3 on 3-node clusters
  11 commit      one client's sequential writes on 3-node clusters: commit latency
  12 failover    leader killed → first acknowledged write on 3-node clusters
  13 growth      how cost grows: workloads 1 and 2 and server RSS at each step
                 of live keys (10^3 to 10^6), idle sessions (10^3 to 10^6),
                 idle watchers (10^2 to 10^5) and retained history (10^4 to
                 10^6 revisions), each on a fresh server; runs only when
                 named, in the first round only, and takes about 25 minutes
                 with --against etcd (--growth-* set the steps and the bound)

With --peer-rtt, every 3-node cluster's nodes (Tenure's and etcd's alike)
reach each other through delaying proxies that add that round trip to
their peer traffic, and the clients of workloads 10 and 11 talk to the
leader alone. With --sync-delay, every sync of Tenure's log store takes
that much longer: it needs a tenure binary built with -tags benchsync,
given as --tenure-binary. etcd's syncs are slowed as much by running it
under strace (scripts/install-etcd.sh installs it), which returns from
each fdatasync and fsync that much later; without a strace that can
trace here, etcd's disk is left as it is, and the output says so.
Together they play a cloud deployment on one machine (issue 24: 1ms
sync, 0.3ms round trip).

The full run (--against etcd, 5s windows, 3 rounds) takes about a quarter of
an hour on two cores; --short takes under a minute, Tenure only.`,
		Example: `  # The published comparison, charts included
  tenure bench --against etcd --charts docs/benchmarks

  # A quick look at two workloads
  tenure bench --against etcd --workloads 1,contended --duration 2s --rounds 1

  # Both servers through etcd's own client
  tenure bench --against etcd --client etcd

  # Tenure alone, about a second per workload
  tenure bench --short

  # How cost grows with keys, sessions, watchers and history (~25 min)
  tenure bench --against etcd --workloads growth --rounds 1 --charts /tmp/growth

  # Commits on 3-node clusters with a cloud disk and a same-zone network
  go build -tags benchsync -o tenure-bench ./cmd/tenure
  tenure bench --tenure-binary ./tenure-bench --workloads commit,cluster \
    --peer-rtt 300us --sync-delay 1ms --rounds 1 --duration 5s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(cmd, o)
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "echo",
		Short: "Echo one loopback connection: the other end of the commit floor's round trip",
		Long: `Listen on a free 127.0.0.1 port, print its address, echo the first
connection until it closes, and exit. tenure bench starts it to time a
loopback round trip between two processes for the commit floor it compares
one client's pairs with. It gives up after 30 seconds without a connection.`,
		Example: `  # What tenure bench does: read the address, then send and read back
  tenure bench echo`,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.ServeEcho(cmd.OutOrStdout())
		},
	})
	f := cmd.Flags()
	f.StringVar(&o.against, "against", "", `compare with this system: "etcd" (default: Tenure only)`)
	f.StringVar(&o.client, "client", string(bench.ClientTenure), `drive Tenure through "tenure" (its own Go client) or "etcd" (etcd's clientv3 on its etcd API)`)
	f.DurationVar(&o.duration, "duration", 5*time.Second, "measured time of each throughput run (--short: 1s)")
	f.IntVar(&o.rounds, "rounds", 3, "rounds: every workload runs this often against each system (--short: 1)")
	f.StringSliceVar(&o.workloads, "workloads", nil, "workloads to run, by number or name (default all)")
	f.BoolVar(&o.short, "short", false, "about a second per workload, one round, small sizes, Tenure only")
	f.StringVar(&o.charts, "charts", "", "write SVG charts into this directory")
	f.StringVar(&o.etcd, "etcd", "", "the etcd binary (default: etcd on PATH)")
	f.StringVar(&o.jsonPath, "json", "", "write every run's raw figures to this file as JSON")
	f.StringVar(&o.markdown, "markdown", "", "write the figures as one Markdown table to this file (for docs/benchmarks.md)")
	f.StringVar(&o.tenureBinary, "tenure-binary", "", "the tenure binary whose serve is measured (default: this one)")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print no progress lines")
	f.DurationVar(&o.peerRTT, "peer-rtt", 0, "add this round trip between the nodes of 3-node clusters, Tenure's and etcd's (e.g. 300us)")
	f.StringVar(&o.profile, "profile", "", "save a CPU profile and a 1s execution trace of every server node across each measured window into this directory (servers run with --enable-pprof; go tool pprof / go tool trace read them)")
	f.IntSliceVar(&o.growth.Keys, "growth-keys", nil, "workload 13's steps of live keys (default 1000,10000,100000,300000,1000000; --short 1000,10000)")
	f.IntSliceVar(&o.growth.Sessions, "growth-sessions", nil, "workload 13's steps of idle sessions (default 1000,10000,100000,300000,1000000)")
	f.IntSliceVar(&o.growth.Watchers, "growth-watchers", nil, "workload 13's steps of idle watchers (default 100,1000,10000,30000,100000)")
	f.IntSliceVar(&o.growth.History, "growth-history", nil, "workload 13's steps of retained revisions (default 10000,100000,300000,1000000)")
	f.DurationVar(&o.growth.Fill, "growth-fill", 0, "workload 13: longest time to fill one kind of state's steps on one system; the largest step reached within it is recorded (default 3m)")
	f.DurationVar(&o.syncDelay, "sync-delay", 0, "add this to every sync of Tenure's log store (e.g. 1ms; needs a tenure binary built with -tags benchsync) and of etcd's (under strace)")
	return cmd
}

func runBench(cmd *cobra.Command, o benchOptions) error {
	cfg := bench.Config{Duration: o.duration, Rounds: o.rounds, Short: o.short}
	switch o.against {
	case "":
	case "etcd":
		if o.short {
			return usage("--short runs Tenure only; leave out --against, or use --duration 1s --rounds 1")
		}
		cfg.Against = []bench.System{bench.Etcd}
	default:
		return usage(`--against %q: only "etcd" is known`, o.against)
	}
	if o.short {
		if !cmd.Flags().Changed("duration") {
			cfg.Duration = time.Second
		}
		if !cmd.Flags().Changed("rounds") {
			cfg.Rounds = 1
		}
	}
	if cfg.Duration <= 0 {
		return usage("--duration %v must be positive", o.duration)
	}
	if cfg.Rounds < 1 {
		return usage("--rounds %d must be at least 1", o.rounds)
	}
	ids, err := bench.ParseWorkloads(o.workloads)
	if err != nil {
		return usage("--workloads: %v", err)
	}
	cfg.Client = bench.Client(o.client)
	if _, err := bench.CheckClient(cfg.Client, ids); err != nil {
		return usage("--client %s: %v", o.client, err)
	}
	cfg.Workloads = ids
	if err := o.growth.Check(); err != nil {
		return usage("%v", err)
	}
	cfg.Growth = o.growth
	if o.peerRTT < 0 {
		return usage("--peer-rtt %v must not be negative", o.peerRTT)
	}
	if o.syncDelay < 0 {
		return usage("--sync-delay %v must not be negative", o.syncDelay)
	}
	cfg.Servers.PeerRTT, cfg.Servers.SyncDelay = o.peerRTT, o.syncDelay
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return fmt.Errorf("--profile: %w", err)
		}
		cfg.Servers.ProfileDir = o.profile
	}
	cfg.Servers.TenureBinary = o.tenureBinary
	if cfg.Servers.TenureBinary == "" {
		if cfg.Servers.TenureBinary, err = os.Executable(); err != nil {
			return fmt.Errorf("find this binary to run tenure serve (give --tenure-binary): %w", err)
		}
	}
	if o.syncDelay > 0 {
		if err := bench.CheckBenchSync(cfg.Servers.TenureBinary); err != nil {
			return usage("--sync-delay %v: %v", o.syncDelay, err)
		}
	}
	if cfg.Against != nil {
		etcd := o.etcd
		if etcd == "" {
			etcd = "etcd"
		}
		if cfg.Servers.EtcdBinary, err = exec.LookPath(etcd); err != nil {
			return usage("--against etcd needs the etcd binary (%v): install it with scripts/install-etcd.sh, or give --etcd", err)
		}
	}
	logOut := cmd.ErrOrStderr()
	if o.quiet {
		logOut = io.Discard
	}
	cfg.Log = slog.New(slog.NewTextHandler(logOut, nil))

	rep, runErr := bench.Run(cmd.Context(), cfg)
	if rep == nil {
		return runErr
	}
	words := []string{"tenure bench"}
	cmd.Flags().Visit(func(f *pflag.Flag) { words = append(words, "--"+f.Name, f.Value.String()) })
	rep.Command = strings.Join(words, " ")
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "\n%s\n", rep.Machine)
	if rep.PeerRTT != "" || rep.SyncDelay != "" {
		etcdSync := ""
		if rep.SyncDelay != "" && slices.Contains(rep.Systems, bench.Etcd) {
			etcdSync = ", etcd's disk as it is (no strace that can trace it)"
			if rep.EtcdSyncDelay {
				etcdSync = ", etcd's syncs +" + rep.SyncDelay + " (strace)"
			}
		}
		fmt.Fprintf(out, "injected: peer round trip %s, Tenure log sync +%s%s\n", orNone(rep.PeerRTT), orNone(rep.SyncDelay), etcdSync)
	}
	if err := rep.WriteText(out); err != nil {
		return err
	}
	fmt.Fprintf(out, "took %v\n", time.Duration(rep.Seconds*float64(time.Second)).Round(time.Second))
	var errs []error
	if o.jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(o.jsonPath, append(b, '\n'), 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--json: %w", err))
		}
	}
	if o.markdown != "" {
		var b strings.Builder
		err := rep.WriteMarkdown(&b)
		if err == nil {
			err = os.WriteFile(o.markdown, []byte(b.String()), 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--markdown: %w", err))
		}
	}
	if o.charts != "" {
		files, err := rep.WriteCharts(o.charts)
		if err != nil {
			errs = append(errs, fmt.Errorf("--charts: %w", err))
		}
		for _, f := range files {
			fmt.Fprintln(out, "wrote", f)
		}
	}
	if runErr != nil {
		return unmet(runErr)
	}
	return errors.Join(errs...)
}

func orNone(s string) string {
	if s == "" {
		return "0s"
	}
	return s
}
