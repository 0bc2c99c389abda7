package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/internal/testnet"
)

// noQuota is a waiters' hold that never refuses, for tests of waiters
// alone.
func noQuota(context.Context) (func(), error) { return func() {}, nil }

// counts are the slots principal holds, and all the slots held.
func (s *slots) counts(principal string) (mine, all int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[principal], s.total
}

const quotaPolicy = `
principals:
  - name: team-a
    roles: [all]
    tokens: [{sha256: "%s"}]
    limits: {waits: 10, watches: 2}
  - name: team-b
    roles: [all]
    tokens: [{sha256: "%s"}]
roles:
  all:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write]
`

// quotaServer is a single node with quotaPolicy, taking bearer tokens
// over cleartext on 127.0.0.1.
type quotaServer struct {
	*Server
	url    string
	tokens map[string]string // by principal
}

func startQuotaServer(t *testing.T, limits Limits) *quotaServer {
	t.Helper()
	tokens := map[string]string{"team-a": auth.NewToken(), "team-b": auth.NewToken()}
	p, err := auth.Parse(fmt.Appendf(nil, quotaPolicy, auth.HashToken(tokens["team-a"]), auth.HashToken(tokens["team-b"])))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Open(Config{
		Listener: testnet.Listen(t),
		Auth:     &auth.Authenticator{Policy: auth.Static(p)},
		Limits:   limits,
		Logger:   slog.New(slog.DiscardHandler),
		Raft:     oneNodeRaft(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	qs := &quotaServer{Server: srv, url: "http://" + srv.Addr(), tokens: tokens}
	waitReady(t, qs.url)
	return qs
}

// quotaClients are the clients of one principal.
type quotaClients struct {
	sessions tenurev1connect.SessionServiceClient
	leases   tenurev1connect.LeaseServiceClient
	session  int64 // a session of the principal's, open for a minute
}

func (qs *quotaServer) as(t *testing.T, principal string) *quotaClients {
	t.Helper()
	hc := &http.Client{Transport: bearer{next: h2cClient(t).Transport, token: qs.tokens[principal]}}
	c := &quotaClients{
		sessions: tenurev1connect.NewSessionServiceClient(hc, qs.url),
		leases:   tenurev1connect.NewLeaseServiceClient(hc, qs.url),
	}
	open, err := c.sessions.Open(ctxT(t), connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	c.session = open.Msg.GetSession().GetId()
	return c
}

// bearer sends token with every request.
type bearer struct {
	next  http.RoundTripper
	token string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func (c *quotaClients) acquire(ctx context.Context, name string, wait bool) (*tenurev1.AcquireResponse, error) {
	resp, err := c.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: c.session, Namespace: "q", Name: name, Wait: wait}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// pipe opens the Go client's pipeline as principal.
func (qs *quotaServer) pipe(t *testing.T, principal string) *pipeT {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(qs.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: tenure\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n",
		framing.Path, qs.tokens[principal], framing.Protocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("pipeline upgrade as %s: got = %s, expected: 101 Switching Protocols", principal, resp.Status)
	}
	return &pipeT{upgradePipe: &upgradePipe{conn: conn, r: framing.NewReader(br, 1<<20), w: framing.NewWriter(conn)}, t: t}
}

func watchGrantReq(id uint64, ns, name string, token int64) *tenurev1.PipelineRequest {
	return &tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_WatchGrant{WatchGrant: &tenurev1.WatchGrantRequest{
		Namespace: ns, Name: name, Token: token, StartRevision: token + 1,
	}}}
}

// TestQuotaWaitsPerPrincipal: team-a (waits: 10) parks ten waiting
// Acquires; its eleventh, and a grant watch, are refused naming the
// limit, while team-b, without a limit of its own, still parks. When the
// waits end their slots come back, and team-a parks again.
func TestQuotaWaitsPerPrincipal(t *testing.T) {
	qs := startQuotaServer(t, testLimits())
	a, b := qs.as(t, "team-a"), qs.as(t, "team-b")
	ctx := ctxT(t)
	for i := range 12 {
		if _, err := b.acquire(ctx, fmt.Sprintf("held-%d", i), false); err != nil {
			t.Fatal(err)
		}
	}
	waits, cancel := context.WithCancel(ctx)
	defer cancel()
	ended := make(chan error, 10)
	for i := range 10 {
		go func() {
			_, err := a.acquire(waits, fmt.Sprintf("held-%d", i), true)
			ended <- err
		}()
	}
	waitFor(t, "team-a's 10 waits parked", func() bool { n, _ := qs.quota.waits.counts("team-a"); return n == 10 })

	_, err := a.acquire(ctx, "held-10", true)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "principal team-a has 10 parked waits, its limit (waits in the policy)") {
		t.Fatalf("team-a's 11th wait: got = %v, expected: resource_exhausted naming its limit of 10", err)
	}
	held, err := a.acquire(ctx, "mine", false)
	if err != nil {
		t.Fatal(err)
	}
	p := qs.pipe(t, "team-a")
	e := wantPipeError(t, p.roundTrip(watchGrantReq(1, "q", "mine", held.GetToken())), connect.CodeResourceExhausted, "")
	if !strings.Contains(e.GetMessage(), "principal team-a has 10 parked waits") {
		t.Fatalf("team-a's grant watch past its limit: got = %q, expected: the limit named", e.GetMessage())
	}

	// team-b is not held back by team-a's limit.
	bWait := make(chan error, 1)
	go func() {
		_, err := b.acquire(waits, "mine", true)
		bWait <- err
	}()
	waitFor(t, "team-b's wait parked", func() bool { n, _ := qs.quota.waits.counts("team-b"); return n == 1 })

	cancel()
	for range 10 {
		if err := <-ended; connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("a cancelled wait: got = %v, expected: canceled", err)
		}
	}
	if err := <-bWait; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("team-b's cancelled wait: got = %v, expected: canceled", err)
	}
	waitFor(t, "every slot given back", func() bool { _, all := qs.quota.waits.counts(""); return all == 0 })

	// The slots are back: team-a's grant watch parks now, and is
	// answered when it releases.
	p.write(watchGrantReq(2, "q", "mine", held.GetToken()))
	waitFor(t, "team-a's grant watch parked", func() bool { n, _ := qs.quota.waits.counts("team-a"); return n == 1 })
	if _, err := a.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: "q", Name: "mine", Token: held.GetToken()})); err != nil {
		t.Fatal(err)
	}
	if ev := p.read().GetWatchGrant().GetEvent(); ev.GetType() != tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED || ev.GetToken() != held.GetToken() {
		t.Fatalf("the grant watch after the release: got = %v, expected: the release of token %d", ev, held.GetToken())
	}
	waitFor(t, "the grant watch's slot given back", func() bool { _, all := qs.quota.waits.counts(""); return all == 0 })
}

