package server

// Benchmarks of the public API end to end: connect clients over cleartext
// HTTP/2 on 127.0.0.1, a single node with its raft-wal log fsynced in
// b.TempDir(). Each reports its own throughput; docs/benchmarks.md has
// the figures and the command that produced them.
//
//	go test -run '^$' -bench . -benchtime 3s ./server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// benchTTL outlives any benchmark, so no session expires mid-run and the
// heartbeats measured are pure renewals.
const benchTTL = time.Hour

func benchServer(b *testing.B) *testServer {
	b.Helper()
	l := testLimits()
	l.MaxSessionsPerIdentity = 0 // identities are unique anyway; no bound to trip on
	return startServer(b, b.TempDir(), l)
}

// benchClient is one client process's view, with its own connections as
// separate clients would have, and the transports the Go client uses:
// HTTP/1.1 for unary calls, cleartext HTTP/2 for the KeepAlive stream.
type benchClient struct {
	Sessions tenurev1connect.SessionServiceClient
	Leases   tenurev1connect.LeaseServiceClient
}

func newBenchClient(b *testing.B, ts *testServer) benchClient {
	h1 := &http.Transport{MaxIdleConnsPerHost: 64}
	b.Cleanup(h1.CloseIdleConnections)
	h2 := h2cClient(b)
	return benchClient{
		Sessions: splitSessions{
			SessionServiceClient: tenurev1connect.NewSessionServiceClient(&http.Client{Transport: h1}, ts.URL),
			keepAlive:            tenurev1connect.NewSessionServiceClient(h2, ts.URL),
		},
		Leases: tenurev1connect.NewLeaseServiceClient(&http.Client{Transport: h1}, ts.URL),
	}
}

// splitSessions sends KeepAlive over HTTP/2, the rest over HTTP/1.1.
type splitSessions struct {
	tenurev1connect.SessionServiceClient
	keepAlive tenurev1connect.SessionServiceClient
}

func (s splitSessions) KeepAlive(ctx context.Context) *connect.BidiStreamForClient[tenurev1.KeepAliveRequest, tenurev1.KeepAliveResponse] {
	return s.keepAlive.KeepAlive(ctx)
}

func benchSession(b *testing.B, c benchClient, identity string) int64 {
	b.Helper()
	resp, err := c.Sessions.Open(context.Background(), connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: identity, Ttl: durationpb.New(benchTTL)}))
	if err != nil {
		b.Fatalf("open session %s: %v", identity, err)
	}
	return resp.Msg.Session.Id
}

// acquireRelease takes lease name for session sid and gives it back.
func acquireRelease(ctx context.Context, c benchClient, sid int64, name string) error {
	resp, err := c.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sid, Name: name}))
	if err != nil {
		return fmt.Errorf("acquire %s: %w", name, err)
	}
	if !resp.Msg.Acquired {
		return fmt.Errorf("acquire %s: got = not acquired, expected: acquired (held by %q)", name, resp.Msg.GetLease().GetHolderIdentity())
	}
	if _, err := c.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: name, Token: resp.Msg.Token})); err != nil {
		return fmt.Errorf("release %s token %d: %w", name, resp.Msg.Token, err)
	}
	return nil
}

