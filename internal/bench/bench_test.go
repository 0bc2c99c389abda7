package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/proccluster"
)

// headlines are the figures that must be above zero in every workload's
// result for a short run to count as sane.
var headlines = map[int][]string{
	1:  {"pairs/s", "pair p50"},
	2:  {"pairs/s"},
	3:  {"handoffs/s", "handoff p50", "fewest acquisitions of a contender"},
	4:  {"sessions kept alive", "heartbeats/s", "server RSS"},
	5:  {"resign→next p50"},
	6:  {"crash→next"},
	7:  {"CAS/s"},
	8:  {"RSS per 10,000 idle sessions", "RSS per 100,000 held locks"},
	9:  {"pairs/s"},
	10: {"pairs/s", "handoffs/s", "resign→next p50"},
	11: {"writes/s", "commit p50"},
	12: {"kill→first write p50", "kill→first write max", "failovers"},
}

// TestShortRunAgainstTenure runs every workload in short mode against
// real tenure serve processes and checks that each produced sane
// figures: throughput above zero, no session expired while the
// heartbeat workload held them, and no leader after a crash elected
// less than a TTL after the holder's last acknowledged heartbeat.
func TestShortRunAgainstTenure(t *testing.T) {
	// The short runs run beside one another, two at a time (go test's
	// -parallel, one per core): most of each is fixed windows and
	// warm-ups, waiting, and alone the package took 94 s, this one 51 s of
	// it. What they assert does not depend on an idle machine: figures
	// above zero, and bounds from below (a commit pays the injected delay,
	// a failover waits out the election timeout, the crash's next leader
	// the TTL), which load only raises. The one check a busy machine could
	// fail, no session lost by the heartbeat workload, has a 5s TTL
	// against an oldest acknowledged heartbeat 1.7s old (sizesFor). The harness's
	// own CPU per operation, which parallel runs share, is context only.
	t.Parallel()
	if testing.Short() {
		t.Skip("starts about a dozen servers; skipped with -short")
	}
	rep := runShort(t, Config{})
	seen := map[int]bool{}
	for _, r := range rep.Results {
		seen[r.Workload] = true
		if r.System != Tenure || r.Round != 1 {
			t.Errorf("workload %d: system %s round %d, expected: tenure round 1", r.Workload, r.System, r.Round)
		}
		if r.Err != "" {
			t.Errorf("workload %d %s: %s", r.Workload, r.Variant, r.Err)
			continue
		}
		for _, name := range headlines[r.Workload] {
			f, ok := r.figure(name)
			if !ok && r.Workload == 10 {
				continue // variants 1 and 2 count pairs, 3 handoffs, 4 resigns
			}
			if !ok || f.Value <= 0 {
				t.Errorf("workload %d %s: %s got = %v (present %v), expected: above 0", r.Workload, r.Variant, name, f.Value, ok)
			}
		}
		switch r.Workload {
		case 4:
			// The short run's TTL (5s) leaves a loaded machine room
			// (sizesFor); a session is lost only when its heartbeats
			// stop for most of it, which is what this catches.
			sz := sizesFor(true, time.Second)
			want := float64(sz.heartbeatSteps[0])
			if f, _ := r.figure("sessions kept alive"); f.Value != want {
				t.Errorf("heartbeats: sessions kept alive got = %v, expected: %v with no expiry (figures %v)", f.Value, want, r.Figures)
			}
			if f, ok := r.figure("oldest acknowledged heartbeat"); ok {
				t.Logf("heartbeats: the oldest acknowledged heartbeat was %.0f ms old, at a TTL of %v", f.Value, sz.heartbeatTTL)
			}
		case 6:
			ttl, _ := r.figure("TTL")
			ack, _ := r.figure("last acknowledged heartbeat→next (≥ TTL)")
			if ack.Value < ttl.Value {
				t.Errorf("crash: next leader %v ms after the last acknowledged heartbeat, expected: at least the TTL, %v ms", ack.Value, ttl.Value)
			}
		}
	}
	for _, w := range Workloads {
		if !seen[w.ID] && !w.optIn { // growth has a test of its own
			t.Errorf("workload %d (%s): no result", w.ID, w.Name)
		}
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("short run, %.1fs:\n%s", rep.Seconds, b.String())
}

// TestShortRunAgainstEtcd runs the one-client and crash workloads against
// etcd too, when etcd is installed (scripts/install-etcd.sh), to keep the
// etcd side from rotting: its client, its servers' start and stop, and
// the keep-alive tracking that the crash workload's safety check needs.
func TestShortRunAgainstEtcd(t *testing.T) {
	t.Parallel() // beside the other short runs (TestShortRunAgainstTenure says why)
	if testing.Short() {
		t.Skip("starts servers; skipped with -short")
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed (scripts/install-etcd.sh installs it)")
	}
	rep := runShort(t, Config{Against: []System{Etcd}, Workloads: []int{1, 6}, Servers: ServerSpec{EtcdBinary: etcd}})
	got := map[System]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Errorf("workload %d, %s: %s", r.Workload, r.System, r.Err)
			continue
		}
		got[r.System]++
		name := "pairs/s"
		if r.Workload == 6 {
			name = "crash→next"
		}
		if f, ok := r.figure(name); !ok || f.Value <= 0 {
			t.Errorf("workload %d, %s: %s got = %v, expected: above 0", r.Workload, r.System, name, f.Value)
		}
	}
	if got[Tenure] != 2 || got[Etcd] != 2 {
		t.Errorf("results per system got = %v, expected: 2 each", got)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", b.String())
}

