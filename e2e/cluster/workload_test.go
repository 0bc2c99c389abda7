package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
	"github.com/tenurehq/tenure/internal/linearizability"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// quiet discards the clients' logs; TENURE_CLIENT_LOG=1 shows them, at debug
// level, when a fault test needs explaining.
var quiet = func() *slog.Logger {
	if os.Getenv("TENURE_CLIENT_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

var digits = regexp.MustCompile(`[0-9]+`)

// newClient returns a client of every node, starting at node first.
func newClient(t *testing.T, c *proccluster.Cluster, first int, opts ...client.Option) *client.Client {
	t.Helper()
	cl, err := client.New(context.Background(), c.Endpoints(first), append([]client.Option{client.WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// --- the fenced resource ---

// resource is what lock holders write to: one fence per lease with the
// Monotonic policy, and the bookkeeping to check the locks' promises.
type resource struct {
	policy fence.Policy
	base   time.Time

	mu        sync.Mutex         // guards the fields below
	inside    map[string]int64   // lease → token of the holder in its critical section
	entered   map[string][]entry // lease → critical sections in the order they began
	overlaps  []string
	writes    []write
	grants    []grant
	lockErrs  int
	opErrs    int // failed puts and unlocks
	sessLosts int
	samples   map[string]int // error texts seen, to explain failures
}

// entry is a critical section's grant.
type entry struct {
	token   int64
	session int64
}

type write struct {
	lease    string
	token    int64
	start    time.Duration
	accepted bool
}

type grant struct {
	lease string
	token int64
	acked time.Duration // when Lock returned
}

func newResource() *resource {
	return &resource{
		policy:  fence.Monotonic(fence.NewMemoryStore()),
		base:    time.Now(),
		inside:  map[string]int64{},
		entered: map[string][]entry{},
		samples: map[string]int{},
	}
}

func (r *resource) opFailed(what string, err error) {
	r.mu.Lock()
	r.opErrs++
	r.mu.Unlock()
	r.sample(what, err)
}

// sample counts an error by its text, for the log.
func (r *resource) sample(what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := fmt.Sprintf("%s: %s [code %v session expired %v, unavailable %v, deadline %v, canceled %v]", what, digits.ReplaceAllString(err.Error(), "N"), connect.CodeOf(err),
		errors.Is(err, client.ErrSessionExpired), errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled))
	r.samples[msg]++
}

func (r *resource) now() time.Duration { return time.Since(r.base) }

func (r *resource) granted(tok client.Token, at time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.grants = append(r.grants, grant{tok.Lease().String(), tok.Token, at})
}

// enter begins a critical section; another one on the same lease at the
// same time is an overlap.
func (r *resource) enter(tok client.Token, session int64) {
	lease := tok.Lease().String()
	r.mu.Lock()
	defer r.mu.Unlock()
	if other := r.inside[lease]; other != 0 {
		r.overlaps = append(r.overlaps, fmt.Sprintf("%s: token %d entered while token %d was inside", lease, tok.Token, other))
	}
	r.inside[lease] = tok.Token
	r.entered[lease] = append(r.entered[lease], entry{tok.Token, session})
}

func (r *resource) exit(tok client.Token) {
	lease := tok.Lease().String()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inside[lease] == tok.Token {
		delete(r.inside, lease)
	}
}

// write is a fenced write: accepted unless the fence saw a higher token.
func (r *resource) write(ctx context.Context, tok client.Token) bool {
	start := r.now()
	err := r.policy.Check(ctx, tok)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, write{tok.Lease().String(), tok.Token, start, err == nil})
	return err == nil
}

func (r *resource) grantCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.grants)
}

// check reports every broken promise: overlapping critical sections,
// tokens that did not strictly increase per lease, and stale writes
// accepted — a write with token T that began after a higher token's
// grant had been acknowledged.
func (r *resource) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.overlaps {
		t.Errorf("overlapping critical sections: %s", o)
	}
	for lease, es := range r.entered {
		for i := 1; i < len(es); i++ {
			// A session whose release failed (its outcome unknown) is
			// granted the same grant again: acquire is idempotent per
			// session. Any other grant has a higher token.
			if es[i].token < es[i-1].token || es[i].token == es[i-1].token && es[i].session != es[i-1].session {
				t.Errorf("%s: critical section %d has token %d (session %d) after token %d (session %d); expected: strictly increasing tokens",
					lease, i, es[i].token, es[i].session, es[i-1].token, es[i-1].session)
			}
		}
	}
	// For each lease, the highest token acknowledged by each moment.
	type ack struct {
		at    time.Duration
		token int64
	}
	byLease := map[string][]ack{}
	grants := append([]grant(nil), r.grants...)
	sort.Slice(grants, func(i, j int) bool { return grants[i].acked < grants[j].acked })
	for _, g := range grants {
		acks := byLease[g.lease]
		highest := g.token
		if n := len(acks); n > 0 {
			highest = max(highest, acks[n-1].token)
		}
		byLease[g.lease] = append(acks, ack{g.acked, highest})
	}
	stale := 0
	for _, w := range r.writes {
		if !w.accepted {
			continue
		}
		acks := byLease[w.lease]
		i := sort.Search(len(acks), func(i int) bool { return acks[i].at >= w.start }) - 1
		if i >= 0 && acks[i].token > w.token {
			if stale++; stale <= 10 {
				t.Errorf("%s: write with token %d accepted at %v, after token %d had been granted; expected: refused as stale", w.lease, w.token, w.start, acks[i].token)
			}
		}
	}
	if stale > 10 {
		t.Errorf("... %d stale writes accepted in all", stale)
	}
}

// --- lockers ---

// lockers run n goroutines that take turns on leases (8 per lease by
// default), each with its own session, entering the fenced resource's
// critical section under every valid grant and then writing a key that
// records the grant. Every acknowledged key must survive everything.
type lockers struct {
	res   *resource
	wg    sync.WaitGroup
	acked sync.Map // key → value, every Put acknowledged
	puts  atomic.Int64
}

func startLockers(ctx context.Context, t *testing.T, c *proccluster.Cluster, n, leases int, ttl time.Duration) *lockers {
	l := &lockers{res: newResource()}
	clients := make([]*client.Client, 8)
	for i := range clients {
		clients[i] = newClient(t, c, i%len(c.Nodes))
	}
	for i := range n {
		cl := clients[i%len(clients)]
		lease := fmt.Sprintf("lease-%d", i%leases)
		l.wg.Go(func() { l.run(ctx, cl, i, lease, ttl) })
	}
	return l
}

func (l *lockers) run(ctx context.Context, cl *client.Client, id int, lease string, ttl time.Duration) {
	var sess *client.Session
	defer func() {
		if sess != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = sess.Close(cctx)
			cancel()
		}
	}()
	for ctx.Err() == nil {
		if sess == nil || sess.Err() != nil {
			if sess != nil {
				l.res.mu.Lock()
				l.res.sessLosts++
				l.res.mu.Unlock()
				l.res.sample("session lost", sess.Err())
			}
			var err error
			sess, err = cl.NewSession(ctx, client.WithTTL(ttl), client.WithIdentity(fmt.Sprintf("locker-%d", id)))
			if err != nil {
				sess = nil
				pause(ctx, 100*time.Millisecond)
				continue
			}
		}
		m := sess.Mutex(lease)
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := m.Lock(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				l.res.mu.Lock()
				l.res.lockErrs++
				l.res.mu.Unlock()
				l.res.sample("lock", err)
			}
			continue
		}
		tok, valid := m.Token()
		l.res.granted(tok, l.res.now())
		if valid {
			l.res.enter(tok, sess.ID())
			l.res.write(ctx, tok)
			l.res.exit(tok)
			key := fmt.Sprintf("ack/%s/%d", lease, tok.Token)
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if _, err := cl.KV().Put(pctx, key, fmt.Sprint(id)); err == nil {
				l.acked.Store(key, fmt.Sprint(id))
				l.puts.Add(1)
			} else if ctx.Err() == nil {
				l.res.opFailed("put", err)
			}
			cancel()
		}
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := m.Unlock(uctx); err != nil && ctx.Err() == nil {
			l.res.opFailed("unlock", err)
		}
		cancel()
	}
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitProgress polls until the lockers have been granted more leases
// than n: the cluster serves again after a fault.
func (l *lockers) waitProgress(ctx context.Context, t *testing.T, more int) {
	t.Helper()
	from := l.res.grantCount()
	begin := time.Now()
	for l.res.grantCount() < from+more {
		select {
		case <-ctx.Done():
			t.Fatalf("lockers made %d grants in %v, expected: at least %d", l.res.grantCount()-from, time.Since(begin).Round(time.Millisecond), more)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkDurable reads every acknowledged key from each node's own state
// (a stale read, after the node has caught up) and reports those missing.
func (l *lockers) checkDurable(ctx context.Context, t *testing.T, c *proccluster.Cluster) {
	t.Helper()
	c.WaitCaughtUp(ctx)
	for _, n := range c.Nodes {
		cl, err := client.New(ctx, []string{n.Direct}, client.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		kvs, _, _, err := cl.KV().Range(ctx, "ack/", 0, client.Stale())
		cl.Close()
		if err != nil {
			t.Errorf("node %d: stale range of ack/: %v", n.Index, err)
			continue
		}
		have := map[string]string{}
		for _, kv := range kvs {
			have[kv.Key] = kv.Value
		}
		missing := 0
		l.acked.Range(func(k, v any) bool {
			if have[k.(string)] != v.(string) {
				if missing++; missing <= 5 {
					t.Errorf("node %d: acknowledged key %s: got = %q, expected: %q", n.Index, k, have[k.(string)], v)
				}
			}
			return true
		})
		if missing > 0 {
			t.Errorf("node %d: %d acknowledged keys missing", n.Index, missing)
		}
	}
}

// --- linearizability workers ---

// recorders run KV and lease calls against the cluster and record them
// in one history per model.
type recorders struct {
	kv, lease *linearizability.History
	wg        sync.WaitGroup
	unknown   atomic.Int64
}

// startRecorders runs kvWorkers on kvKeys keys (through the Go client,
// which follows the leader) and leaseWorkers on two leases (raw calls to
// a random node, which forwards them), each with its own long-lived
// session: the lease model has no expiry.
func startRecorders(ctx context.Context, t *testing.T, c *proccluster.Cluster, kvWorkers, kvKeys, leaseWorkers int) *recorders {
	r := &recorders{kv: linearizability.NewHistory(), lease: linearizability.NewHistory()}
	for i := range kvWorkers {
		cl := newClient(t, c, i%len(c.Nodes), client.WithRequestTimeout(3*time.Second))
		key := fmt.Sprintf("lin/%d", i%kvKeys)
		r.wg.Go(func() { r.runKV(ctx, cl, i, key) })
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(hc.CloseIdleConnections)
	var nodes []raw
	for _, n := range c.Nodes {
		url := "http://" + n.API
		nodes = append(nodes, raw{tenurev1connect.NewSessionServiceClient(hc, url), tenurev1connect.NewLeaseServiceClient(hc, url), n.Running})
	}
	for i := range leaseWorkers {
		lease := fmt.Sprintf("lin-%d", i%2)
		r.wg.Go(func() { r.runLease(ctx, nodes, kvWorkers+i, lease) })
	}
	return r
}

type raw struct {
	sessions tenurev1connect.SessionServiceClient
	leases   tenurev1connect.LeaseServiceClient
	// up, when set, says whether the node runs: its proxy accepts
	// connections even when it does not, and resets them, which would
	// make every call to a dead node one of unknown outcome and the
	// history needlessly hard to check.
	up func() bool
}

// pick returns a random node that runs.
func pick(nodes []raw) raw {
	for range 10 {
		n := nodes[rand.N(len(nodes))]
		if n.up == nil || n.up() {
			return n
		}
	}
	return nodes[rand.N(len(nodes))]
}

func (r *recorders) runKV(ctx context.Context, cl *client.Client, id int, key string) {
	last := ""
	for seq := 0; ctx.Err() == nil; seq++ {
		value := fmt.Sprintf("%d.%d", id, seq)
		switch rand.N(3) {
		case 0:
			done := r.kv.Call(id, linearizability.KVInput{Op: linearizability.Put, Key: key, Value: value})
			_, err := cl.KV().Put(ctx, key, value)
			r.kvDone(ctx, done, err, linearizability.KVOutput{})
		case 1:
			done := r.kv.Call(id, linearizability.KVInput{Op: linearizability.Get, Key: key})
			kv, err := cl.KV().Get(ctx, key)
			switch {
			case err == nil:
				last = kv.Value
				done(linearizability.KVOutput{Found: true, Value: kv.Value})
			case errors.Is(err, client.ErrNotFound):
				done(linearizability.KVOutput{})
			}
		case 2:
			done := r.kv.Call(id, linearizability.KVInput{Op: linearizability.CompareAndSwap, Key: key, Expect: last, Value: value})
			_, err := cl.KV().CompareAndSwap(ctx, key, client.ValueIs(last), value)
			var cf *client.CompareFailedError
			if errors.As(err, &cf) {
				last = cf.Current.Value
				done(linearizability.KVOutput{})
			} else {
				r.kvDone(ctx, done, err, linearizability.KVOutput{Swapped: true})
			}
		}
		pause(ctx, time.Duration(rand.N(10))*time.Millisecond)
	}
}

// kvDone records a write's outcome: ok, or unknown for any failure but
// one proving it was never applied (a write refused before it was sent
// returns ErrUnavailable). Calling something unknown that failed is safe:
// the model then lets it happen or not.
func (r *recorders) kvDone(ctx context.Context, done func(any), err error, ok linearizability.KVOutput) {
	switch {
	case err == nil:
		done(ok)
	case errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrUnknownOutcome) && ctx.Err() == nil:
		// Not sent: no effect, so not in the history.
	default:
		r.unknown.Add(1)
		done(linearizability.KVOutput{Unknown: true})
	}
}

func (r *recorders) runLease(ctx context.Context, nodes []raw, id int, lease string) {
	sess := r.openSession(ctx, nodes)
	if sess == 0 {
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = nodes[0].sessions.Close(cctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sess}))
	}()
	var token int64 // the last token this worker was granted
	for ctx.Err() == nil {
		n := pick(nodes)
		done := r.lease.Call(id, linearizability.LeaseInput{Op: linearizability.Acquire, Lease: lease, Session: sess})
		resp, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
			return n.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sess, Name: lease, Capacity: 1}))
		})
		granted := false
		switch {
		case err == nil:
			granted = resp.Msg.GetAcquired()
			out := linearizability.LeaseOutput{OK: granted}
			if granted {
				token = resp.Msg.GetToken()
				out.Token = token
			}
			done(out)
		case notSent(err):
		default:
			r.unknown.Add(1)
			done(linearizability.LeaseOutput{Unknown: true})
		}
		if token != 0 {
			r.validate(ctx, nodes, id, lease, token)
		}
		if granted {
			pause(ctx, time.Duration(rand.N(5))*time.Millisecond)
			n := pick(nodes)
			done := r.lease.Call(id, linearizability.LeaseInput{Op: linearizability.Release, Lease: lease, Token: token})
			_, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ReleaseResponse], error) {
				return n.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: lease, Token: token}))
			})
			switch {
			case err == nil:
				done(linearizability.LeaseOutput{OK: true})
			case reason(err) == api.ReasonNotHolder:
				done(linearizability.LeaseOutput{})
			case notSent(err):
			default:
				r.unknown.Add(1)
				done(linearizability.LeaseOutput{Unknown: true})
			}
		}
		pause(ctx, time.Duration(5+rand.N(20))*time.Millisecond)
	}
}