// reportRate reports b.N over the timed wall-clock time in unit, and the
// process's CPU time (client and server together, every core) per op
// since cpu was taken. CPU per op moves less than throughput when other
// work shares the machine.
func reportRate(b *testing.B, unit string, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	b.ReportMetric(float64(processCPU()-cpu)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}

// processCPU is the user and system time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runClients runs n client goroutines that share b.N operations: each
// claims one with next() before doing it. The first error stops all.
func runClients(b *testing.B, n int, op func(ctx context.Context, client int) error) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		claimed atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for claimed.Add(1) <= int64(b.N) {
				if err := op(ctx, i); err != nil {
					errOnce.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// BenchmarkAcquireReleaseOneClient: one client, Acquire then Release of
// one lease, one pair after another. Every call waits for its own fsync,
// so this is the latency of two durable commits plus two round trips.
func BenchmarkAcquireReleaseOneClient(b *testing.B) {
	ts := benchServer(b)
	c := newBenchClient(b, ts)
	sid := benchSession(b, c, "bench-one")
	ctx := context.Background()
	b.ResetTimer()
	cpu := processCPU()
	for range b.N {
		if err := acquireRelease(ctx, c, sid, "bench-one"); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, "pairs/s", cpu)
}

// BenchmarkAcquireRelease64Clients: 64 clients, each with its own
// connection, session and lease, doing Acquire+Release pairs at once;
// raft writes whatever is queued with one fsync (group commit).
func BenchmarkAcquireRelease64Clients(b *testing.B) {
	const clients = 64
	ts := benchServer(b)
	cs := make([]benchClient, clients)
	sids := make([]int64, clients)
	for i := range cs {
		cs[i] = newBenchClient(b, ts)
		sids[i] = benchSession(b, cs[i], fmt.Sprintf("bench-%d", i))
	}
	b.ResetTimer()
	cpu := processCPU()
	runClients(b, clients, func(ctx context.Context, i int) error {
		return acquireRelease(ctx, cs[i], sids[i], fmt.Sprintf("lease-%d", i))
	})
	reportRate(b, "pairs/s", cpu)
}

// BenchmarkContendedHandoff: 16 contenders, each with its own session,
// loop Acquire(wait=true) then Release on one lease. A release grants the
// head of the FIFO queue in the same log entry and wakes only that
// caller, so a handoff costs one commit and one round trip to the new
// holder; b.N counts grants.
func BenchmarkContendedHandoff(b *testing.B) {
	const contenders = 16
	ts := benchServer(b)
	cs := make([]benchClient, contenders)
	sids := make([]int64, contenders)
	for i := range cs {
		cs[i] = newBenchClient(b, ts)
		sids[i] = benchSession(b, cs[i], fmt.Sprintf("contender-%d", i))
	}
	b.ResetTimer()
	cpu := processCPU()
	runClients(b, contenders, func(ctx context.Context, i int) error {
		resp, err := cs[i].Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sids[i], Name: "contended", Wait: true}))
		if err != nil {
			return fmt.Errorf("contender %d: acquire: %w", i, err)
		}
		if !resp.Msg.Acquired {
			return fmt.Errorf("contender %d: got = not acquired, expected: a waiting acquire to be granted", i)
		}
		if _, err := cs[i].Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: "contended", Token: resp.Msg.Token})); err != nil {
			return fmt.Errorf("contender %d: release token %d: %w", i, resp.Msg.Token, err)
		}
		return nil
	})
	reportRate(b, "handoffs/s", cpu)
}

// BenchmarkUnaryFloorOneClient and BenchmarkUnaryFloor64Clients are the
// baselines for the two benchmarks above: the same clients and
// connections, but each call a Refresh, a unary heartbeat that the lessor
// answers in memory, so nothing is logged. What is left is the cost of a
// connect call over HTTP/2 on this machine, client side included; an
// Acquire+Release pair is two such calls plus two commits.
func BenchmarkUnaryFloorOneClient(b *testing.B) {
	ts := benchServer(b)
	c := newBenchClient(b, ts)
	req := &tenurev1.KeepAliveRequest{SessionId: benchSession(b, c, "floor-one")}
	ctx := context.Background()
	b.ResetTimer()
	cpu := processCPU()
	for range b.N {
		if _, err := c.Sessions.Refresh(ctx, connect.NewRequest(req)); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, "calls/s", cpu)
}

func BenchmarkUnaryFloor64Clients(b *testing.B) {
	const clients = 64
	ts := benchServer(b)
	cs := make([]benchClient, clients)
	reqs := make([]*tenurev1.KeepAliveRequest, clients)
	for i := range cs {
		cs[i] = newBenchClient(b, ts)
		reqs[i] = &tenurev1.KeepAliveRequest{SessionId: benchSession(b, cs[i], fmt.Sprintf("floor-%d", i))}
	}
	b.ResetTimer()
	cpu := processCPU()
	runClients(b, clients, func(ctx context.Context, i int) error {
		_, err := cs[i].Sessions.Refresh(ctx, connect.NewRequest(reqs[i]))
		return err
	})
	reportRate(b, "calls/s", cpu)
}

