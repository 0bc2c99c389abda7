package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// The transports compared for the pipelined operation stream (issue 10;
// docs/benchmarks.md has the figures). The same Acquire+Release pairs go
// over: unary connect calls on pooled HTTP/1.1 connections (the Go
// client before pipelines), SessionService.Pipeline as a connect
// bidirectional stream over cleartext HTTP/2, and the upgraded HTTP/1.1
// connection with length-prefixed frames (package framing). Pipelined
// clients share a connection the way a process's goroutines share a
// Client: 64 goroutines over 4 connections.
//
//	go test -run '^$' -bench Transports -benchtime 3s ./server

func BenchmarkTransports(b *testing.B) {
	transports := []struct {
		name string
		dial func(b *testing.B, ts *testServer) leaseCaller
	}{
		{"unary-http1", dialUnary},
		{"stream-h2", dialH2Stream},
		{"upgrade-framed", dialUpgrade},
	}
	for _, tr := range transports {
		b.Run(tr.name+"/1-client", func(b *testing.B) {
			ts := benchServer(b)
			c := tr.dial(b, ts)
			sid := benchSession(b, newBenchClient(b, ts), "one")
			ctx := context.Background()
			b.ResetTimer()
			cpu := processCPU()
			for range b.N {
				if err := pipedPair(ctx, c, sid, "one"); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b, "pairs/s", cpu)
		})
		b.Run(tr.name+"/64-clients-4-conns", func(b *testing.B) {
			const clients, conns = 64, 4
			ts := benchServer(b)
			callers := make([]leaseCaller, conns)
			for i := range callers {
				callers[i] = tr.dial(b, ts)
			}
			opener := newBenchClient(b, ts)
			sids := make([]int64, clients)
			for i := range sids {
				sids[i] = benchSession(b, opener, fmt.Sprintf("c-%d", i))
			}
			b.ResetTimer()
			cpu := processCPU()
			runClients(b, clients, func(ctx context.Context, i int) error {
				return pipedPair(ctx, callers[i%conns], sids[i], fmt.Sprintf("lease-%d", i))
			})
			reportRate(b, "pairs/s", cpu)
		})
	}
}

// leaseCaller is the part of the lease API the comparison needs.
type leaseCaller interface {
	acquire(ctx context.Context, req *tenurev1.AcquireRequest) (*tenurev1.AcquireResponse, error)
	release(ctx context.Context, req *tenurev1.ReleaseRequest) error
}

func pipedPair(ctx context.Context, c leaseCaller, sid int64, name string) error {
	got, err := c.acquire(ctx, &tenurev1.AcquireRequest{SessionId: sid, Name: name})
	if err != nil {
		return fmt.Errorf("acquire %s: %w", name, err)
	}
	if !got.GetAcquired() {
		return fmt.Errorf("acquire %s: got = not acquired, expected: acquired", name)
	}
	if err := c.release(ctx, &tenurev1.ReleaseRequest{Name: name, Token: got.GetToken()}); err != nil {
		return fmt.Errorf("release %s: %w", name, err)
	}
	return nil
}

type unaryCaller struct {
	leases tenurev1connect.LeaseServiceClient
}

func dialUnary(b *testing.B, ts *testServer) leaseCaller {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	b.Cleanup(tr.CloseIdleConnections)
	return unaryCaller{tenurev1connect.NewLeaseServiceClient(&http.Client{Transport: tr}, ts.URL)}
}

