package client_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
)

// fakeServer is a scripted Tenure endpoint on 127.0.0.1: it upgrades
// POST /v1/pipeline as the server does and hands each upgraded
// connection to the test's script, which reads the client's frames and
// answers (or not) as the case needs. Unary services can be mounted on
// Mux. It records every upgrade request and every frame it read, so a
// test can count the attempts a call made.
type fakeServer struct {
	t    testing.TB
	ln   net.Listener
	srv  *http.Server
	Mux  *http.ServeMux
	done chan struct{} // closed when the test ends: scripts stop waiting

	// refuse, when set, answers an upgrade request instead of upgrading
	// it (and reports true), as a follower or an old server would.
	refuse func(w http.ResponseWriter, r *http.Request) bool
	// script serves the n-th upgraded connection (from 0). The
	// connection is closed when it returns.
	script func(n int, c *fakeConn)

	wg sync.WaitGroup // the handlers serving upgraded connections

	mu       sync.Mutex // guards the fields below
	upgrades int        // requests to the pipeline path
	pipes    int        // upgraded connections
	conns    []net.Conn
	frames   []fakeFrame
}

// fakeFrame is a request frame the fake read, and on which of its
// upgraded connections.
type fakeFrame struct {
	conn int
	req  *tenurev1.PipelineRequest
}

// startFake starts a fake endpoint that serves upgraded connections with
// script. It is closed when the test ends, after the clients created
// later in the test (cleanups run last first).
func startFake(t testing.TB, script func(n int, c *fakeConn)) *fakeServer {
	t.Helper()
	f := &fakeServer{t: t, ln: listen(t), Mux: http.NewServeMux(), done: make(chan struct{}), script: script}
	f.Mux.HandleFunc(framing.Path, f.servePipeline)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // the client's heartbeat stream
	f.srv = &http.Server{Handler: f.Mux, Protocols: &protocols, ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- f.srv.Serve(f.ln) }()
	t.Cleanup(func() {
		close(f.done)
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.srv.Close()
		f.wg.Wait()
		if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("fake server: %v", err)
		}
	})
	return f
}

// listen binds 127.0.0.1 on a port the kernel chose, never another
// interface: internal/testnet.Listen, which this module cannot import
// without taking the server's module into its graph.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on 127.0.0.1: %v", err)
	}
	return ln
}

// Addr is the fake's endpoint, "127.0.0.1:port".
func (f *fakeServer) Addr() string { return f.ln.Addr().String() }

func (f *fakeServer) servePipeline(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.upgrades++
	f.mu.Unlock()
	if f.refuse != nil && f.refuse(w, r) {
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Upgrade") != framing.Protocol {
		f.t.Errorf("fake: pipeline request %s with Upgrade %q", r.Method, r.Header.Get("Upgrade"))
		http.Error(w, "bad upgrade", http.StatusBadRequest)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		f.t.Errorf("fake: hijack: %v", err)
		return
	}
	f.mu.Lock()
	select {
	case <-f.done:
		f.mu.Unlock()
		conn.Close()
		return
	default:
	}
	n := f.pipes
	f.pipes++
	f.conns = append(f.conns, conn)
	f.wg.Add(1)
	f.mu.Unlock()
	defer f.wg.Done()
	defer conn.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+framing.Protocol+"\r\n\r\n"); err != nil {
		f.t.Errorf("fake: write 101: %v", err)
		return
	}
	f.script(n, &fakeConn{f: f, n: n, conn: conn, br: brw.Reader, r: framing.NewReader(brw.Reader, 256<<20), w: framing.NewWriter(conn)})
}

// Upgrades is how many upgrade requests the fake received, Pipes how
// many it upgraded.
func (f *fakeServer) Upgrades() int { f.mu.Lock(); defer f.mu.Unlock(); return f.upgrades }
func (f *fakeServer) Pipes() int    { f.mu.Lock(); defer f.mu.Unlock(); return f.pipes }

// Count is how many frames the fake read that match.
func (f *fakeServer) Count(match func(*tenurev1.PipelineRequest) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fr := range f.frames {
		if match(fr.req) {
			n++
		}
	}
	return n
}