// BenchmarkHeartbeats100kSessions opens 100,000 sessions, then heartbeats
// them round robin over KeepAlive streams, each on its own connection,
// with sends and receives pipelined. Heartbeats are answered by the
// leader's lessor in memory, never logged. Opening the sessions takes a
// while, so it happens once, in the outer benchmark; the measured part is
// the sub-benchmark.
func BenchmarkHeartbeats100kSessions(b *testing.B) {
	const (
		sessions = 100_000
		openers  = 256
		streams  = 8
	)
	ts := benchServer(b)
	ids := openBenchSessions(b, ts, sessions, openers)
	cs := make([]benchClient, streams)
	for i := range cs {
		cs[i] = newBenchClient(b, ts)
	}
	b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var (
			wg      sync.WaitGroup
			errOnce sync.Once
			first   error
		)
		fail := func(err error) { errOnce.Do(func() { first = err; cancel() }) }
		b.ResetTimer()
		cpu := processCPU()
		for i := range streams {
			// Stream i heartbeats ids[i], ids[i+streams], ... and gets
			// its share of b.N.
			n := b.N / streams
			if i < b.N%streams {
				n++
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := heartbeatStream(ctx, cs[i], ids, i, streams, n); err != nil {
					fail(fmt.Errorf("stream %d: %w", i, err))
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		if first != nil {
			b.Fatal(first)
		}
		reportRate(b, "heartbeats/s", cpu)
	})
}

// heartbeatStream sends n heartbeats on one KeepAlive stream for
// ids[first], ids[first+stride], ... (wrapping), while a second goroutine
// receives and checks the answers, which come in order.
func heartbeatStream(ctx context.Context, c benchClient, ids []int64, first, stride, n int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.Sessions.KeepAlive(ctx)
	defer stream.CloseResponse()
	id := func(k int) int64 {
		return ids[(first+k*stride)%len(ids)]
	}
	sendErr := make(chan error, 1)
	go func() {
		var req tenurev1.KeepAliveRequest
		for k := range n {
			req.SessionId = id(k)
			if err := stream.Send(&req); err != nil {
				sendErr <- fmt.Errorf("send heartbeat %d: %w", k, err)
				cancel() // unblocks Receive below
				return
			}
		}
		sendErr <- stream.CloseRequest()
	}()
	var recvErr error
	for k := range n {
		resp, err := stream.Receive()
		if err != nil {
			recvErr = fmt.Errorf("receive heartbeat %d: %w", k, err)
			break
		}
		if want := id(k); resp.SessionId != want || resp.Expired {
			recvErr = fmt.Errorf("heartbeat %d: got = session %d expired=%v, expected: session %d renewed", k, resp.SessionId, resp.Expired, want)
			break
		}
	}
	if recvErr == nil {
		if _, err := stream.Receive(); !errors.Is(err, io.EOF) {
			recvErr = fmt.Errorf("after %d heartbeats: got = %v, expected: EOF", n, err)
		}
	}
	cancel() // a sender still blocked on flow control gives up
	return errors.Join(recvErr, <-sendErr)
}

// openBenchSessions opens n sessions with a long TTL from workers
// goroutines, each on its own connection, and returns their IDs.
func openBenchSessions(b *testing.B, ts *testServer, n, workers int) []int64 {
	b.Helper()
	start := time.Now()
	ids := make([]int64, n)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns := make([]benchClient, 8)
	for i := range conns {
		conns[i] = newBenchClient(b, ts)
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := conns[w%len(conns)]
			req := &tenurev1.OpenSessionRequest{Ttl: durationpb.New(benchTTL)}
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				resp, err := c.Sessions.Open(ctx, connect.NewRequest(req))
				if err != nil {
					errOnce.Do(func() { first = fmt.Errorf("open session %d of %d: %w", i, n, err); cancel() })
					return
				}
				ids[i] = resp.Msg.Session.Id
			}
		}()
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
	b.Logf("opened %d sessions in %v", n, time.Since(start).Round(time.Millisecond))
	return ids
}
