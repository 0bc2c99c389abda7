package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/proccluster"
	"github.com/tenurehq/tenure/internal/testnet"
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

// --- the server process ---

// serverProc is one tenure server run as a child process on fixed
// 127.0.0.1 ports and data dir, so that it can be killed and restarted as
// the same node. Everything runs on the test goroutine.
type serverProc struct {
	t                     *testing.T
	bin, dataDir, logPath string
	listen, peer, url     string
	starts                int
	// args are added to every start's command line; a later flag of the
	// same name wins.
	args []string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	api    *apiClients   // clients for the current process
}

func newServerProc(t *testing.T, bin string) *serverProc {
	dir := t.TempDir()
	p := &serverProc{
		t:       t,
		bin:     bin,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "server.log"),
		listen:  freePort(t),
		peer:    freePort(t),
	}
	p.url = "http://" + p.listen
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server log (last lines of %s):\n%s", p.logPath, proccluster.Tail(p.logPath, 40))
		}
	})
	return p
}

// freePort returns a 127.0.0.1 address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	return testnet.Free(t)
}

// start runs the server and returns once /readyz answers 200.
func (p *serverProc) start(ctx context.Context) {
	t := p.t
	t.Helper()
	p.starts++
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %d\n", p.starts)
	// A low snapshot threshold makes restarts restore snapshots and replay
	// the log after them, not only replay.
	args := append([]string{"serve", "--listen", p.listen, "--peer-listen", p.peer, "--data-dir", p.dataDir,
		"--snapshot-threshold", "256"}, p.args...)
	cmd := exec.Command(p.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	setDeathSignal(cmd)
	err = cmd.Start()
	f.Close() // the child has its own descriptor
	if err != nil {
		t.Fatalf("start %s: %v", p.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	p.waitReady(ctx)
	p.api = dialAPI(p.url)
}

func (p *serverProc) waitReady(ctx context.Context) {
	t := p.t
	t.Helper()
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	begin := time.Now()
	for {
		resp, err := hc.Get(p.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("server start %d: exited before ready: %v", p.starts, p.cmd.ProcessState)
		case <-ctx.Done():
			t.Fatalf("server start %d: not ready after %v", p.starts, time.Since(begin).Round(time.Millisecond))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone. It is safe to
// call when nothing runs.
func (p *serverProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
	if p.api != nil {
		p.api.close()
		p.api = nil
	}
}

// apiClients speak cleartext HTTP/2 to one server process.
type apiClients struct {
	tr       *http.Transport
	sessions tenurev1connect.SessionServiceClient
	leases   tenurev1connect.LeaseServiceClient
	kv       tenurev1connect.KVServiceClient
}

func dialAPI(url string) *apiClients {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols:   &protos,
		DialContext: (&net.Dialer{Timeout: time.Second}).DialContext,
	}
	hc := &http.Client{Transport: tr}
	return &apiClients{
		tr:       tr,
		sessions: tenurev1connect.NewSessionServiceClient(hc, url),
		leases:   tenurev1connect.NewLeaseServiceClient(hc, url),
		kv:       tenurev1connect.NewKVServiceClient(hc, url),
	}
}

func (a *apiClients) close() { a.tr.CloseIdleConnections() }

// call runs one call with the per-call timeout.
func call[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return fn(ctx)
}

// read runs a read after a restart, retrying while the server says it is
// unavailable. Reads change nothing, so retrying them is always safe.
func read[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	for {
		v, err := call(ctx, fn)
		if err == nil || connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// verdict reports whether err is the server's answer rather than a lost
// connection or a timeout: the call reached the state machine or the
// handler and was rejected, so it changed nothing.
func verdict(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists,
		connect.CodePermissionDenied, connect.CodeFailedPrecondition, connect.CodeResourceExhausted,
		connect.CodeOutOfRange, connect.CodeUnimplemented, connect.CodeUnauthenticated:
		return true
	}
	return false
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

// --- puts ---

// putWorker writes "1", "2", "3"... to its own key, one at a time. Its
// fields are written by its goroutine during a round and read by the test
// goroutine between rounds.
type putWorker struct {
	key       string
	attempted int64 // T: the highest value ever sent
	ackedVal  int64 // A: the highest value acknowledged
	applied   int64 // puts known to be applied: the key's expected version
	acked     int   // acknowledged puts
	revs      []int64
	lastErr   *callErr
	problems  []string
}

func (p *putWorker) run(ctx context.Context, api *apiClients) {
	for ctx.Err() == nil {
		p.attempted++
		v := p.attempted
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
			return api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: p.key, Value: strconv.FormatInt(v, 10)}))
		})
		if err != nil {
			// Unknown outcome: wait for the restart to find out.
			p.lastErr = &callErr{err, time.Now()}
			if verdict(err) {
				p.problems = append(p.problems, fmt.Sprintf("put %s=%d: got = %v, expected: success or a lost connection", p.key, v, err))
			}
			return
		}
		p.ackedVal = v
		p.applied++
		p.acked++
		p.revs = append(p.revs, resp.Msg.Revision)
	}
}

func (p *putWorker) check(ctx context.Context, api *apiClients, w *workload) []string {
	var val, version int64
	resp, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: p.key}))
	})
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
	case err != nil:
		return []string{fmt.Sprintf("get %s: %v", p.key, err)}
	default:
		version = resp.Msg.Kv.Version
		if val, err = strconv.ParseInt(resp.Msg.Kv.Value, 10, 64); err != nil {
			return []string{fmt.Sprintf("%s: value got = %q, expected: a number", p.key, resp.Msg.Kv.Value)}
		}
	}
	var problems []string
	switch {
	case val == p.ackedVal:
		if p.attempted > p.ackedVal {
			w.putsLost++
		}
	case val == p.attempted:
		// The one unacknowledged put was applied.
		w.putsApplied++
		p.applied++
	default:
		problems = append(problems, fmt.Sprintf("%s: value got = %d, expected: %d (last acknowledged) or %d (last attempted)", p.key, val, p.ackedVal, p.attempted))
	}
	if version != p.applied {
		problems = append(problems, fmt.Sprintf("%s: version got = %d, expected: %d (puts applied; %d attempted, %d acknowledged)", p.key, version, p.applied, p.attempted, p.acked))
	}
	// The next round writes on from attempted+1, whatever happened.
	p.ackedVal = val
	return problems
}