func isCAS(r *tenurev1.PipelineRequest) bool     { return r.GetCompareAndSwap() != nil }
func isPut(r *tenurev1.PipelineRequest) bool     { return r.GetPut() != nil }
func isGet(r *tenurev1.PipelineRequest) bool     { return r.GetGet() != nil }
func isDelete(r *tenurev1.PipelineRequest) bool  { return r.GetDelete() != nil }
func isPing(r *tenurev1.PipelineRequest) bool    { return r.GetPing() != nil }
func isAcquire(r *tenurev1.PipelineRequest) bool { return r.GetAcquire() != nil }

// fakeConn is one upgraded connection, seen from the fake's script.
type fakeConn struct {
	f    *fakeServer
	n    int
	conn net.Conn
	br   *bufio.Reader
	r    *framing.Reader
	w    *framing.Writer
}

// Next reads the next request frame; nil when the connection ended (the
// client closed it, or the test ended).
//
// Heartbeats (Refresh) are answered as a server would and skipped: a
// client's sessions send them on the pipeline whenever they please.
func (c *fakeConn) Next() *tenurev1.PipelineRequest {
	var req *tenurev1.PipelineRequest
	for {
		frame, err := c.r.Next()
		if err != nil {
			return nil
		}
		req = &tenurev1.PipelineRequest{}
		if err := proto.Unmarshal(frame, req); err != nil {
			c.f.t.Errorf("fake: decode frame: %v", err)
			return nil
		}
		hb := req.GetRefresh()
		if hb == nil {
			break
		}
		c.Send(&tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Refresh{
			Refresh: &tenurev1.KeepAliveResponse{SessionId: hb.GetSessionId(), Ttl: durationpb.New(time.Minute)},
		}})
	}
	c.f.mu.Lock()
	c.f.frames = append(c.f.frames, fakeFrame{conn: c.n, req: req})
	c.f.mu.Unlock()
	return req
}

// Expect reads the next frame and reports it as a test error unless
// match holds.
func (c *fakeConn) Expect(what string, match func(*tenurev1.PipelineRequest) bool) *tenurev1.PipelineRequest {
	req := c.Next()
	if req == nil || !match(req) {
		c.f.t.Errorf("fake connection %d: got frame %v, expected: %s", c.n, req, what)
		return nil
	}
	return req
}

// Send writes an answer.
func (c *fakeConn) Send(resp *tenurev1.PipelineResponse) {
	if _, err := c.w.Append(resp); err != nil {
		c.f.t.Errorf("fake: encode answer: %v", err)
		return
	}
	_ = c.w.Flush()
}

// Wait returns after d, or false at once if the test has ended.
func (c *fakeConn) Wait(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-c.f.done:
		return false
	}
}

// Hold reads (and records) whatever else the client sends until the
// connection ends: the client closes it, or the test ends.
func (c *fakeConn) Hold() {
	for {
		frame, err := c.r.Next()
		if err != nil {
			return
		}
		req := &tenurev1.PipelineRequest{}
		if proto.Unmarshal(frame, req) == nil {
			c.f.mu.Lock()
			c.f.frames = append(c.f.frames, fakeFrame{conn: c.n, req: req})
			c.f.mu.Unlock()
		}
	}
}

// casAnswer is a successful compare-and-swap's answer to req.
func casAnswer(req *tenurev1.PipelineRequest, rev int64) *tenurev1.PipelineResponse {
	cas := req.GetCompareAndSwap()
	return &tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_CompareAndSwap{
		CompareAndSwap: &tenurev1.CompareAndSwapResponse{Revision: rev, Kv: &tenurev1.KeyValue{
			Key: cas.GetKey(), Value: cas.GetValue(), CreateRevision: rev, ModRevision: rev, Version: 1,
		}},
	}}
}

// getAnswer answers a Get with value.
func getAnswer(req *tenurev1.PipelineRequest, value string, rev int64) *tenurev1.PipelineResponse {
	return &tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Get{
		Get: &tenurev1.GetResponse{Revision: rev, Kv: &tenurev1.KeyValue{Key: req.GetGet().GetKey(), Value: value, CreateRevision: rev, ModRevision: rev, Version: 1}},
	}}
}

// answer answers any key operation with a plausible success.
func answer(req *tenurev1.PipelineRequest) *tenurev1.PipelineResponse {
	switch {
	case isCAS(req):
		return casAnswer(req, 10)
	case isGet(req):
		return getAnswer(req, "v", 10)
	case isPut(req):
		return &tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Put{Put: &tenurev1.PutResponse{Revision: 10}}}
	case isDelete(req):
		return &tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Delete{Delete: &tenurev1.DeleteResponse{Deleted: 1, Revision: 10}}}
	}
	return &tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Error{Error: &tenurev1.PipelineError{
		Code: int32(connect.CodeUnimplemented), Message: "the fake does not answer this",
	}}}
}

