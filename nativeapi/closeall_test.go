package nativeapi

import (
	"context"
	"net"
	"testing"
	"time"
)

// fakePipe is a pipeline whose serve loop writes n answers to a net.Pipe,
// pausing between them, then ends as serve does: by closing its
// connection and leaving the set. With nobody reading the other end,
// its first write blocks for good.
func fakePipe(t *testing.T, conns *pipeConns, answers int, pause time.Duration, read bool) *pipeConn {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { client.Close() })
	if read {
		go func() {
			buf := make([]byte, 64)
			for {
				if _, err := client.Read(buf); err != nil {
					return
				}
			}
		}()
	}
	pc := &pipeConn{conn: server}
	pc.ctx, pc.cancel = context.WithCancelCause(context.Background())
	if !conns.add(pc) {
		t.Fatal("the set refused a pipeline before closeAll")
	}
	go func() {
		defer conns.remove(pc)
		defer server.Close()
		<-pc.stopping
		for range answers {
			time.Sleep(pause)
			if _, err := server.Write([]byte("answer")); err != nil {
				return
			}
			pc.touch()
		}
	}()
	return pc
}

// TestCloseAllWaitsForAPipelineThatKeepsAnswering: closing a node with
// thousands of parked watches takes more than one timeout to answer them
// all under load; a pipeline still writing is waited for (cutting it
// would leave its client with EOF instead of answers), one whose client
// stopped reading is cut after the timeout, and closeAll returns.
func TestCloseAllWaitsForAPipelineThatKeepsAnswering(t *testing.T) {
	const timeout = 200 * time.Millisecond
	var conns pipeConns
	done := make(chan struct{})
	var finished time.Time
	answering := fakePipe(t, &conns, 30, timeout/10, true) // about 3 timeouts of answers
	stalled := fakePipe(t, &conns, 1, 0, false)
	go func() {
		conns.closeAll(timeout)
		finished = time.Now()
		close(done)
	}()
	start := time.Now()
	select {
	case <-done:
	case <-time.After(closeAllLimit * timeout * 5):
		t.Fatal("closeAll did not return")
	}
	if took := finished.Sub(start); took < 2*timeout {
		t.Fatalf("closeAll returned after %v, expected: after the answering pipeline's 30 answers (about %v)", took, 3*timeout)
	}
	if _, err := answering.conn.Write(nil); err == nil {
		t.Fatal("the answering pipeline's connection is open after closeAll")
	}
	if _, err := stalled.conn.Write(nil); err == nil {
		t.Fatal("the stalled pipeline's connection is open after closeAll")
	}
	if conns.add(&pipeConn{}) {
		t.Fatal("closeAll left the set taking new pipelines")
	}
}

// TestCloseAllCutsAPipelineWhoseClientStoppedReading: a client that reads
// nothing cannot hold Close; its connection is cut about one timeout
// after the stop.
func TestCloseAllCutsAPipelineWhoseClientStoppedReading(t *testing.T) {
	const timeout = 200 * time.Millisecond
	var conns pipeConns
	fakePipe(t, &conns, 1, 0, false)
	done := make(chan struct{})
	go func() {
		conns.closeAll(timeout)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeAllLimit * timeout):
		t.Fatalf("closeAll still waits %v after the stop for a client that reads nothing, expected: the connection cut after about %v", closeAllLimit*timeout, timeout)
	}
}
