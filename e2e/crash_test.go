package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/proccluster"
)

func TestMain(m *testing.M) { proccluster.Main(m) }

// tenureBinary is cmd/tenure, built once for the test binary's run.
func tenureBinary(t *testing.T) string { return proccluster.Binary(t) }

const (
	crashRounds  = 5
	putWorkers   = 8
	casWorkers   = 3
	leaseWorkers = 3
	// callTimeout bounds every call, so that a worker never hangs on a
	// server that has just been killed.
	callTimeout = 2 * time.Second
	// sessionTTL outlives the whole test: sessions must survive restarts
	// (a new leader restarts every deadline at a full TTL), so the lease
	// checks only ever see the effect of acquires and releases.
	sessionTTL = 2 * time.Minute
	// testBudget stops the test by itself if the server never gets ready.
	testBudget = 50 * time.Second
)

// TestCrashDurability runs the server as its own process, kills it with
// SIGKILL at random moments under concurrent load, restarts it on the same
// data dir and checks safety rule 7, "acknowledged means durable", exactly:
//
//   - Put: each worker owns a key and writes "1", "2", "3"... in order. A
//     worker stops at its first failed call until the next restart, so at
//     most one put per worker per round has an unknown outcome. After a
//     restart the value is the last acknowledged one or the unknown one, and
//     the key's version equals the number of puts known to be applied.
//   - CompareAndSwap: workers increment one counter with a mod_revision
//     compare. Across a restart the counter grows by at least the
//     acknowledged increments and at most those plus the unknown ones.
//   - Leases: each worker's session acquires and releases its own lease.
//     After a restart an acknowledged grant is valid, an acknowledged
//     release is not held, an unknown acquire either did nothing or granted
//     a token above every earlier one, and tokens only ever increase.
//   - Every acknowledged mutation has its own revision, and the revision
//     never goes backwards across a restart.
func TestCrashDurability(t *testing.T) {
	t.Parallel() // its own processes, mostly waiting: it runs beside the package's other slow tests
	if testing.Short() {
		t.Skip("builds the server and kills it with SIGKILL several times")
	}
	bin := tenureBinary(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	defer cancel()

	srv := newServerProc(t, bin)
	srv.start(ctx)
	w := newWorkload(t, ctx, srv.api)

	for round := 1; round <= crashRounds; round++ {
		load := 100*time.Millisecond + rand.N(501*time.Millisecond).Truncate(time.Millisecond)
		w.run(ctx, srv, load)
		srv.start(ctx)
		w.check(t, ctx, srv.api, round)
		if t.Failed() {
			break
		}
	}
	w.summary(t, time.Since(began))
}

// --- the workload ---

type workload struct {
	puts   []*putWorker
	cas    []*casWorker
	leases []*leaseWorker

	counter int64 // the counter's value at the last check: known exactly
	// revisions maps each acknowledged revision, per clock ("key" for
	// keys' KV revisions, "global" for grants), to what made it.
	revisions   map[string]string
	maxRevision int64 // the highest acknowledged key revision
	maxGlobal   int64 // the highest acknowledged global revision
	rounds      int
	loads       []time.Duration
	errCodes    map[string]int
	errSamples  []string // the first failed call of each code
	early       []string // calls that failed before the kill
	killedAt    time.Time
	// Unknown outcomes resolved after restarts.
	putsApplied, putsLost, casApplied, casLost int
	acquiresApplied, acquiresLost              int
	releasesApplied, releasesLost              int
}

func newWorkload(t *testing.T, ctx context.Context, api *apiClients) *workload {
	t.Helper()
	w := &workload{revisions: map[string]string{}, errCodes: map[string]int{}}
	for i := range putWorkers {
		w.puts = append(w.puts, &putWorker{key: fmt.Sprintf("crash/w%d", i)})
	}
	for i := range casWorkers {
		w.cas = append(w.cas, &casWorker{id: i})
	}
	resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
		return api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: counterKey, Value: "0"}))
	})
	if err != nil {
		t.Fatalf("put %s: %v", counterKey, err)
	}
	w.ack("key", resp.Msg.Revision, "put "+counterKey+"=0")
	for i := range leaseWorkers {
		identity := fmt.Sprintf("crash-lease-%d", i)
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
			return api.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: identity, Ttl: durationpb.New(sessionTTL)}))
		})
		if err != nil {
			t.Fatalf("open session %s: %v", identity, err)
		}
		w.leases = append(w.leases, &leaseWorker{name: fmt.Sprintf("crash-lease-%d", i), identity: identity, session: resp.Msg.Session.Id})
	}
	return w
}

// ack records the revision of an acknowledged mutation. Every mutation
// makes exactly one revision, so a revision acknowledged twice means the
// server handed out a revision again after forgetting an earlier write.
// Keys and grants have clocks of their own (the KV and the global
// revision), so each is checked apart.
func (w *workload) ack(clock string, rev int64, what string) []string {
	id := fmt.Sprintf("%s revision %d", clock, rev)
	if prev, ok := w.revisions[id]; ok {
		return []string{fmt.Sprintf("%s acknowledged twice: got = %q, expected: only %q", id, what, prev)}
	}
	w.revisions[id] = what
	if clock == "key" {
		w.maxRevision = max(w.maxRevision, rev)
	} else {
		w.maxGlobal = max(w.maxGlobal, rev)
	}
	return nil
}

