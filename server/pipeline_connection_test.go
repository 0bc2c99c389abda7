package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/nativeapi"
)

// TestPipelineFrameOverTheLimitEndsOnlyThatConnection: a frame longer
// than MaxRequestBytes is refused from its length, with an error answer;
// the stream cannot be resynchronised, so the connection ends. Others
// are unaffected.
func TestPipelineFrameOverTheLimitEndsOnlyThatConnection(t *testing.T) {
	limits := testLimits()
	limits.MaxRequestBytes = 4096
	ts := startServer(t, t.TempDir(), limits)
	bystander := openPipe(t, ts)
	bystander.pingPong(1)

	p := openPipe(t, ts)
	// A frame of exactly the limit is taken.
	atLimit := &tenurev1.PipelineRequest{Id: 5, Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: "k", Value: strings.Repeat("x", 4096)}}}
	for proto.Size(atLimit) > limits.MaxRequestBytes {
		v := atLimit.GetPut().GetValue()
		atLimit.GetPut().Value = v[:len(v)-1]
	}
	if proto.Size(atLimit) != limits.MaxRequestBytes {
		t.Fatalf("test setup: a %d-byte request, expected: %d", proto.Size(atLimit), limits.MaxRequestBytes)
	}
	if resp := p.roundTrip(atLimit); resp.GetPut() == nil {
		t.Fatalf("a frame of exactly the limit: got = %v, expected: a put result", resp)
	}
	// Only the length of the one over the limit is sent: the server
	// must refuse it from the length alone, and a body left unread would
	// turn the server's close into a reset that could overtake the answer.
	if _, err := p.conn.Write(binary.AppendUvarint(nil, uint64(limits.MaxRequestBytes+1))); err != nil {
		t.Fatal(err)
	}
	resp := p.read()
	e := wantPipeError(t, resp, connect.CodeInvalidArgument, api.ReasonInvalidArgument)
	if resp.GetId() != 0 || !strings.Contains(e.GetMessage(), "too large") || !strings.Contains(e.GetMessage(), "4096") {
		t.Fatalf("answer to a frame over the limit: got = %v, expected: id 0, a message naming the limit", resp)
	}
	if resp, err := p.readErr(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the error answer: got = %v, %v, expected: the connection closed (io.EOF)", resp, err)
	}

	bystander.pingPong(2)
	openPipe(t, ts).pingPong(3)
}

// TestPipelineUndecodableFrameEndsTheConnection: a frame that is not a
// PipelineRequest leaves the stream in doubt: answered with an error,
// then closed.
func TestPipelineUndecodableFrameEndsTheConnection(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	p := openPipe(t, ts)
	p.pingPong(1)
	// One byte, 0xff: a field tag whose varint never ends.
	if _, err := p.conn.Write([]byte{1, 0xff}); err != nil {
		t.Fatal(err)
	}
	resp := p.read()
	wantPipeError(t, resp, connect.CodeInvalidArgument, api.ReasonInvalidArgument)
	if resp.GetId() != 0 {
		t.Fatalf("answer to an undecodable frame: got = id %d, expected: 0, no request ID being known", resp.GetId())
	}
	if resp, err := p.readErr(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the error answer: got = %v, %v, expected: the connection closed (io.EOF)", resp, err)
	}
	openPipe(t, ts).pingPong(2)
}

func TestPipelineUpgradeIsRefusedWithoutTheProtocol(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	cases := []struct {
		name, method string
		header       map[string]string
		want         []int
	}{
		{"no Upgrade header", http.MethodPost, nil, []int{http.StatusUpgradeRequired}},
		{"another protocol", http.MethodPost, map[string]string{"Connection": "Upgrade", "Upgrade": "websocket"}, []int{http.StatusUpgradeRequired}},
		{"GET", http.MethodGet, map[string]string{"Connection": "Upgrade", "Upgrade": framing.Protocol}, []int{http.StatusMethodNotAllowed, http.StatusNotFound}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctxT(t), c.method, ts.URL+framing.Path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			ok := false
			for _, w := range c.want {
				ok = ok || resp.StatusCode == w
			}
			if !ok {
				t.Fatalf("got = %s, expected: one of %v", resp.Status, c.want)
			}
		})
	}
}

// TestPipelineGoAwayOnClose: a closing server answers every request it
// read, then says GoAway naming the last one, then closes: a client
// knows that nothing it sent after that ID was taken.
func TestPipelineGoAwayOnClose(t *testing.T) {
	t.Parallel()
	ts := startServer(t, t.TempDir(), testLimits())
	holder := openSession(t, ts, "holder", 30*time.Second)
	waiter := openSession(t, ts, "waiter", 30*time.Second)
	first := acquire(t, ts, holder.Id, "job", false)
	p := openPipe(t, ts)
	p.write(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: waiter.Id, Name: "job", Wait: true}}})
	p.write(&tenurev1.PipelineRequest{Id: 2, Op: &tenurev1.PipelineRequest_WatchGrant{WatchGrant: &tenurev1.WatchGrantRequest{Name: "job", Token: first.Token, StartRevision: first.Token + 1}}})
	waitForWaiters(t, ts, "job", 1)
	// The pong shows the server read everything up to ID 3.
	p.pingPong(3)

	closed := make(chan error, 1)
	go func() { closed <- ts.Close() }()
	answered := map[uint64]bool{}
	for len(answered) < 2 {
		resp := p.read()
		if resp.GetGoAway() != nil {
			t.Fatalf("got = %v, expected: requests 1 and 2 answered before GoAway (answered: %v)", resp, answered)
		}
		if answered[resp.GetId()] || (resp.GetId() != 1 && resp.GetId() != 2) {
			t.Fatalf("got = %v, expected: one answer each to requests 1 and 2", resp)
		}
		answered[resp.GetId()] = true
		wantPipeError(t, resp, connect.CodeUnavailable, api.ReasonShuttingDown)
	}
	wantGoAwayThenClosed(t, p, 3, closed)
}

