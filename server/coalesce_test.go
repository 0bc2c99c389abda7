package server

import (
	"errors"
	"io"
	"testing"
	"time"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// A client that sends many heartbeats before reading gets every answer,
// in order, although the server flushes them in batches.
func TestKeepAliveAnswersPipelinedHeartbeatsInOrder(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	live := []int64{openSession(t, ts, "p1", 30*time.Second).Id, openSession(t, ts, "p2", 30*time.Second).Id}
	const n = 2000
	id := func(k int) int64 {
		if k%7 == 3 {
			return 900000 + int64(k) // unknown: answered expired=true
		}
		return live[k%2]
	}
	stream := ts.Sessions.KeepAlive(ctxT(t))
	sendErr := make(chan error, 1)
	go func() {
		for k := range n {
			if err := stream.Send(&tenurev1.KeepAliveRequest{SessionId: id(k)}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- stream.CloseRequest()
	}()
	for k := range n {
		resp, err := stream.Receive()
		if err != nil {
			t.Fatalf("heartbeat %d: %v", k, err)
		}
		wantExpired := k%7 == 3
		if resp.SessionId != id(k) || resp.Expired != wantExpired {
			t.Fatalf("heartbeat %d: got = session %d expired=%v, expected: session %d expired=%v", k, resp.SessionId, resp.Expired, id(k), wantExpired)
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Receive(); !errors.Is(err, io.EOF) {
		t.Fatalf("got = %v, expected: EOF after the client closed", err)
	}
	_ = stream.CloseResponse()
}
