package raftnode

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"
	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
)

// recorder is a messageHandler that keeps what it is given.
type recorder struct {
	mu          sync.Mutex
	msgs        []raftpb.Message
	unreachable map[uint64]int
	snapshots   []snapshotReport
}

type snapshotReport struct {
	id     uint64
	status etcdraft.SnapshotStatus
}

func newRecorder() *recorder { return &recorder{unreachable: map[uint64]int{}} }

func (r *recorder) Process(_ context.Context, m raftpb.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	return nil
}

func (r *recorder) ReportUnreachable(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unreachable[id]++
}

func (r *recorder) ReportSnapshot(id uint64, s etcdraft.SnapshotStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snapshots = append(r.snapshots, snapshotReport{id, s})
}

func (r *recorder) received() []raftpb.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]raftpb.Message(nil), r.msgs...)
}

func (r *recorder) unreachableCount(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unreachable[id]
}

func (r *recorder) snapshotReports() []snapshotReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]snapshotReport(nil), r.snapshots...)
}

// noLeaks checks, after every cleanup the test registers later (which
// closes its transports), that no goroutine is left.
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// testPeers is a started TCP transport for node id on a free loopback
// port, closed at the end of the test; its log goes to the returned
// buffer.
func testPeers(t *testing.T, id uint64, tlsCfg *tls.Config, tag string) (*tcpPeers, *recorder, *syncBuffer) {
	t.Helper()
	return testPeersAt(t, id, "127.0.0.1:0", tlsCfg, tag)
}