func (r *recorders) validate(ctx context.Context, nodes []raw, id int, lease string, token int64) {
	n := pick(nodes)
	done := r.lease.Call(id, linearizability.LeaseInput{Op: linearizability.Validate, Lease: lease, Token: token})
	resp, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ValidateResponse], error) {
		return n.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Name: lease, Token: token}))
	})
	if err == nil { // a failed read tells nothing
		done(linearizability.LeaseOutput{OK: resp.Msg.GetValid(), Token: resp.Msg.GetCurrentToken()})
	}
}

// openSession opens a session whose TTL outlasts the test, so that no
// expiry changes a lease behind the history's back.
func (r *recorders) openSession(ctx context.Context, nodes []raw) int64 {
	for ctx.Err() == nil {
		resp, err := callRaw(ctx, func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
			return nodes[rand.N(len(nodes))].sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "recorder", Ttl: durationpb.New(10 * time.Minute)}))
		})
		if err == nil {
			return resp.Msg.GetSession().GetId()
		}
		pause(ctx, 100*time.Millisecond)
	}
	return 0
}

func callRaw[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return fn(ctx)
}

func reason(err error) api.Reason {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return api.Reason(ce.Meta().Get(api.ErrorHeader))
	}
	return ""
}

// notSent reports whether err proves the call was never proposed.
func notSent(err error) bool { return reason(err).NotSent() }

// check runs porcupine on both histories. On a failure it keeps
// porcupine's visualization of each failing history in a directory it
// names.
func (r *recorders) check(t *testing.T) {
	t.Helper()
	dir, err := os.MkdirTemp("", "tenure-linearizability-")
	if err != nil {
		t.Fatal(err)
	}
	kv := linearizability.Check(linearizability.KVModel.ToModel(), r.kv.Operations(), time.Minute, filepath.Join(dir, "kv.html"))
	lease := linearizability.Check(linearizability.LeaseModel.ToModel(), r.lease.Operations(), time.Minute, filepath.Join(dir, "lease.html"))
	if kv != porcupine.Ok {
		t.Errorf("KV history of %d operations: got = %s, expected: Ok (see %s/kv.html)", r.kv.Len(), kv, dir)
	}
	if lease != porcupine.Ok {
		t.Errorf("lease history of %d operations: got = %s, expected: Ok (see %s/lease.html)", r.lease.Len(), lease, dir)
	}
	if kv == porcupine.Ok && lease == porcupine.Ok {
		os.RemoveAll(dir)
	}
	t.Logf("histories: %d KV and %d lease operations, %d of unknown outcome", r.kv.Len(), r.lease.Len(), r.unknown.Load())
}