// TestPipelineStreamOverH2C: the connect bidirectional form carries the
// same operations for clients that cannot upgrade a connection; answers
// are matched to requests by ID, and a client that closes its side gets
// the answers to what it sent, then the end of the stream.
func TestPipelineStreamOverH2C(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	const clients, pairs = 8, 10
	sids := make([]int64, clients)
	for i := range sids {
		sids[i] = openSession(t, ts, fmt.Sprintf("c-%d", i), 30*time.Second).Id
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := tenurev1connect.NewSessionServiceClient(h2cClient(t), ts.URL).Pipeline(ctx)
	m := newPipeMux(stream.Send)
	ended := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Receive()
			if err != nil {
				ended <- err
				return
			}
			m.deliver(resp)
		}
	}()
	// A failing test still ends the stream: the transport does not see
	// ctx end while the request body is idle, but it does see the
	// body's end, and the server then ends its side.
	requestClosed := false
	defer func() {
		if !requestClosed {
			_ = stream.CloseRequest()
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				// The server's close, in a cleanup, ends it then.
			}
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range pairs {
				// pipedPair fails if an answer of the wrong kind comes
				// back: a release's answer has no grant.
				if err := pipedPair(ctx, m, sids[i], fmt.Sprintf("lease-%d", i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Sent, then the client closes its side: still answered, and then
	// the stream ends cleanly.
	const lastID = 1 << 50
	last := make(chan *tenurev1.PipelineResponse, 1)
	m.mu.Lock()
	m.waiting[lastID] = last
	m.mu.Unlock()
	if err := stream.Send(&tenurev1.PipelineRequest{Id: lastID, Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: "last", Value: "v"}}}); err != nil {
		t.Fatal(err)
	}
	requestClosed = true
	if err := stream.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream did not end after CloseRequest")
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("end of the stream: got = %v, expected: io.EOF", err)
	}
	select {
	case resp := <-last:
		if resp.GetPut().GetRevision() <= 0 {
			t.Fatalf("answer to the request sent just before CloseRequest: got = %v, expected: a put result", resp)
		}
	default:
		t.Fatal("the stream ended without answering the request sent just before CloseRequest")
	}
	if err := stream.CloseResponse(); err != nil {
		t.Fatal(err)
	}
}

// TestPipelineWaitsDoNotStopTheReader: waits take no slot, so a
// connection with more grant watches in flight than nativeapi.MaxPipelined still
// reads and answers what follows (a reader that stopped for them would
// never read the release that ends them). Past nativeapi.MaxParked a new wait is
// refused, naming the limit. Close then answers every watch, says
// GoAway naming the last request read, and returns.
func TestPipelineWaitsDoNotStopTheReader(t *testing.T) {
	defer func(old int64) { nativeapi.MaxParked = old }(nativeapi.MaxParked)
	nativeapi.MaxParked = nativeapi.MaxPipelined + 2
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "holder", 30*time.Second)
	token := acquire(t, ts, s.Id, "job", false).Token
	p := openPipe(t, ts)
	watch := func(id uint64) *tenurev1.PipelineRequest {
		return &tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_WatchGrant{WatchGrant: &tenurev1.WatchGrantRequest{Name: "job", Token: token, StartRevision: token + 1}}}
	}
	const watches = nativeapi.MaxPipelined + 2
	for id := uint64(1); id <= watches; id++ {
		if err := p.appendOnly(watch(id)); err != nil {
			t.Fatal(err)
		}
	}
	// One wait too many is refused at once.
	p.write(watch(watches + 1))
	wantPipeError(t, p.read(), connect.CodeResourceExhausted, "")
	// A request behind them all is read and answered.
	const get = watches + 2
	p.write(&tenurev1.PipelineRequest{Id: get, Op: &tenurev1.PipelineRequest_Get{Get: &tenurev1.GetRequest{Key: "k"}}})
	if resp := p.read(); resp.GetId() != get {
		t.Fatalf("behind %d watches: got = %v, expected: the answer to request %d", watches, resp, get)
	}

	closed := make(chan error, 1)
	go func() { closed <- ts.Close() }()
	answered := map[uint64]bool{}
	for len(answered) < watches {
		resp := p.read()
		id := resp.GetId()
		if resp.GetGoAway() != nil || answered[id] || id == 0 || id > watches {
			t.Fatalf("got = %v after %d answers, expected: one answer to each watch before GoAway", resp, len(answered))
		}
		answered[id] = true
		wantPipeError(t, resp, connect.CodeUnavailable, api.ReasonShuttingDown)
	}
	wantGoAwayThenClosed(t, p, get, closed)
}

// wantGoAwayThenClosed checks the end of a pipeline whose server is
// closing: GoAway naming lastID, then nothing but the end of the
// connection, and Close (whose result closed carries) returns.
func wantGoAwayThenClosed(t *testing.T, p *pipeT, lastID uint64, closed <-chan error) {
	t.Helper()
	resp := p.read()
	if resp.GetGoAway() == nil || resp.GetGoAway().GetLastId() != lastID || resp.GetId() != 0 {
		t.Fatalf("after the answers: got = %v, expected: GoAway with last_id %d", resp, lastID)
	}
	if resp, err := p.readErr(); !errors.Is(err, io.EOF) {
		t.Fatalf("after GoAway: got = %v, %v, expected: nothing, the connection closed (io.EOF)", resp, err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return")
	}
}
