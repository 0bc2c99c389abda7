package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is what to run.
type Config struct {
	// Against lists the systems to compare Tenure with: nil, or Etcd.
	Against []System
	// Client is what drives Tenure ("": ClientTenure). With ClientEtcd
	// only the workloads that have an etcd-client form may run
	// (CheckClient).
	Client Client
	// Duration is each measured window of the throughput workloads.
	Duration time.Duration
	// Rounds is how often every workload runs against every system.
	Rounds int
	// Workloads are the workload IDs to run, in order (nil: all).
	Workloads []int
	// Short bounds every workload to a second or two, with small sizes.
	Short bool
	// Growth overrides workload 13's steps and fill bound.
	Growth GrowthSteps
	// Servers says how to start the servers.
	Servers ServerSpec
	// Log receives progress (nil: slog.Default()).
	Log *slog.Logger
}

// Report is what a run measured.
type Report struct {
	Machine Machine `json:"machine"`
	Command string  `json:"command,omitempty"`
	// Client is what drove Tenure; etcd is always driven by its own.
	Client    Client    `json:"client"`
	Started   time.Time `json:"started"`
	Seconds   float64   `json:"seconds"`
	Rounds    int       `json:"rounds"`
	Duration  string    `json:"duration"`
	Short     bool      `json:"short"`
	Systems   []System  `json:"systems"`
	Workloads []int     `json:"workloads"`
	// PeerRTT and SyncDelay are the injected latencies (ServerSpec), ""
	// when none was.
	PeerRTT   string `json:"peer_rtt,omitempty"`
	SyncDelay string `json:"sync_delay,omitempty"`
	// EtcdSyncDelay: etcd's syncs were slowed by SyncDelay too (under
	// strace, etcdsync.go); false leaves its disk as it is.
	EtcdSyncDelay bool     `json:"etcd_sync_delay,omitempty"`
	Results       []Result `json:"results"`
}