// TestWatchGrantRefusesATokenThatIsNoGrant: a grant watch for a token
// that is not a grant of the lease is refused at once (not holder,
// naming lease and token) and parks nothing, whether the token is in the
// future or is an existing revision that granted nothing, or another
// lease's grant. The holder's own watch still parks, and a watch that
// arrives after its grant ended is answered with the end, as before.
func TestWatchGrantRefusesATokenThatIsNoGrant(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "holder", 30*time.Second)
	token := acquire(t, ts, s.Id, "job", false).Token
	other := acquire(t, ts, s.Id, "other", false).Token
	p := openPipe(t, ts)

	for _, c := range []struct {
		name  string
		token int64
	}{
		{"a token from the future", token + 1_000_000},
		{"the revision that opened the session", s.Id},
		{"another lease's grant", other},
	} {
		// A ping behind it, to tell a refusal from a wait.
		p.write(watchGrantReq(1, "", "job", c.token))
		p.write(&tenurev1.PipelineRequest{Id: 2, Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}})
		var refusal *tenurev1.PipelineResponse
		for range 2 {
			resp, err := p.readErr()
			if err != nil {
				t.Fatalf("%s: %v, expected: the watch answered (refused), and the pong", c.name, err)
			}
			if resp.GetId() == 1 {
				refusal = resp
			} else if resp.GetPong() == nil {
				t.Fatalf("%s: got = %v, expected: the pong", c.name, resp)
			}
		}
		if refusal == nil {
			t.Fatalf("%s: the pong twice, expected: the watch answered", c.name)
		}
		e := wantPipeError(t, refusal, connect.CodeFailedPrecondition, api.ReasonNotHolder)
		if want := fmt.Sprintf("token %d is not a grant of default/job", c.token); !strings.Contains(e.GetMessage(), want) {
			t.Fatalf("%s: got = %q, expected: a message containing %q", c.name, e.GetMessage(), want)
		}
		if _, all := ts.quota.waits.counts(""); all != 0 {
			t.Fatalf("%s: %d waits parked, expected: none", c.name, all)
		}
	}

	// The holder's watch parks, and the release answers it.
	p.write(watchGrantReq(3, "", "job", token))
	waitFor(t, "the holder's watch parked", func() bool { _, all := ts.quota.waits.counts(""); return all == 1 })
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: token})); err != nil {
		t.Fatal(err)
	}
	if resp := p.read(); resp.GetId() != 3 || resp.GetWatchGrant().GetEvent().GetType() != tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED {
		t.Fatalf("the holder's watch: got = %v, expected: answered with the release", resp)
	}
	// A watch that comes after the end, even one from "now on" (start
	// 0, as after a watch fell behind), is answered with it at once.
	for _, start := range []int64{token + 1, 0} {
		req := watchGrantReq(4, "", "job", token)
		req.GetWatchGrant().StartRevision = start
		resp := p.roundTrip(req)
		if ev := resp.GetWatchGrant().GetEvent(); ev.GetType() != tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED || ev.GetToken() != token {
			t.Fatalf("a watch from %d of a grant that ended: got = %v, expected: its release", start, resp)
		}
	}
}

