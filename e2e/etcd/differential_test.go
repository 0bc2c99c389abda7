//go:build linux

package etcd

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDifferentialFuzz sends seeded random sequences of operations to a
// real etcd and to Tenure, each seed on a fresh pair of servers, and
// compares every answer and every watch event field by field (what names
// a server, cluster and member IDs, raft term and the lease IDs a server
// picks, aside; revisions must match exactly). Keys and values are
// bytes: a seed's keys are a few strings of bytes UTF-8 and range ends
// turn on (diffgen_test.go), and the operations cover Range with every
// option, Put, DeleteRange, nested Txn with compares on every target,
// Compact, leases with keys attached, and watches, historical and live,
// with prev_kv, filters and cancels (diffops_test.go lists them).
//
// When the two differ, the test shrinks the sequence on fresh servers
// and prints the seed, the shrunk sequence as a script, its run with
// each answer, and the commands that replay either.
//
// By default it runs seeds for 20 seconds. The environment sets more:
//
//	TENURE_DIFF_TIME=10m     run seeds this long
//	TENURE_DIFF_SEEDS=N      run N seeds (instead of a time)
//	TENURE_DIFF_SEED=N       start from seed N (alone, unless one of the above is set)
//	TENURE_DIFF_OPS=N        operations per seed (200)
//	TENURE_DIFF_SHRINK=5m    how long shrinking may take (2m)
//	TENURE_DIFF_SCRIPT=FILE  run the script in FILE once, as a shrunk failure is saved
//
// The reference is etcd 3.4 (Debian's, which scripts/install-etcd.sh
// installs), while Tenure follows etcd 3.5 where the two differ. The
// sequences keep out of what 3.4 and 3.5 answer differently, so that
// every difference the test reports is one from etcd 3.5 too: progress
// requests (3.4 answers at once, before a historical watch has its
// events), negative watch start revisions (3.4 creates the watch, then
// cancels it); and out of what Tenure documents as its own
// (docs/etcd.md): negative lease IDs, TTLs above --max-ttl or below
// --min-ttl, more than --max-name-bytes or --max-value-bytes, and a
// watch that starts in the compacted past opens on a stream of its own
// (etcd keeps its ID taken there after cancelling it, Tenure frees it).
// Nor does it ask what depends on when it is asked or on an ID a server
// picked: a watch never starts at the compacted revision itself, and one
// left open never starts in the past, since what etcd sends them depends
// on how far its background compaction has got; a lease compare is = or
// !=, never < or >. And a txn never both deletes and puts with
// ignore_value or ignore_lease, which can make etcd panic.
func TestDifferentialFuzz(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	cfg := fuzzConfigFromEnv(t)
	requireEtcd(t)
	pool := newPairPool(tenureBinary(t))
	t.Cleanup(pool.close)

	if cfg.script != "" {
		text, err := os.ReadFile(cfg.script)
		if err != nil {
			t.Fatal(err)
		}
		ops, err := parseScript(string(text))
		if err != nil {
			t.Fatalf("%s: %v", cfg.script, err)
		}
		res, err := attempt(pool, ops)
		if err != nil {
			t.Fatal(err)
		}
		if res.diff != nil {
			t.Fatal(cfg.failure(t, pool, 0, ops, res))
		}
		t.Logf("%s: %s, no difference; its run:\n%s", cfg.script, plural(len(ops), "operation"), trace(res))
		return
	}

	start, shown := time.Now(), time.Now()
	var total runStats
	seeds := 0
	summary := func() string {
		return fmt.Sprintf("%s (%d to %d), %d operations, %d answers and %d watch events compared in %v",
			plural(seeds, "seed"), cfg.seed, cfg.seed+uint64(seeds)-1, total.ops, total.answers, total.events, time.Since(start).Round(time.Second))
	}
	for i := 0; cfg.more(t, i, start); i++ {
		seed := cfg.seed + uint64(i)
		ops := generate(seed, cfg.ops)
		res, err := attempt(pool, ops)
		if err != nil {
			t.Fatal(err)
		}
		seeds++
		total.add(res.stats)
		if res.diff != nil {
			t.Fatal(cfg.failure(t, pool, seed, ops, res))
		}
		if time.Since(shown) >= 10*time.Second {
			t.Logf("so far: %s", summary())
			shown = time.Now()
		}
	}
	t.Logf("no difference: %s", summary())
	t.Logf("etcd's error answers among them:\n%s", tally(total.errors))
}