// newFakeClient is a client of the given endpoints that tries a call 3
// times, 10ms apart: what the pipeline tests count attempts against.
func newFakeClient(t testing.TB, endpoints []string, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{
		client.WithRetry(3, 10*time.Millisecond),
		client.WithLogger(slog.New(slog.DiscardHandler)),
	}, opts...)
	c, err := client.New(context.Background(), endpoints, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeKV serves the unary KV calls a pipeline-less endpoint gets.
type fakeKV struct {
	tenurev1connect.UnimplementedKVServiceHandler
	leader string // when set, named in every answer's leader header

	mu    sync.Mutex
	calls map[string]int // by method
}

func (k *fakeKV) count(method string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls[method]
}

func (k *fakeKV) called(method string, h http.Header) {
	k.mu.Lock()
	if k.calls == nil {
		k.calls = map[string]int{}
	}
	k.calls[method]++
	k.mu.Unlock()
	if k.leader != "" {
		h.Set("Tenure-Leader", k.leader)
	}
}

func (k *fakeKV) Get(_ context.Context, req *connect.Request[tenurev1.GetRequest]) (*connect.Response[tenurev1.GetResponse], error) {
	resp := connect.NewResponse(&tenurev1.GetResponse{Revision: 3, Kv: &tenurev1.KeyValue{Key: req.Msg.GetKey(), Value: "unary", ModRevision: 3}})
	k.called("Get", resp.Header())
	return resp, nil
}

func (k *fakeKV) Put(_ context.Context, req *connect.Request[tenurev1.PutRequest]) (*connect.Response[tenurev1.PutResponse], error) {
	resp := connect.NewResponse(&tenurev1.PutResponse{Revision: 4})
	k.called("Put", resp.Header())
	return resp, nil
}

func (k *fakeKV) CompareAndSwap(_ context.Context, req *connect.Request[tenurev1.CompareAndSwapRequest]) (*connect.Response[tenurev1.CompareAndSwapResponse], error) {
	resp := connect.NewResponse(&tenurev1.CompareAndSwapResponse{Revision: 5, Kv: &tenurev1.KeyValue{Key: req.Msg.GetKey(), Value: req.Msg.GetValue(), ModRevision: 5}})
	k.called("CompareAndSwap", resp.Header())
	return resp, nil
}

// mountKV serves k's unary KV calls on f.
func (f *fakeServer) mountKV(k *fakeKV) {
	path, h := tenurev1connect.NewKVServiceHandler(k)
	f.Mux.Handle(path, h)
}

// fakeSessions opens sessions and acknowledges their heartbeats.
type fakeSessions struct {
	tenurev1connect.UnimplementedSessionServiceHandler
}

func (fakeSessions) Open(_ context.Context, req *connect.Request[tenurev1.OpenSessionRequest]) (*connect.Response[tenurev1.OpenSessionResponse], error) {
	return connect.NewResponse(&tenurev1.OpenSessionResponse{Session: &tenurev1.Session{
		Id: 42, Identity: req.Msg.GetIdentity(), Ttl: req.Msg.GetTtl(),
	}}), nil
}

func (fakeSessions) KeepAlive(_ context.Context, st *connect.BidiStream[tenurev1.KeepAliveRequest, tenurev1.KeepAliveResponse]) error {
	for {
		req, err := st.Receive()
		if err != nil {
			return nil
		}
		if err := st.Send(&tenurev1.KeepAliveResponse{SessionId: req.GetSessionId(), Ttl: durationpb.New(10 * time.Second)}); err != nil {
			return nil
		}
	}
}

func (fakeSessions) Close(context.Context, *connect.Request[tenurev1.CloseSessionRequest]) (*connect.Response[tenurev1.CloseSessionResponse], error) {
	return connect.NewResponse(&tenurev1.CloseSessionResponse{}), nil
}

// mountSessions serves sessions on f.
func (f *fakeServer) mountSessions() {
	path, h := tenurev1connect.NewSessionServiceHandler(fakeSessions{})
	f.Mux.Handle(path, h)
}