func testPeersAt(t *testing.T, id uint64, bind string, tlsCfg *tls.Config, tag string) (*tcpPeers, *recorder, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	p, err := listenPeers(peerConfig{
		ID: id, Bind: bind, TLS: tlsCfg, EngineTag: tag,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: newPeerMetrics(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	r := newRecorder()
	p.Start(r)
	return p, r, logs
}

// appMsgs are n appends from from to to, told apart by Index, with a
// payload so that frames have some size.
func appMsgs(from, to uint64, first, n int) []raftpb.Message {
	msgs := make([]raftpb.Message, n)
	for i := range msgs {
		msgs[i] = raftpb.Message{
			Type: raftpb.MsgApp, From: from, To: to, Term: 3, Index: uint64(first + i),
			Entries: []raftpb.Entry{{Term: 3, Index: uint64(first + i + 1), Data: bytes.Repeat([]byte{byte(first + i)}, 100)}},
		}
	}
	return msgs
}

// checkInOrder fails unless got holds exactly the appends first,
// first+1, ... first+n-1 from from, whole.
func checkInOrder(t *testing.T, got []raftpb.Message, from uint64, first, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("received %d messages, expected: %d", len(got), n)
	}
	for i, m := range got {
		if m.From != from || m.Index != uint64(first+i) || len(m.Entries) != 1 || !bytes.Equal(m.Entries[0].Data, bytes.Repeat([]byte{byte(first + i)}, 100)) {
			t.Fatalf("message %d: got = from %d index %d entries %d, expected: from %d index %d with its entry", i, m.From, m.Index, len(m.Entries), from, first+i)
		}
	}
}

func TestPeersDeliverInOrderBothWays(t *testing.T) {
	noLeaks(t)
	dir := certsDir(t)
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{
		{"over plain TCP", nil},
		{"over mutual TLS", peerTLS(t, dir)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, ra, _ := testPeers(t, 1, tc.tls, "c1")
			b, rb, _ := testPeers(t, 2, tc.tls, "c1")
			a.SetPeer(2, b.LocalAddr())
			b.SetPeer(1, a.LocalAddr())
			const n = 2000
			// In slices of several, as raft's Ready hands them out, so
			// that the writer has batches to coalesce.
			for i := 0; i < n; i += 50 {
				a.Send(appMsgs(1, 2, i, 50))
				b.Send(appMsgs(2, 1, i, 50))
			}
			waitFor(t, "every message both ways", func() bool {
				return len(ra.received()) >= n && len(rb.received()) >= n
			})
			checkInOrder(t, rb.received(), 1, 0, n)
			checkInOrder(t, ra.received(), 2, 0, n)
			if got := testutil.ToFloat64(a.metrics.dropped) + testutil.ToFloat64(b.metrics.dropped); got != 0 {
				t.Errorf("dropped messages: got = %v, expected: 0", got)
			}
		})
	}
}

// countingWriter counts the writes that reach it: the syscalls a
// connection would make.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

// TestPeerWriterCoalescesQueuedMessages: what is queued when the writer
// takes a message goes out with it in one write, in order.
func TestPeerWriterCoalescesQueuedMessages(t *testing.T) {
	p := &tcpPeer{t: &tcpPeers{log: slog.New(slog.DiscardHandler), metrics: newPeerMetrics()}, id: 2, queue: make(chan raftpb.Message, peerQueue)}
	msgs := appMsgs(1, 2, 0, 100)
	for _, m := range msgs[1:] {
		p.queue <- m
	}
	out := &countingWriter{}
	n, err := p.writeBatch(bufio.NewWriterSize(out, 64<<10), msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	if n != 100 || out.writes != 1 {
		t.Errorf("got = %d messages in %d writes, expected: 100 in 1", n, out.writes)
	}
	r := bufio.NewReader(&out.Buffer)
	var got []raftpb.Message
	for range n {
		m, err := readFrame(r, maxFrame)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	checkInOrder(t, got, 1, 0, 100)
}

// TestPeersRefuseANodeFromAnotherCA: a node whose certificate comes from
// another CA neither delivers to nor receives from a member; the member
// reports it unreachable.
func TestPeersRefuseANodeFromAnotherCA(t *testing.T) {
	noLeaks(t)
	a, ra, _ := testPeers(t, 1, peerTLS(t, certsDir(t)), "c1")
	x, rx, _ := testPeers(t, 9, peerTLS(t, certsDir(t)), "c1")
	a.SetPeer(9, x.LocalAddr())
	x.SetPeer(1, a.LocalAddr())
	waitFor(t, "both to report the other unreachable", func() bool {
		a.Send(appMsgs(1, 9, 0, 1))
		x.Send(appMsgs(9, 1, 0, 1))
		return ra.unreachableCount(9) > 0 && rx.unreachableCount(1) > 0
	})
	if got := len(ra.received()) + len(rx.received()); got != 0 {
		t.Errorf("messages delivered across CAs: got = %d, expected: 0", got)
	}

	// Nor does a client that shows no certificate at all.
	cfg := a.cfg.TLS.Clone()
	cfg.Certificates = nil
	c, err := tls.Dial("tcp", a.LocalAddr(), dialTLS(cfg, a.LocalAddr()))
	if err == nil {
		defer c.Close()
		hello := append([]byte(peerMagic), peerVersion, connStream)
		hello = binary.BigEndian.AppendUint64(hello, 9)
		hello = append(hello, 2, 'c', '1', 0)
		_, _ = c.Write(hello)
		if err := closedByPeer(c); err != nil {
			t.Errorf("a client without a certificate: %v, expected: refused", err)
		}
	}
}

func TestPeersRefuseAnotherEngineTag(t *testing.T) {
	noLeaks(t)
	a, ra, alog := testPeers(t, 1, nil, "engine-a")
	b, rb, blog := testPeers(t, 2, nil, "engine-b")
	a.SetPeer(2, b.LocalAddr())
	waitFor(t, "the sender to report the peer unreachable", func() bool {
		a.Send(appMsgs(1, 2, 0, 1))
		return ra.unreachableCount(2) > 0
	})
	if got := len(rb.received()); got != 0 {
		t.Errorf("messages delivered across engines: got = %d, expected: 0", got)
	}
	waitFor(t, "both ends to log why", func() bool {
		return strings.Contains(blog.String(), `node 1 runs engine \"engine-a\", this node \"engine-b\"`) &&
			strings.Contains(alog.String(), "another engine tag")
	})
}

// TestPeersRefuseTheOtherEngine: a hashicorp/raft transport dialing the
// port, and a few bytes of garbage, are refused with a warning; nothing
// reaches raft and the transport keeps serving.
func TestPeersRefuseTheOtherEngine(t *testing.T) {
	noLeaks(t)
	b, rb, blog := testPeers(t, 2, nil, "c1")

	old, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var resp raft.AppendEntriesResponse
	err = old.AppendEntries("n2", raft.ServerAddress(b.LocalAddr()), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1"), Addr: []byte("x")}, Term: 1}, &resp)
	old.CloseStreams()
	old.Close()
	if err == nil {
		t.Error("a hashicorp/raft AppendEntries to the raft engine's port succeeded, expected: an error")
	}

	c, err := net.Dial("tcp", b.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("\x00\x83\xa4Term\x01garbage garbage garbage")); err != nil {
		t.Fatal(err)
	}
	if err := closedByPeer(c); err != nil {
		t.Errorf("the garbage hello: %v, expected: the connection closed", err)
	}
	waitFor(t, "the refusal in the log", func() bool {
		return strings.Count(blog.String(), "wrong magic") >= 2
	})

	// The transport still serves a real peer.
	a, _, _ := testPeers(t, 1, nil, "c1")
	a.SetPeer(2, b.LocalAddr())
	a.Send(appMsgs(1, 2, 0, 3))
	waitFor(t, "a real peer's messages", func() bool { return len(rb.received()) == 3 })
}

// closedByPeer reads c until the other end closes it, and says what else
// happened: bytes that answered, or nothing for ten seconds.
func closedByPeer(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Errorf("answered with %d bytes", n)
	case errors.As(err, &ne) && ne.Timeout():
		return errors.New("still open after ten seconds")
	}
	return nil // EOF, a reset or a TLS alert: closed
}

func TestPeersRefuseABadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  peerConfig
		want string
	}{
		{"a node without a raft ID", peerConfig{Bind: "127.0.0.1:0"}, "raft ID is 0"},
		{"an engine tag over 255 bytes", peerConfig{ID: 1, Bind: "127.0.0.1:0", EngineTag: strings.Repeat("x", 256)}, "engine tag is 256 bytes, the limit is 255"},
		{"an address other nodes cannot dial", peerConfig{ID: 1, Bind: "0.0.0.0:0"}, "not an address other nodes can dial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := listenPeers(tc.cfg)
			if err == nil {
				p.Close()
				t.Fatalf("listenPeers succeeded, expected: an error saying %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got = %v, expected: an error saying %q", err, tc.want)
			}
		})
	}
}

