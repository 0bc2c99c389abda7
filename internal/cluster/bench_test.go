package cluster_test

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/cluster"
)

// The cost of answering a call on a follower by forwarding it, against
// calling the leader: the figure behind redirecting heartbeat streams to
// the leader rather than forwarding them (docs/benchmarks.md). Each op is
// one unary heartbeat (Refresh), which the leader answers from memory, so
// the difference is the forwarding hop alone.
//
//	go test -run '^$' -bench Refresh -benchtime 3s ./internal/cluster

func BenchmarkRefreshOnTheLeader(b *testing.B) {
	c := cluster.New(b, 3)
	benchRefresh(b, leader(b, c), leader(b, c))
}

func BenchmarkRefreshThroughAFollower(b *testing.B) {
	c := cluster.New(b, 3)
	followers, err := c.Followers(waitCtx(b))
	if err != nil {
		b.Fatal(err)
	}
	benchRefresh(b, leader(b, c), followers[0])
}

func benchRefresh(b *testing.B, lead, via *cluster.Node) {
	session := openSession(b, lead, time.Hour)
	// HTTP/1.1, as the Go client sends unary calls.
	hc := &http.Client{Transport: &http.Transport{}}
	sessions := tenurev1connect.NewSessionServiceClient(hc, via.URL())
	req := &tenurev1.KeepAliveRequest{SessionId: session}
	ctx := context.Background()
	if _, err := sessions.Refresh(ctx, connect.NewRequest(req)); err != nil {
		b.Fatal(err)
	}
	cpu := processCPU()
	b.ResetTimer()
	for b.Loop() {
		if _, err := sessions.Refresh(ctx, connect.NewRequest(req)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU()-cpu)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	hc.CloseIdleConnections()
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