// runShort runs cfg in short mode, one round of a second per window, with
// the tenure binary built for the test.
func runShort(t *testing.T, cfg Config) *Report {
	t.Helper()
	cfg.Short, cfg.Rounds, cfg.Duration = true, 1, time.Second
	if cfg.Servers.TenureBinary == "" {
		cfg.Servers.TenureBinary = proccluster.Binary(t)
	}
	cfg.Servers.Dir = t.TempDir()
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Errorf("Run: %v", err)
	}
	if rep == nil {
		t.FailNow()
	}
	return rep
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestShortRunThroughEtcdClient drives Tenure, and etcd when it is
// installed, through etcd's client (--client etcd): lock pairs, a
// resign, compare-and-swap and lease keep-alives on Tenure's etcd API,
// each result with its server CPU per operation.
func TestShortRunThroughEtcdClient(t *testing.T) {
	t.Parallel() // beside the other short runs (TestShortRunAgainstTenure says why)
	if testing.Short() {
		t.Skip("starts servers; skipped with -short")
	}
	// The README's test command runs the lock pairs on Tenure;
	// TENURE_BENCH_ETCD=1 adds compare-and-swap, the keep-alives, the
	// resign and etcd's side (otherwise TestShortRunAgainstEtcd's), for
	// time.
	cfg := Config{Client: ClientEtcd, Workloads: []int{1}}
	want := map[System]int{Tenure: 1}
	if os.Getenv("TENURE_BENCH_ETCD") != "" {
		cfg.Workloads = []int{1, 4, 5, 7}
		want[Tenure] = 4
		if etcd, err := exec.LookPath("etcd"); err == nil {
			cfg.Against, cfg.Servers.EtcdBinary = []System{Etcd}, etcd
			want[Etcd] = 4
		}
	}
	rep := runShort(t, cfg)
	if rep.Client != ClientEtcd {
		t.Errorf("report client got = %q, expected: %q", rep.Client, ClientEtcd)
	}
	figures := map[int][]string{
		1: {"pairs/s", "server CPU/pair"},
		4: {"sessions kept alive", "heartbeats/s", "server CPU/heartbeat"},
		5: {"resign→next p50", "server CPU/handover"},
		7: {"CAS/s", "server CPU/CAS"},
	}
	got := map[System]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Errorf("workload %d, %s: %s", r.Workload, r.System, r.Err)
			continue
		}
		got[r.System]++
		for _, name := range figures[r.Workload] {
			if f, ok := r.figure(name); !ok || f.Value <= 0 {
				t.Errorf("workload %d, %s: %s got = %v (present %v), expected: above 0", r.Workload, r.System, name, f.Value, ok)
			}
		}
	}
	if len(got) != len(want) || got[Tenure] != want[Tenure] || got[Etcd] != want[Etcd] {
		t.Errorf("results per system got = %v, expected: %v", got, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", b.String())
}

// TestInjectedLatencyReachesEveryCommit runs workload 11 on 3-node
// clusters whose peer links are delayed and whose log syncs are slowed
// (etcd's under strace, when one can trace here), and checks that every
// commit pays both: at least the round trip and a sync, whichever
// engine, since a commit needs a follower's durable write after the
// leader's message reached it. And that a sync delay is refused for a
// binary that cannot add it.
func TestInjectedLatencyReachesEveryCommit(t *testing.T) {
	t.Parallel() // beside the other short runs (TestShortRunAgainstTenure says why)
	if testing.Short() {
		t.Skip("starts servers; skipped with -short")
	}
	if err := CheckBenchSync(proccluster.Binary(t)); !errors.Is(err, ErrNoBenchSync) {
		t.Errorf("CheckBenchSync of a build without the tag: got = %v, expected: %v", err, ErrNoBenchSync)
	}
	const rtt, sync = 20 * time.Millisecond, 5 * time.Millisecond
	cfg := Config{Workloads: []int{11}}
	cfg.Servers.PeerRTT, cfg.Servers.SyncDelay = rtt, sync
	cfg.Servers.TenureBinary = proccluster.BenchBinary(t)
	want := map[System]time.Duration{Tenure: rtt + sync}
	if etcd, err := exec.LookPath("etcd"); err == nil {
		cfg.Against, cfg.Servers.EtcdBinary = []System{Etcd}, etcd
		want[Etcd] = rtt
	}
	rep := runShort(t, cfg)
	if rep.PeerRTT != rtt.String() || rep.SyncDelay != sync.String() {
		t.Errorf("report's latencies: got = %q, %q, expected: %q, %q", rep.PeerRTT, rep.SyncDelay, rtt, sync)
	}
	if tracer := etcdSyncTracer(t.Context()); rep.EtcdSyncDelay != (tracer != "" && len(want) > 1) {
		t.Errorf("etcd's syncs delayed: got = %v, expected: %v (strace that can trace here: %q)", rep.EtcdSyncDelay, !rep.EtcdSyncDelay, tracer)
	}
	if rep.EtcdSyncDelay {
		want[Etcd] = rtt + sync
	}
	got := map[System]bool{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Errorf("workload %d, %s: %s", r.Workload, r.System, r.Err)
			continue
		}
		got[r.System] = true
		f, ok := r.figure("commit p50")
		if least := ms(want[r.System]); !ok || f.Value < least {
			t.Errorf("%s commit p50: got = %vms (present %v), expected: at least %vms", r.System, f.Value, ok, least)
		}
		if f, ok := r.figure("log sync mean, all nodes"); !ok || (want[r.System] > rtt && f.Value < ms(sync)) {
			t.Errorf("%s log sync mean: got = %vms (present %v), expected: present, and where delayed at least %vms", r.System, f.Value, ok, ms(sync))
		}
	}
	if len(got) != len(want) {
		t.Errorf("systems measured: got = %v, expected: %v", got, want)
	}
}