// Machine describes where a run ran.
type Machine struct {
	CPUs       int    `json:"cpus"`
	CPU        string `json:"cpu"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	Etcd       string `json:"etcd,omitempty"`
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
}

func (m Machine) String() string {
	s := fmt.Sprintf("%d CPUs (%s), %s, %s", m.CPUs, m.CPU, m.Kernel, m.Go)
	if m.Etcd != "" {
		s += ", " + m.Etcd
	}
	return s + fmt.Sprintf("; load average %s before, %s after", m.LoadBefore, m.LoadAfter)
}

// ParseWorkloads reads a --workloads list: numbers or names, comma
// separated.
func ParseWorkloads(list []string) ([]int, error) {
	var ids []int
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		i := slices.IndexFunc(Workloads, func(w workload) bool {
			return strconv.Itoa(w.ID) == s || w.Name == s
		})
		if i < 0 {
			var known []string
			for _, w := range Workloads {
				known = append(known, fmt.Sprintf("%d %s", w.ID, w.Name))
			}
			return nil, fmt.Errorf("unknown workload %q (known: %s)", s, strings.Join(known, ", "))
		}
		if !slices.Contains(ids, Workloads[i].ID) {
			ids = append(ids, Workloads[i].ID)
		}
	}
	return ids, nil
}

// ErrNotThroughEtcdClient is returned by CheckClient for a workload
// that is not run through etcd's client.
var ErrNotThroughEtcdClient = errors.New("not run through etcd's client")

// CheckClient checks that every workload in ids (nil: the default set)
// can drive Tenure through client, and returns the IDs to run: with
// ClientEtcd and no ids, those that can.
func CheckClient(client Client, ids []int) ([]int, error) {
	switch client {
	case "", ClientTenure:
		return ids, nil
	case ClientEtcd:
	default:
		return nil, fmt.Errorf("client %q: only %q and %q are known", client, ClientTenure, ClientEtcd)
	}
	var can, cannot []string
	var out []int
	for _, w := range Workloads {
		if w.etcdClient {
			can = append(can, fmt.Sprintf("%d %s", w.ID, w.Name))
			if len(ids) == 0 {
				out = append(out, w.ID)
			}
		}
	}
	for _, id := range ids {
		w := Workloads[slices.IndexFunc(Workloads, func(w workload) bool { return w.ID == id })]
		if !w.etcdClient {
			cannot = append(cannot, fmt.Sprintf("%d %s", w.ID, w.Name))
			continue
		}
		out = append(out, id)
	}
	if len(cannot) > 0 {
		return nil, fmt.Errorf("workload %s: %w, which runs %s", strings.Join(cannot, ", "), ErrNotThroughEtcdClient, strings.Join(can, ", "))
	}
	return out, nil
}

// Run runs cfg's workloads, every round against every system, each run
// on a fresh server, and returns what it measured. A workload that fails
// is recorded with its error and the run goes on; the error returned
// joins them all. When ctx ends, Run stops its servers and returns what
// it has.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if cfg.Rounds < 1 {
		return nil, fmt.Errorf("rounds %d: need at least 1", cfg.Rounds)
	}
	if cfg.Duration <= 0 {
		return nil, fmt.Errorf("duration %v: must be positive", cfg.Duration)
	}
	if cfg.Servers.PeerRTT < 0 {
		return nil, fmt.Errorf("peer round trip %v: must not be negative", cfg.Servers.PeerRTT)
	}
	if cfg.Servers.SyncDelay < 0 {
		return nil, fmt.Errorf("sync delay %v: must not be negative", cfg.Servers.SyncDelay)
	}
	if cfg.Servers.SyncDelay > 0 {
		if err := CheckBenchSync(cfg.Servers.TenureBinary); err != nil {
			return nil, fmt.Errorf("sync delay %v: %w", cfg.Servers.SyncDelay, err)
		}
	}
	systems := []System{Tenure}
	for _, s := range cfg.Against {
		if s != Etcd {
			return nil, fmt.Errorf("cannot run against %q: only etcd is known", s)
		}
		if !slices.Contains(systems, s) {
			systems = append(systems, s)
		}
	}
	ids, err := CheckClient(cfg.Client, cfg.Workloads)
	if err != nil {
		return nil, err
	}
	if cfg.Client == "" {
		cfg.Client = ClientTenure
	}
	cfg.Servers.EtcdAPI = cfg.Client == ClientEtcd
	if len(ids) == 0 {
		for _, w := range Workloads {
			if !w.optIn {
				ids = append(ids, w.ID)
			}
		}
	}
	rep := &Report{
		Machine: machine(cfg.Servers.EtcdBinary, slices.Contains(systems, Etcd)),
		Client:  cfg.Client,
		Started: time.Now(), Rounds: cfg.Rounds, Duration: cfg.Duration.String(), Short: cfg.Short,
		Systems: systems, Workloads: ids,
	}
	if cfg.Servers.PeerRTT > 0 {
		rep.PeerRTT = cfg.Servers.PeerRTT.String()
	}
	if cfg.Servers.SyncDelay > 0 {
		rep.SyncDelay = cfg.Servers.SyncDelay.String()
		if slices.Contains(systems, Etcd) {
			cfg.Servers.EtcdTracer = etcdSyncTracer(ctx)
			rep.EtcdSyncDelay = cfg.Servers.EtcdTracer != ""
		}
	}
	if err := cfg.Growth.Check(); err != nil {
		return nil, err
	}
	sz := sizesFor(cfg.Short, cfg.Duration)
	sz.growth = sz.growth.with(cfg.Growth)
	var errs []error
	for round := 1; round <= cfg.Rounds; round++ {
		// Tenure first in odd rounds, etcd first in even ones, so that
		// load that drifts during a round favours neither.
		order := slices.Clone(systems)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, id := range ids {
			w := Workloads[slices.IndexFunc(Workloads, func(w workload) bool { return w.ID == id })]
			if w.once && round > 1 && !cfg.Short {
				continue
			}
			for _, sys := range order {
				if ctx.Err() != nil {
					rep.finish()
					return rep, errors.Join(append(errs, ctx.Err())...)
				}
				log.Info("bench: running", "round", round, "workload", fmt.Sprintf("(%d) %s", w.ID, w.Title), "system", sys)
				results := runOne(ctx, cfg.Servers, sys, cfg.Client, w, round, sz, log)
				for i := range results {
					results[i].Round = round
					if results[i].Err != "" {
						variant := ""
						if results[i].Variant != "" {
							variant = " (" + results[i].Variant + ")"
						}
						errs = append(errs, fmt.Errorf("round %d, workload %d%s, %s: %s", round, w.ID, variant, sys, results[i].Err))
					}
					attrs := []any{"round", round, "workload", w.ID}
					if results[i].Variant != "" {
						attrs = append(attrs, "variant", results[i].Variant)
					}
					attrs = append(attrs, "system", sys, "took", time.Duration(results[i].Seconds*float64(time.Second)).Round(100*time.Millisecond))
					if results[i].Err != "" {
						log.Error("bench: failed", append(attrs, "err", results[i].Err)...)
						continue
					}
					log.Info("bench: done", append(attrs, "headline", headline(results[i]))...)
				}
				rep.Results = append(rep.Results, results...)
			}
		}
	}
	rep.finish()
	return rep, errors.Join(errs...)
}

func (r *Report) finish() {
	r.Seconds = time.Since(r.Started).Seconds()
	r.Machine.LoadAfter = loadavg()
}

// runOne starts a fresh server, runs w against it, and stops it. A
// workload has a hard bound of ten minutes (or its own timeout); a
// workload still running then has hung.
func runOne(ctx context.Context, spec ServerSpec, sys System, client Client, w workload, round int, sz sizes, log *slog.Logger) []Result {
	start := time.Now()
	fail := func(err error) []Result {
		return []Result{{Workload: w.ID, System: sys, Err: err.Error(), Seconds: time.Since(start).Seconds()}}
	}
	timeout := 10 * time.Minute
	if w.timeout > 0 {
		timeout = w.timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	srv, err := spec.Start(ctx, sys, w.nodes)
	if err != nil {
		return fail(err)
	}
	defer srv.Stop()
	e := &env{sys: sys, client: client, srv: srv, sz: sz, log: log, spec: spec}
	if spec.ProfileDir != "" {
		e.prof = &profiler{dir: spec.ProfileDir, srv: srv, name: fmt.Sprintf("%d-%s-%s-round%d", w.ID, w.Name, sys, round)}
	}
	results, err := w.run(ctx, e)
	if e.prof != nil {
		for _, perr := range e.prof.wait() {
			log.Warn("bench: profile", "err", perr)
		}
	}
	if rerr := srv.Running(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil && len(results) == 0 {
		return fail(err)
	}
	for i := range results {
		results[i].Workload, results[i].System = w.ID, sys
		results[i].Seconds = time.Since(start).Seconds()
	}
	if err != nil {
		results[len(results)-1].Err = err.Error()
	}
	return results
}

// headline is a result's first figure, for progress lines.
func headline(r Result) string {
	if len(r.Figures) == 0 {
		return ""
	}
	f := r.Figures[0]
	return formatValue(f.Value, f.Unit) + " " + f.Name
}

func machine(etcd string, withEtcd bool) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadBefore: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if withEtcd && etcd != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, etcd, "--version").Output(); err == nil {
			m.Etcd, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
		}
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