// run drives every worker against srv for load, then kills srv with
// SIGKILL while calls are in flight and waits for every worker to stop.
func (w *workload) run(ctx context.Context, srv *serverProc, load time.Duration) {
	w.rounds++
	w.loads = append(w.loads, load)
	api := srv.api
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range w.puts {
		wg.Go(func() { p.run(rctx, api) })
	}
	for _, c := range w.cas {
		wg.Go(func() { c.run(rctx, api) })
	}
	for _, l := range w.leases {
		wg.Go(func() { l.run(rctx, api) })
	}
	timer := time.NewTimer(load)
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	w.killedAt = time.Now()
	srv.kill()
	// Calls in flight fail with the lost connection and new ones are
	// refused, so workers stop by themselves; cancel only stragglers.
	stopped := make(chan struct{})
	go func() {
		wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(callTimeout + time.Second):
		cancel()
		<-stopped
	}
}

// check runs after a restart, on the test goroutine, once every worker has
// stopped: it compares what the server has with what the workers were told,
// then resets each worker's unknown outcome to what the server now says.
func (w *workload) check(t *testing.T, ctx context.Context, api *apiClients, round int) {
	t.Helper()
	var problems []string
	for _, p := range w.puts {
		problems = append(problems, p.problems...)
		p.problems = nil
		for _, r := range p.revs {
			problems = append(problems, w.ack("key", r, fmt.Sprintf("put %s", p.key))...)
		}
		p.revs = nil
		w.countErr(p.lastErr)
		p.lastErr = nil
	}
	for _, c := range w.cas {
		problems = append(problems, c.problems...)
		c.problems = nil
		for _, r := range c.revs {
			problems = append(problems, w.ack("key", r, "compare-and-swap "+counterKey)...)
		}
		c.revs = nil
		w.countErr(c.lastErr)
		c.lastErr = nil
	}
	for _, l := range w.leases {
		problems = append(problems, l.problems...)
		l.problems = nil
		for _, r := range l.revs {
			problems = append(problems, w.ack("global", r.rev, r.what)...)
		}
		l.revs = nil
		w.countErr(l.lastErr)
		l.lastErr = nil
	}

	// The first read after the restart also checks the global revision.
	cur, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: counterKey}))
	})
	if err != nil {
		t.Fatalf("round %d: get %s after restart: %v", round, counterKey, err)
	}
	if cur.Msg.Revision < w.maxRevision {
		problems = append(problems, fmt.Sprintf("key revision after restart: got = %d, expected: at least %d, the highest acknowledged", cur.Msg.Revision, w.maxRevision))
	}
	if r, err := api.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Limit: 1})); err != nil {
		t.Fatalf("round %d: range after restart: %v", round, err)
	} else if r.Msg.GetGlobalRevision() < w.maxGlobal {
		problems = append(problems, fmt.Sprintf("global revision after restart: got = %d, expected: at least %d, the highest acknowledged", r.Msg.GetGlobalRevision(), w.maxGlobal))
	}
	problems = append(problems, w.checkCounter(cur.Msg.Kv)...)
	for _, p := range w.puts {
		problems = append(problems, p.check(ctx, api, w)...)
	}
	for _, l := range w.leases {
		problems = append(problems, l.check(ctx, api, w)...)
	}
	for _, pr := range problems {
		t.Errorf("round %d: %s", round, pr)
	}
}

// callErr is a worker's failed call and when it failed.
type callErr struct {
	err error
	at  time.Time
}

// countErr tallies a worker's failed call by code. A call that failed
// before the kill failed against a healthy server: not a durability
// problem, since its outcome is resolved like any other, but worth a look.
func (w *workload) countErr(e *callErr) {
	if e == nil {
		return
	}
	code := connect.CodeOf(e.err).String()
	if w.errCodes[code] == 0 {
		w.errSamples = append(w.errSamples, e.err.Error())
	}
	w.errCodes[code]++
	if e.at.Before(w.killedAt) {
		w.early = append(w.early, fmt.Sprintf("%v (%v before the kill)", e.err, w.killedAt.Sub(e.at).Round(time.Millisecond)))
	}
}

func (w *workload) summary(t *testing.T, took time.Duration) {
	var puts, putTries, cas, casUnknown, acq, rel int
	for _, p := range w.puts {
		puts += p.acked
		putTries += int(p.attempted)
	}
	for _, c := range w.cas {
		cas += c.ackedTotal
		casUnknown += c.unknownTotal
	}
	for _, l := range w.leases {
		acq += l.acquires
		rel += l.releases
	}
	codes := make([]string, 0, len(w.errCodes))
	for c, n := range w.errCodes {
		codes = append(codes, fmt.Sprintf("%s×%d", c, n))
	}
	sort.Strings(codes)
	t.Logf("%d rounds of SIGKILL after %v of load, %v in all", w.rounds, w.loads, took.Round(time.Millisecond))
	t.Logf("acknowledged: %d of %d puts, %d increments (counter now %d, %d with unknown outcome), %d acquires, %d releases; %d distinct revisions up to %d",
		puts, putTries, cas, w.counter, casUnknown, acq, rel, len(w.revisions), w.maxRevision)
	t.Logf("unknown outcomes found applied/not applied after restart: puts %d/%d, increments %d/%d, acquires %d/%d, releases %d/%d; failed calls by code: %s",
		w.putsApplied, w.putsLost, w.casApplied, w.casLost, w.acquiresApplied, w.acquiresLost, w.releasesApplied, w.releasesLost, strings.Join(codes, " "))
	t.Logf("a failed call of each code: %s", strings.Join(w.errSamples, "; "))
	if len(w.early) > 0 {
		t.Logf("calls that failed before a kill, against a running server: %s", strings.Join(w.early, "; "))
	}
}