// TestShortRunFailover runs workload 12 once on a 3-node cluster behind
// delaying proxies: the leader's process is killed, a write is
// acknowledged by a new leader, and the killed node, restarted, catches
// up (runOne fails a result whose nodes do not all run at its end). A new
// leader cannot be elected before a follower's election timeout (tenure
// serve's default, 500 ms; raft draws between it and twice it) has
// passed without the old leader's messages, counted from the last
// heartbeat before the kill: the first write cannot come sooner than
// that timeout less a heartbeat interval and a tick (a tenth of it each).
func TestShortRunFailover(t *testing.T) {
	t.Parallel() // beside the other short runs (TestShortRunAgainstTenure says why)
	if testing.Short() {
		t.Skip("starts servers; skipped with -short")
	}
	cfg := Config{Workloads: []int{12}}
	cfg.Servers.PeerRTT = time.Millisecond
	rep := runShort(t, cfg)
	if len(rep.Results) != 1 {
		t.Fatalf("results got = %d, expected: 1", len(rep.Results))
	}
	r := rep.Results[0]
	if r.Err != "" {
		t.Fatalf("failover: %s", r.Err)
	}
	if f, ok := r.figure("failovers"); !ok || f.Value != 1 {
		t.Errorf("failovers got = %v (present %v), expected: 1", f.Value, ok)
	}
	const least = 400.0 // ms
	if f, ok := r.figure("kill→first write p50"); !ok || f.Value < least {
		t.Errorf("kill→first write p50 got = %vms (present %v), expected: at least %vms, the election timeout less a heartbeat and a tick", f.Value, ok, least)
	}
}