// TestQuotaWatchesPerNode: past --max-watches, a streaming watch is
// refused resource_exhausted and an NDJSON watch 429, both naming the
// flag; once a watch ends its slot serves the next.
func TestQuotaWatchesPerNode(t *testing.T) {
	limits := testLimits()
	limits.MaxWatches = 2
	ts := startServer(t, t.TempDir(), limits)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	// Each watch starts at an event, so that it answers at once.
	s := openSession(t, ts, "holder", 30*time.Second)
	from := acquire(t, ts, s.Id, "job", false).Token
	if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "v"})); err != nil {
		t.Fatal(err)
	}
	first, err := ts.Leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{StartRevision: from}))
	if err := received(first, err); err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := ts.KV.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: "k", StartRevision: from}))
	if err := received(second, err); err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, all := ts.quota.watches.counts(""); all != 2 {
		t.Fatalf("with two watches open: got = %d counted, expected: 2", all)
	}

	third, err := ts.Leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{StartRevision: from}))
	if err = received(third, err); err == nil {
		third.Close()
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "this node has 2 open watches, its limit (--max-watches)") {
		t.Fatalf("a third streaming watch: got = %v, expected: resource_exhausted naming --max-watches", err)
	}
	status, body := ndjsonWatch(t, ctx, ts.URL, "")
	if status != http.StatusTooManyRequests || !strings.Contains(body, "its limit (--max-watches)") {
		t.Fatalf("a third NDJSON watch: got = %d %q, expected: 429 naming --max-watches", status, body)
	}

	first.Close()
	waitFor(t, "the closed watch's slot given back", func() bool { _, all := ts.quota.watches.counts(""); return all == 1 })
	if status, body := ndjsonWatch(t, ctx, ts.URL, ""); status != http.StatusOK {
		t.Fatalf("an NDJSON watch with a slot free: got = %d %q, expected: 200", status, body)
	}
}

// received receives a first message of a server stream and leaves it
// open; the caller closes it.
func received[M any](s *connect.ServerStreamForClient[M], err error) error {
	if err != nil {
		return err
	}
	if s.Receive() {
		return nil
	}
	if s.Err() != nil {
		return s.Err()
	}
	return io.ErrUnexpectedEOF
}