// dialHello is a raw connection to p that has passed the hello.
func dialHello(t *testing.T, p *tcpPeers, kind byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	hello := append([]byte(peerMagic), peerVersion, kind)
	hello = binary.BigEndian.AppendUint64(hello, 7)
	hello = append(hello, byte(len(p.cfg.EngineTag)))
	hello = append(hello, p.cfg.EngineTag...)
	hello = append(hello, 0) // no address to be answered at
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var answer [1]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil || answer[0] != helloOK {
		t.Fatalf("hello: got = %v %v, expected: accepted", answer, err)
	}
	return c
}

// TestPeersKeepOneStreamPerNode: a node that dials again (after a
// failure it saw and the acceptor did not) replaces its old connection,
// which is closed.
func TestPeersKeepOneStreamPerNode(t *testing.T) {
	noLeaks(t)
	b, rb, _ := testPeers(t, 2, nil, "c1")
	first := dialHello(t, b, connStream)
	second := dialHello(t, b, connStream)
	if err := closedByPeer(first); err != nil {
		t.Errorf("the first connection after the node dialed again: %v, expected: closed", err)
	}
	frame, err := writeFrameTo(appMsgs(7, 2, 0, 1)[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Write(frame); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message on the second connection", func() bool { return len(rb.received()) == 1 })
}

// writeFrameTo is m's frame.
func writeFrameTo(m raftpb.Message) ([]byte, error) {
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	if _, err := writeFrame(w, m, nil); err != nil {
		return nil, err
	}
	err := w.Flush()
	return out.Bytes(), err
}

func TestPeersCloseOnAFrameOverTheLimit(t *testing.T) {
	noLeaks(t)
	b, rb, blog := testPeers(t, 2, nil, "c1")
	c := dialHello(t, b, connStream)
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, maxFrame+1)); err != nil {
		t.Fatal(err)
	}
	if err := closedByPeer(c); err != nil {
		t.Errorf("after a frame over the limit: %v, expected: the connection closed", err)
	}
	waitFor(t, "the error in the log", func() bool {
		return strings.Contains(blog.String(), fmt.Sprintf("a frame of %d bytes is over the %d-byte limit", maxFrame+1, maxFrame))
	})
	if got := len(rb.received()); got != 0 {
		t.Errorf("messages delivered: got = %d, expected: 0", got)
	}
}