// tally is counts by name, most first, one a line.
func tally(counts map[string]int) string {
	names := slices.Collect(maps.Keys(counts))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(counts[b]-counts[a], strings.Compare(a, b)) })
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%7d  %s\n", counts[n], n)
	}
	return b.String()
}

// TestDifferentialCases runs the scripts in testdata/differential, each a
// difference the fuzzer or a user once found, against etcd and Tenure on
// a fresh pair of servers each, compared as the fuzzer compares.
func TestDifferentialCases(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	files, err := filepath.Glob(filepath.Join("testdata", "differential", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata/differential: %v", err)
	}
	requireEtcd(t)
	pool := newPairPool(tenureBinary(t))
	t.Cleanup(pool.close)
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			ops, err := parseScript(string(text))
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			res, err := attempt(pool, ops)
			if err != nil {
				t.Fatal(err)
			}
			if res.diff != nil {
				t.Fatalf("%s: %s\n\nits run:\n%s\nreplay: cd e2e/etcd && %sTENURE_DIFF_SCRIPT=%s go test -count=1 -run 'TestDifferentialFuzz$' .",
					f, describe(res.diff), trace(res), binaryEnv(), f)
			}
		})
	}
}

// TestDifferentialScript checks that a generated sequence printed as a
// script parses back to the same script, so that what a failure prints
// is what its replay runs.
func TestDifferentialScript(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		ops := generate(seed, 300)
		text := script(ops, seed%2 == 0)
		parsed, err := parseScript(text)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if got, want := script(parsed, false), script(ops, false); got != want {
			t.Fatalf("seed %d: parsed back differently:\n%s\nexpected:\n%s", seed, got, want)
		}
	}
}

// fuzzConfig is how long and on what TestDifferentialFuzz runs.
type fuzzConfig struct {
	seed     uint64
	seeds    int           // 0: run for duration
	duration time.Duration // 0: run seeds
	ops      int
	shrink   time.Duration
	script   string
	env      string // the TENURE_DIFF_ settings given, for replay commands
}

func fuzzConfigFromEnv(t *testing.T) fuzzConfig {
	cfg := fuzzConfig{seed: uint64(time.Now().UnixNano()) % 1e9, duration: 20 * time.Second, ops: 200, shrink: 2 * time.Minute}
	number := func(name string) (int64, bool) {
		s := os.Getenv(name)
		if s == "" {
			return 0, false
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			t.Fatalf("%s=%q: not a number", name, s)
		}
		return v, true
	}
	duration := func(name string) (time.Duration, bool) {
		s := os.Getenv(name)
		if s == "" {
			return 0, false
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			t.Fatalf("%s=%q: not a duration (30s, 10m, 2h)", name, s)
		}
		return d, true
	}
	seedSet, seedsSet, timeSet := false, false, false
	if v, ok := number("TENURE_DIFF_SEED"); ok {
		cfg.seed, seedSet = uint64(v), true
	}
	if v, ok := number("TENURE_DIFF_OPS"); ok && v > 0 {
		cfg.ops = int(v)
	}
	if d, ok := duration("TENURE_DIFF_TIME"); ok {
		cfg.duration, timeSet = d, true
	}
	if v, ok := number("TENURE_DIFF_SEEDS"); ok && v > 0 {
		cfg.seeds, cfg.duration, seedsSet = int(v), 0, true
	}
	if d, ok := duration("TENURE_DIFF_SHRINK"); ok {
		cfg.shrink = d
	}
	cfg.script = os.Getenv("TENURE_DIFF_SCRIPT")
	if seedSet && !seedsSet && !timeSet {
		cfg.seeds, cfg.duration = 1, 0
	}
	return cfg
}

// more tells whether to run seed number i of a run that started at start:
// within its count or time, and with time left before the test's
// deadline for a seed and for shrinking a failure.
func (cfg fuzzConfig) more(t *testing.T, i int, start time.Time) bool {
	if i == 0 {
		return true
	}
	if cfg.seeds > 0 && i >= cfg.seeds || cfg.seeds == 0 && time.Since(start) >= cfg.duration {
		return false
	}
	if dl, ok := t.Deadline(); ok && time.Until(dl) < cfg.shrink/2+time.Minute {
		t.Logf("stopping before go test's -timeout: %v left", time.Until(dl).Round(time.Second))
		return false
	}
	return true
}

