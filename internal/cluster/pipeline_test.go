package cluster_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// upgrade asks n to upgrade a connection to a pipeline, by hand as the
// Go client does through net/http, and returns the answer and the
// connection, closed when the test ends.
func upgrade(t *testing.T, n *cluster.Node) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: tenure\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", framing.Path, framing.Protocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("upgrade on %s: %v", n, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, conn, br
}

// TestOnlyTheLeaderServesPipelines: a follower would have to forward
// every message of a pipeline, so it refuses one, naming the leader the
// client should go to; the leader serves both transports.
func TestOnlyTheLeaderServesPipelines(t *testing.T) {
	c := cluster.New(t, 3)
	lead, followers := leaderAndFollowers(t, c)
	f := followers[0]
	// The leader's API address reaches followers through the log.
	waitFor(t, waitCtx(t), f.ID()+" to know the leader's API address", func() bool {
		st, err := f.API().Cluster.Status(waitCtx(t), connect.NewRequest(&tenurev1.StatusRequest{}))
		return err == nil && st.Msg.GetLeaderApiAddress() == lead.Addr()
	})

	resp, _, _ := upgrade(t, f)
	if resp.StatusCode != http.StatusServiceUnavailable ||
		resp.Header.Get(api.ErrorHeader) != string(api.ReasonNotLeader) ||
		resp.Header.Get(server.LeaderHeader) != lead.Addr() {
		t.Errorf("upgrade on follower %s: got = %s, %s %q, %s %q, expected: 503, %s %q, %s %q (the leader %s)",
			f, resp.Status, api.ErrorHeader, resp.Header.Get(api.ErrorHeader), server.LeaderHeader, resp.Header.Get(server.LeaderHeader),
			api.ErrorHeader, api.ReasonNotLeader, server.LeaderHeader, lead.Addr(), lead)
	}

	ctx := waitCtx(t)
	stream := f.API().Sessions.Pipeline(ctx)
	// The follower may have refused before this arrives: then Send
	// fails with io.EOF and Receive has the reason.
	if err := stream.Send(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("send on follower %s's pipeline stream: %v", f, err)
	}
	got, err := stream.Receive()
	if !isNotLeader(err) {
		t.Errorf("pipeline stream on follower %s: got = %v, %v, expected: a not-leader error", f, got, err)
	}
	if h := stream.ResponseHeader().Get(server.LeaderHeader); h != lead.Addr() {
		t.Errorf("pipeline stream on follower %s: got = %s %q, expected: the leader's %q", f, server.LeaderHeader, h, lead.Addr())
	}
	_ = stream.CloseRequest()
	_ = stream.CloseResponse()

	// The leader takes both.
	resp, conn, br := upgrade(t, lead)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade on the leader %s: got = %s, expected: 101 Switching Protocols", lead, resp.Status)
	}
	w := framing.NewWriter(conn)
	if _, err := w.Append(&tenurev1.PipelineRequest{Id: 7, Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	frame, err := framing.NewReader(br, 1<<20).Next()
	if err != nil {
		t.Fatalf("pong from the leader %s: %v", lead, err)
	}
	pong := &tenurev1.PipelineResponse{}
	if err := proto.Unmarshal(frame, pong); err != nil {
		t.Fatal(err)
	}
	if pong.GetId() != 7 || pong.GetPong() == nil {
		t.Errorf("ping on the leader %s: got = %v, expected: pong 7", lead, pong)
	}

	stream = lead.API().Sessions.Pipeline(ctx)
	if err := stream.Send(&tenurev1.PipelineRequest{Id: 8, Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}}); err != nil {
		t.Fatal(err)
	}
	got, err = stream.Receive()
	if err != nil || got.GetId() != 8 || got.GetPong() == nil {
		t.Errorf("ping on the leader %s's pipeline stream: got = %v, %v, expected: pong 8", lead, got, err)
	}
	if err := stream.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if got, err := stream.Receive(); !errors.Is(err, io.EOF) {
		t.Errorf("the leader's stream after CloseRequest: got = %v, %v, expected: io.EOF", got, err)
	}
	_ = stream.CloseResponse()
}