// TestPeersSendNeverBlocksOnADeadPeer: a peer that accepts connections
// but never answers the hello holds up the writer; Send still returns,
// dropping what the queue cannot hold, and tells raft the peer is
// unreachable.
func TestPeersSendNeverBlocksOnADeadPeer(t *testing.T) {
	noLeaks(t)
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	defer func() {
		mute.Close()
		<-accepted
		for _, c := range held {
			c.Close()
		}
	}()

	a, ra, _ := testPeers(t, 1, nil, "c1")
	a.SetPeer(2, mute.Addr().String())
	const n = 3 * peerQueue
	for i := 0; i < n; i += 100 {
		a.Send(appMsgs(1, 2, i, 100))
	}
	if got := testutil.ToFloat64(a.metrics.dropped); got < n-peerQueue-1 {
		t.Errorf("dropped messages: got = %v, expected: at least %d", got, n-peerQueue-1)
	}
	if got := ra.unreachableCount(2); got == 0 {
		t.Error("raft was not told that the peer is unreachable")
	}
	// Close ends the dial that waits for the hello's answer.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPeersRedialAPeerThatComesBack: while a peer is down, what is sent
// to it is dropped and reported; once it listens again at the same
// address, messages flow again, in order.
func TestPeersRedialAPeerThatComesBack(t *testing.T) {
	noLeaks(t)
	a, ra, _ := testPeers(t, 1, nil, "c1")
	b, _, _ := testPeers(t, 2, nil, "c1")
	addr := b.LocalAddr()
	a.SetPeer(2, addr)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the down peer to be reported", func() bool {
		a.Send(appMsgs(1, 2, 0, 1))
		return ra.unreachableCount(2) > 0
	})

	b2, rb2, _ := testPeersAt(t, 2, addr, nil, "c1")
	_ = b2
	// Raft sends again until a message gets through; then the rest
	// follow in order.
	waitFor(t, "a message to reach the restarted peer", func() bool {
		a.Send([]raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2}})
		return len(rb2.received()) > 0
	})
	// Heartbeats sent while waiting may still arrive after this point,
	// so the wait counts appends only.
	a.Send(appMsgs(1, 2, 0, 500))
	appends := func() []raftpb.Message {
		var apps []raftpb.Message
		for _, m := range rb2.received() {
			if m.Type == raftpb.MsgApp {
				apps = append(apps, m)
			}
		}
		return apps
	}
	waitFor(t, "the appends", func() bool { return len(appends()) >= 500 })
	checkInOrder(t, appends(), 1, 0, 500)
}

func TestPeersSetPeerMovesToTheNewAddress(t *testing.T) {
	noLeaks(t)
	a, _, _ := testPeers(t, 1, nil, "c1")
	b1, rb1, _ := testPeers(t, 2, nil, "c1")
	b2, rb2, _ := testPeers(t, 2, nil, "c1")
	a.SetPeer(2, b1.LocalAddr())
	a.Send(appMsgs(1, 2, 0, 10))
	waitFor(t, "the first address to receive", func() bool { return len(rb1.received()) == 10 })
	a.SetPeer(2, b2.LocalAddr())
	a.Send(appMsgs(1, 2, 10, 10))
	waitFor(t, "the new address to receive", func() bool { return len(rb2.received()) == 10 })
	if got := len(rb1.received()); got != 10 {
		t.Errorf("the old address received %d messages, expected: 10", got)
	}
	a.RemovePeer(2)
	a.Send(appMsgs(1, 2, 20, 1))
	if got := testutil.ToFloat64(a.metrics.dropped); got != 1 {
		t.Errorf("dropped after RemovePeer: got = %v, expected: 1", got)
	}
}