// --- compare-and-swap counter ---

const counterKey = "crash/counter"

// casWorker increments the counter: read it, then swap in value+1 if its
// mod_revision has not moved. A failed compare changes nothing and is
// retried; any other failure leaves an unknown outcome.
type casWorker struct {
	id                       int
	acked, unknown           int // this round
	ackedTotal, unknownTotal int
	revs                     []int64
	lastErr                  *callErr
	problems                 []string
}

func (c *casWorker) run(ctx context.Context, api *apiClients) {
	for ctx.Err() == nil {
		cur, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
			return api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: counterKey}))
		})
		if err != nil {
			c.lastErr = &callErr{err, time.Now()}
			return
		}
		n, err := strconv.ParseInt(cur.Msg.Kv.Value, 10, 64)
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("%s: value got = %q, expected: a number", counterKey, cur.Msg.Kv.Value))
			return
		}
		next := strconv.FormatInt(n+1, 10)
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.CompareAndSwapResponse], error) {
			return api.kv.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{
				Key:     counterKey,
				Compare: &tenurev1.Compare{Target: &tenurev1.Compare_ModRevision{ModRevision: cur.Msg.Kv.ModRevision}},
				Value:   next,
			}))
		})
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			continue // another worker got there first
		}
		if err != nil {
			c.lastErr = &callErr{err, time.Now()}
			c.unknown++
			if verdict(err) {
				c.problems = append(c.problems, fmt.Sprintf("compare-and-swap %s to %s: got = %v, expected: success, compare failed or a lost connection", counterKey, next, err))
			}
			return
		}
		if resp.Msg.Kv.GetValue() != next {
			c.problems = append(c.problems, fmt.Sprintf("compare-and-swap %s: value got = %q, expected: %q", counterKey, resp.Msg.Kv.GetValue(), next))
		}
		c.acked++
		c.revs = append(c.revs, resp.Msg.Revision)
	}
}

// checkCounter compares the counter after a restart with the value at the
// last check plus this round's increments, then takes it as the new base.
func (w *workload) checkCounter(kv *tenurev1.KeyValue) []string {
	var acked, unknown int64
	for _, c := range w.cas {
		acked += int64(c.acked)
		unknown += int64(c.unknown)
		c.ackedTotal += c.acked
		c.unknownTotal += c.unknown
		c.acked, c.unknown = 0, 0
	}
	n, err := strconv.ParseInt(kv.GetValue(), 10, 64)
	if err != nil {
		return []string{fmt.Sprintf("%s: value got = %q, expected: a number", counterKey, kv.GetValue())}
	}
	lo, hi := w.counter+acked, w.counter+acked+unknown
	var problems []string
	if n < lo || n > hi {
		problems = append(problems, fmt.Sprintf("%s: got = %d, expected: between %d and %d (was %d, then %d acknowledged and %d unknown increments)", counterKey, n, lo, hi, w.counter, acked, unknown))
	} else {
		w.casApplied += int(n - lo)
		w.casLost += int(hi - n)
	}
	w.counter = n
	return problems
}

// --- leases ---

type leaseOp int

const (
	opNone leaseOp = iota
	opAcquire
	opRelease
)

type ackedRev struct {
	rev  int64
	what string
}