// ndjsonWatch opens /v1/watch/leases with bearer (none if ""), and
// returns its status, and the body when it is refused. An accepted watch
// is closed at once.
func ndjsonWatch(t *testing.T, ctx context.Context, url, bearer string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/watch/leases?namespace=q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := h2cClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestQuotaWatchesPerPrincipal: team-a (watches: 2) gets its third watch
// refused naming the policy limit, on either transport; team-b is not.
func TestQuotaWatchesPerPrincipal(t *testing.T) {
	qs := startQuotaServer(t, testLimits())
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	a := qs.as(t, "team-a")
	held, err := a.acquire(ctx, "job", false)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		st, err := a.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{Namespace: "q", StartRevision: held.GetToken()}))
		if err := received(st, err); err != nil {
			t.Fatal(err)
		}
		defer st.Close()
	}
	if n, _ := qs.quota.watches.counts("team-a"); n != 2 {
		t.Fatalf("with two watches open: got = %d counted for team-a, expected: 2", n)
	}
	status, body := ndjsonWatch(t, ctx, qs.url, qs.tokens["team-a"])
	if status != http.StatusTooManyRequests || !strings.Contains(body, "principal team-a has 2 open watches, its limit (watches in the policy)") {
		t.Fatalf("team-a's third watch: got = %d %q, expected: 429 naming its policy limit", status, body)
	}
	if status, body := ndjsonWatch(t, ctx, qs.url, qs.tokens["team-b"]); status != http.StatusOK {
		t.Fatalf("team-b's watch: got = %d %q, expected: 200", status, body)
	}
}

// TestQuotaRacingForTheLastSlots: callers racing for a node's last
// watch slots get exactly as many as are left, over HTTP.
func TestQuotaRacingForTheLastSlots(t *testing.T) {
	limits := testLimits()
	limits.MaxWatches = 5
	ts := startServer(t, t.TempDir(), limits)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	const racers = 24
	var wg sync.WaitGroup
	var accepted, refused atomic.Int32
	hc := h2cClient(t)
	bodies := make([]io.Closer, racers)
	errs := make(chan error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/v1/watch/leases", nil)
			resp, err := hc.Do(req)
			if err != nil {
				errs <- err
				return
			}
			switch resp.StatusCode {
			case http.StatusOK:
				accepted.Add(1)
				bodies[i] = resp.Body // held open
			case http.StatusTooManyRequests:
				refused.Add(1)
				resp.Body.Close()
			default:
				errs <- fmt.Errorf("status %s", resp.Status)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if accepted.Load() != 5 || refused.Load() != racers-5 {
		t.Fatalf("got = %d accepted, %d refused, expected: 5 and %d", accepted.Load(), refused.Load(), racers-5)
	}
	for _, b := range bodies {
		if b != nil {
			b.Close()
		}
	}
	waitFor(t, "every slot given back", func() bool { _, all := ts.quota.watches.counts(""); return all == 0 })
}

// TestSlotsNeverExceedTheirCaps: goroutines taking and giving back slots
// as fast as they can never hold more than either cap, and leave nothing
// counted behind.
func TestSlotsNeverExceedTheirCaps(t *testing.T) {
	const perPrincipal, perNode = 3, 5
	s := &newQuota().waits
	var inUse [2]atomic.Int32 // by principal
	var total atomic.Int32
	var over atomic.Value
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			who := g % 2
			for range 500 {
				release, err := s.take([]string{"p0", "p1"}[who], perPrincipal, perNode)
				if err != nil {
					if !errors.Is(err, frontend.ErrLimit) || connect.CodeOf(toConnect(err)) != connect.CodeResourceExhausted {
						over.Store(fmt.Sprintf("a refusal: got = %v, expected: frontend.ErrLimit, resource_exhausted", err))
					}
					continue
				}
				if n := inUse[who].Add(1); n > perPrincipal {
					over.Store(fmt.Sprintf("principal p%d held %d, over its cap of %d", who, n, perPrincipal))
				}
				if n := total.Add(1); n > perNode {
					over.Store(fmt.Sprintf("the node held %d, over its cap of %d", n, perNode))
				}
				total.Add(-1)
				inUse[who].Add(-1)
				release()
				release() // a second release gives back nothing
			}
		}()
	}
	wg.Wait()
	if msg := over.Load(); msg != nil {
		t.Fatal(msg)
	}
	if mine, all := s.counts("p0"); mine != 0 || all != 0 || len(s.held) != 0 {
		t.Fatalf("after every release: got = %d for p0, %d in all, %d principals, expected: 0, 0, 0", mine, all, len(s.held))
	}
}