// TestPeersAnswerANodeAtItsHelloAddress: a node that knows nobody (one
// joining) answers a sender at the address its hello gave, until
// RemovePeer; SetPeer takes over again.
func TestPeersAnswerANodeAtItsHelloAddress(t *testing.T) {
	noLeaks(t)
	a, ra, _ := testPeers(t, 1, nil, "c1")
	b, rb, _ := testPeers(t, 2, nil, "c1")
	a.SetPeer(2, b.LocalAddr())
	a.Send(appMsgs(1, 2, 0, 1))
	waitFor(t, "the message to the node that knows nobody", func() bool { return len(rb.received()) == 1 })
	b.Send(appMsgs(2, 1, 0, 1))
	waitFor(t, "its answer", func() bool { return len(ra.received()) == 1 })

	// Node 1, removed, restarts and dials again: its new hello is not
	// learned.
	b.RemovePeer(1)
	a.Close()
	a2, ra2, _ := testPeers(t, 1, nil, "c1")
	a2.SetPeer(2, b.LocalAddr())
	a2.Send(appMsgs(1, 2, 1, 1))
	waitFor(t, "the restarted node's message", func() bool { return len(rb.received()) == 2 })
	b.Send(appMsgs(2, 1, 1, 1))
	if got := rb.unreachableCount(1); got != 1 {
		t.Errorf("unreachable reports after RemovePeer: got = %d, expected: 1, the address is not learned again", got)
	}
	b.SetPeer(1, a2.LocalAddr())
	b.Send(appMsgs(2, 1, 1, 1))
	waitFor(t, "the answer after SetPeer", func() bool { return len(ra2.received()) == 1 })
}

func TestPeersSnapshot(t *testing.T) {
	noLeaks(t)
	a, ra, _ := testPeers(t, 1, nil, "c1")
	b, rb, _ := testPeers(t, 2, nil, "c1")
	a.SetPeer(2, b.LocalAddr())
	// Larger than a write chunk, so that it goes in several.
	data := bytes.Repeat([]byte("snapshot"), 3*snapshotChunk/8+5)
	snap := raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 4, Snapshot: &raftpb.Snapshot{
		Data: data, Metadata: raftpb.SnapshotMetadata{Index: 100, Term: 4, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}},
	}}
	a.Send([]raftpb.Message{snap})
	waitFor(t, "the snapshot to be reported finished", func() bool { return len(ra.snapshotReports()) > 0 })
	if got := ra.snapshotReports(); len(got) != 1 || got[0] != (snapshotReport{2, etcdraft.SnapshotFinish}) {
		t.Errorf("snapshot reports: got = %v, expected: [{2 SnapshotFinish}]", got)
	}
	got := rb.received()
	if len(got) != 1 || got[0].Type != raftpb.MsgSnap || got[0].Snapshot == nil || !bytes.Equal(got[0].Snapshot.Data, data) || got[0].Snapshot.Metadata.Index != 100 {
		t.Fatalf("received %d messages, expected: the snapshot, whole", len(got))
	}

	t.Run("to a dead peer", func(t *testing.T) {
		a.SetPeer(3, deadAddr(t))
		snap.To = 3
		a.Send([]raftpb.Message{snap})
		waitFor(t, "the snapshot to be reported failed", func() bool { return len(ra.snapshotReports()) > 1 })
		if got := ra.snapshotReports()[1]; got != (snapshotReport{3, etcdraft.SnapshotFailure}) {
			t.Errorf("snapshot report: got = %v, expected: {3 SnapshotFailure}", got)
		}
	})
	t.Run("to an unknown peer", func(t *testing.T) {
		snap.To = 4
		a.Send([]raftpb.Message{snap})
		if got := ra.snapshotReports(); len(got) != 3 || got[2] != (snapshotReport{4, etcdraft.SnapshotFailure}) {
			t.Errorf("snapshot reports: got = %v, expected the last: {4 SnapshotFailure}", got)
		}
	})
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