// TestShortGrowth runs workload 13 in short mode against Tenure and
// checks that every dimension measured every step, that workloads 1 and
// 2 ran at each, and that the server's RSS grew with its state: each
// short step adds thousands of keys, sessions, watchers or revisions,
// megabytes more than the noise between two readings.
func TestShortGrowth(t *testing.T) {
	t.Parallel() // beside the other short runs (TestShortRunAgainstTenure says why)
	if testing.Short() {
		t.Skip("starts four servers; skipped with -short")
	}
	rep := runShort(t, Config{Workloads: []int{13}})
	gz := sizesFor(true, time.Second).growth
	dims := gz.dimensions()
	byVariant := map[string]Result{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Errorf("growth %s: %s", r.Variant, r.Err)
		}
		byVariant[r.Variant] = r
	}
	for _, d := range dims {
		var rss []float64
		for _, step := range d.steps {
			v := d.name + " " + thousands(int64(step))
			r, ok := byVariant[v]
			if !ok {
				t.Errorf("growth: no result for %q", v)
				continue
			}
			if f, _ := r.figure("size"); f.Value != float64(step) {
				t.Errorf("growth %s: size got = %v, expected: %d", v, f.Value, step)
			}
			for _, name := range []string{"server RSS", "(1) pairs/s", "(1) pair p50", "(1) pair p99", "(2) pairs/s", "(2) pair p50", "(2) pair p99", d.name + " made/s"} {
				if f, ok := r.figure(name); !ok || f.Value <= 0 {
					t.Errorf("growth %s: %s got = %v (present %v), expected: above 0", v, name, f.Value, ok)
				}
			}
			f, _ := r.figure("server RSS")
			rss = append(rss, f.Value)
		}
		if len(rss) == len(d.steps) && rss[len(rss)-1] <= rss[0] {
			t.Errorf("growth %s: server RSS got = %v MiB at steps %v, expected: more at the largest step than at the smallest", d.name, rss, d.steps)
		}
		s, ok := byVariant[d.name]
		if !ok {
			t.Errorf("growth: no summary for %s", d.name)
			continue
		}
		if f, _ := s.figure("largest step reached"); f.Value != float64(d.steps[len(d.steps)-1]) {
			t.Errorf("growth %s: largest step reached got = %v, expected: %d (note %q)", d.name, f.Value, d.steps[len(d.steps)-1], s.Note)
		}
		if f, ok := s.figure("RSS per " + d.unit + " (slope)"); !ok || f.Value <= 0 {
			t.Errorf("growth %s: RSS per %s got = %v (present %v), expected: above 0", d.name, d.unit, f.Value, ok)
		}
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", b.String())
}