func (u unaryCaller) acquire(ctx context.Context, req *tenurev1.AcquireRequest) (*tenurev1.AcquireResponse, error) {
	resp, err := u.leases.Acquire(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (u unaryCaller) release(ctx context.Context, req *tenurev1.ReleaseRequest) error {
	_, err := u.leases.Release(ctx, connect.NewRequest(req))
	return err
}

// pipeMux matches answers to requests on one pipelined stream.
type pipeMux struct {
	send  func(*tenurev1.PipelineRequest) error // serialised by mu
	flush func() error                          // after send, outside mu; may be nil

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan *tenurev1.PipelineResponse
}

func newPipeMux(send func(*tenurev1.PipelineRequest) error) *pipeMux {
	return &pipeMux{send: send, waiting: map[uint64]chan *tenurev1.PipelineResponse{}}
}

// call sends req and waits for its answer, or for ctx: a stream that
// never answers (its transport may not notice ctx) must not hang a test.
func (m *pipeMux) call(ctx context.Context, req *tenurev1.PipelineRequest) (*tenurev1.PipelineResponse, error) {
	ch := make(chan *tenurev1.PipelineResponse, 1)
	m.mu.Lock()
	m.next++
	req.Id = m.next
	m.waiting[req.Id] = ch
	err := m.send(req)
	m.mu.Unlock()
	if err == nil && m.flush != nil {
		err = m.flush()
	}
	if err != nil {
		return nil, err
	}
	var resp *tenurev1.PipelineResponse
	var ok bool
	select {
	case resp, ok = <-ch:
	case <-ctx.Done():
		m.mu.Lock()
		delete(m.waiting, req.Id)
		m.mu.Unlock()
		return nil, fmt.Errorf("no answer to request %d: %w", req.Id, ctx.Err())
	}
	if !ok {
		return nil, fmt.Errorf("stream ended")
	}
	if e := resp.GetError(); e != nil {
		return nil, fmt.Errorf("%s (%s)", e.GetMessage(), e.GetReason())
	}
	return resp, nil
}

func (m *pipeMux) deliver(resp *tenurev1.PipelineResponse) {
	m.mu.Lock()
	ch := m.waiting[resp.GetId()]
	delete(m.waiting, resp.GetId())
	m.mu.Unlock()
	if ch != nil {
		ch <- resp
	}
}

func (m *pipeMux) acquire(ctx context.Context, req *tenurev1.AcquireRequest) (*tenurev1.AcquireResponse, error) {
	resp, err := m.call(ctx, &tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Acquire{Acquire: req}})
	return resp.GetAcquire(), err
}

func (m *pipeMux) release(ctx context.Context, req *tenurev1.ReleaseRequest) error {
	_, err := m.call(ctx, &tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Release{Release: req}})
	return err
}

func dialH2Stream(b *testing.B, ts *testServer) leaseCaller {
	ctx, cancel := context.WithCancel(context.Background())
	stream := tenurev1connect.NewSessionServiceClient(h2cClient(b), ts.URL).Pipeline(ctx)
	m := newPipeMux(stream.Send)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Receive()
			if err != nil {
				return
			}
			m.deliver(resp)
		}
	}()
	b.Cleanup(func() {
		_ = stream.CloseRequest()
		cancel()
		<-done
	})
	return m
}

// upgradePipe is a hand-made client of the upgraded connection.
type upgradePipe struct {
	conn net.Conn
	r    *framing.Reader
	w    *framing.Writer
}

// dialPipeline upgrades a connection to ts by hand, as the Go client
// does through net/http, and checks the server's answer.
func dialPipeline(t testing.TB, ts *testServer) *upgradePipe {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: tenure\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", framing.Path, framing.Protocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != framing.Protocol {
		t.Fatalf("got = %s (Upgrade %q), expected: 101 Switching Protocols to %s", resp.Status, resp.Header.Get("Upgrade"), framing.Protocol)
	}
	return &upgradePipe{conn: conn, r: framing.NewReader(br, 1<<20), w: framing.NewWriter(conn)}
}

func (p *upgradePipe) send(req *tenurev1.PipelineRequest) error {
	if _, err := p.w.Append(req); err != nil {
		return err
	}
	return p.w.Flush()
}

func (p *upgradePipe) appendOnly(req *tenurev1.PipelineRequest) error {
	_, err := p.w.Append(req)
	return err
}

func (p *upgradePipe) receive() (*tenurev1.PipelineResponse, error) {
	frame, err := p.r.Next()
	if err != nil {
		return nil, err
	}
	resp := &tenurev1.PipelineResponse{}
	return resp, proto.Unmarshal(frame, resp)
}

func dialUpgrade(b *testing.B, ts *testServer) leaseCaller {
	p := dialPipeline(b, ts)
	m := newPipeMux(p.appendOnly)
	m.flush = p.w.Flush
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := p.receive()
			if err != nil {
				return
			}
			m.deliver(resp)
		}
	}()
	b.Cleanup(func() {
		p.conn.Close()
		<-done
	})
	return m
}