// failure shrinks a sequence on which the servers differed and describes
// it: the seed (0 for a script), the shrunk sequence, its run, and the
// commands that replay it.
func (cfg fuzzConfig) failure(t *testing.T, pool *pairPool, seed uint64, ops []operation, res *runResult) string {
	var b strings.Builder
	if cfg.script == "" {
		fmt.Fprintf(&b, "etcd and Tenure differ on seed %d, after operation %d of %d: %s\n", seed, res.diff.at+1, len(ops), describe(res.diff))
	} else {
		fmt.Fprintf(&b, "etcd and Tenure differ on %s, after operation %d of %d: %s\n", cfg.script, res.diff.at+1, len(ops), describe(res.diff))
	}
	budget := cfg.shrink
	if dl, ok := t.Deadline(); ok {
		budget = min(budget, time.Until(dl)-30*time.Second)
	}
	if cfg.script != "" && os.Getenv("TENURE_DIFF_SHRINK") == "" {
		budget = 0 // a script replays as it is, unless asked
	}
	sh := &shrinker{run: func(ops []operation) (*runResult, error) { return attempt(pool, ops) }, deadline: time.Now().Add(budget)}
	began := time.Now()
	sh.shrink(ops, res)
	switch {
	case budget <= 0:
	case sh.kept == 0:
		fmt.Fprintf(&b, "\nIt did not come back in %d runs of it on fresh servers (a timing difference?): what follows is the first run.\n", sh.runs)
	default:
		stopped := ""
		if sh.expired() {
			stopped = ", stopped by TENURE_DIFF_SHRINK or go test's -timeout"
		}
		fmt.Fprintf(&b, "\nShrunk to %s in %d runs on fresh servers (%v%s):\n\n%s",
			plural(len(sh.best), "operation"), sh.runs, time.Since(began).Round(time.Second), stopped, indent(script(sh.best, true), "    "))
		fmt.Fprintf(&b, "\nwhere they differ: %s\n", describe(sh.res.diff))
	}
	fmt.Fprintf(&b, "\nIts run (each operation, the state it ran in, etcd's answer and, where it differs, Tenure's):\n%s", trace(sh.res))
	file := cfg.script
	if sh.kept > 0 || cfg.script == "" {
		file = filepath.Join(os.TempDir(), fmt.Sprintf("tenure-diff-%d.txt", seed))
		header := fmt.Sprintf("# etcd and Tenure differ (TestDifferentialFuzz, seed %d): %s\n", seed, sh.res.diff.what)
		if err := os.WriteFile(file, []byte(header+script(sh.best, false)), 0o644); err != nil {
			file = "FILE (save the script above in it)"
		}
	}
	fmt.Fprintf(&b, "\nReplay the shrunk sequence (saved in %s):\n    cd e2e/etcd && %sTENURE_DIFF_SCRIPT=%s go test -count=1 -run 'TestDifferentialFuzz$' .\n", file, binaryEnv(), file)
	if cfg.script == "" {
		fmt.Fprintf(&b, "Replay the seed:\n    cd e2e/etcd && %sTENURE_DIFF_SEED=%d TENURE_DIFF_OPS=%d go test -count=1 -run 'TestDifferentialFuzz$' .\n", binaryEnv(), seed, cfg.ops)
	}
	return b.String()
}

// binaryEnv is TENURE_BINARY=... for a replay command, when the run was
// given a binary.
func binaryEnv() string {
	if bin := os.Getenv("TENURE_BINARY"); bin != "" {
		return "TENURE_BINARY=" + bin + " "
	}
	return ""
}

// describe is a difference, both sides' versions on lines of their own.
func describe(d *difference) string {
	return fmt.Sprintf("%s\n  etcd:   %s\n  tenure: %s", d.what, indent(d.etcd, "          ")[10:], indent(d.tenure, "          ")[10:])
}

// trace is a run, one operation after another.
func trace(res *runResult) string {
	var b strings.Builder
	for i, st := range res.steps {
		label := fmt.Sprintf("%3d", i+1)
		if i >= res.n {
			label = "end"
		}
		fmt.Fprintf(&b, "%s  %s    [%s]\n", label, st.op.script(), st.before)
		fmt.Fprintf(&b, "       etcd:   %s\n", indent(st.answers[0], "               ")[15:])
		if len(st.answers) > 1 && st.answers[1] != st.answers[0] {
			fmt.Fprintf(&b, "       tenure: %s\n", indent(st.answers[1], "               ")[15:])
		}
	}
	if d := res.diff; d != nil && d.what != "the answer" {
		fmt.Fprintf(&b, "then %s\n", describe(d))
	}
	return b.String()
}

// plural is n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	out := strings.Join(lines, "\n")
	if strings.HasSuffix(s, "\n") {
		out += "\n"
	}
	return out
}