// leaseWorker acquires and releases one lease with its own session, one
// call at a time. held is the token it holds (0: free); pending is a call
// sent after the last known state whose outcome is unknown.
type leaseWorker struct {
	name, identity     string
	session            int64
	held               int64
	maxToken           int64 // the highest token ever granted for the lease
	lastReleased       int64 // the token of the last acknowledged release
	pending            leaseOp
	acquires, releases int
	revs               []ackedRev
	lastErr            *callErr
	problems           []string
}

func (l *leaseWorker) run(ctx context.Context, api *apiClients) {
	for ctx.Err() == nil {
		if l.held == 0 {
			l.pending = opAcquire
			resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
				return api.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: l.session, Name: l.name}))
			})
			if err != nil {
				l.failed("acquire", err)
				return
			}
			l.pending = opNone
			tok := resp.Msg.Token
			if !resp.Msg.Acquired {
				l.problems = append(l.problems, fmt.Sprintf("acquire %s: got = not acquired (holder %q), expected: granted, nobody else uses it", l.name, resp.Msg.Lease.GetHolderIdentity()))
				return
			}
			if tok <= l.maxToken {
				l.problems = append(l.problems, fmt.Sprintf("acquire %s: token got = %d, expected: above %d, the highest granted before", l.name, tok, l.maxToken))
			}
			l.held, l.maxToken = tok, max(l.maxToken, tok)
			l.acquires++
			l.revs = append(l.revs, ackedRev{tok, fmt.Sprintf("acquire %s", l.name)})
			continue
		}
		l.pending = opRelease
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ReleaseResponse], error) {
			return api.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: l.name, Token: l.held}))
		})
		if err != nil {
			l.failed(fmt.Sprintf("release token %d of", l.held), err)
			return
		}
		l.pending = opNone
		l.lastReleased, l.held = l.held, 0
		l.releases++
		l.revs = append(l.revs, ackedRev{resp.Msg.Revision, fmt.Sprintf("release %s", l.name)})
	}
}

func (l *leaseWorker) failed(op string, err error) {
	l.lastErr = &callErr{err, time.Now()}
	if verdict(err) {
		l.problems = append(l.problems, fmt.Sprintf("%s %s: got = %v, expected: success or a lost connection", op, l.name, err))
	}
}

// check asks Validate what the restarted server says about the lease and
// compares it with the last acknowledged call and the pending one.
func (l *leaseWorker) check(ctx context.Context, api *apiClients, w *workload) []string {
	token := l.held
	if token == 0 {
		token = max(l.lastReleased, 1) // Validate wants a positive token
	}
	resp, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ValidateResponse], error) {
		return api.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Name: l.name, Token: token}))
	})
	if err != nil {
		return []string{fmt.Sprintf("validate %s token %d: %v", l.name, token, err)}
	}
	v := resp.Msg
	if len(v.Tokens) > 1 {
		return []string{fmt.Sprintf("%s: holders' tokens got = %v, expected: at most one, it is a mutex", l.name, v.Tokens)}
	}
	mine := len(v.Tokens) == 1 && v.HolderIdentity == l.identity
	var problems []string
	switch {
	case l.held != 0 && l.pending == opNone:
		if !v.Valid {
			problems = append(problems, fmt.Sprintf("%s: acknowledged grant with token %d lost: got = valid %v, holder %q, tokens %v, expected: valid", l.name, l.held, v.Valid, v.HolderIdentity, v.Tokens))
		}
	case l.held != 0 && l.pending == opRelease:
		switch {
		case v.Valid:
			w.releasesLost++
		case len(v.Tokens) == 0:
			w.releasesApplied++
			l.lastReleased, l.held = l.held, 0
		default:
			problems = append(problems, fmt.Sprintf("%s: after an unacknowledged release of token %d: got = holder %q, tokens %v, expected: still token %d or free", l.name, l.held, v.HolderIdentity, v.Tokens, l.held))
		}
	case l.held == 0 && l.pending == opNone:
		if len(v.Tokens) != 0 {
			problems = append(problems, fmt.Sprintf("%s: acknowledged release of token %d lost: got = holder %q, tokens %v, expected: free", l.name, l.lastReleased, v.HolderIdentity, v.Tokens))
		}
	case l.held == 0 && l.pending == opAcquire:
		switch {
		case len(v.Tokens) == 0:
			w.acquiresLost++
		case mine && v.CurrentToken > l.maxToken:
			// The unacknowledged acquire was applied: the grant is ours,
			// and the next round releases it.
			w.acquiresApplied++
			l.held, l.maxToken = v.CurrentToken, v.CurrentToken
			problems = append(problems, w.ack("global", v.CurrentToken, fmt.Sprintf("acquire %s (unacknowledged, found applied)", l.name))...)
		default:
			problems = append(problems, fmt.Sprintf("%s: after an unacknowledged acquire: got = holder %q, tokens %v, expected: free, or held by %q with a token above %d", l.name, v.HolderIdentity, v.Tokens, l.identity, l.maxToken))
		}
	}
	l.pending = opNone
	return problems
}
