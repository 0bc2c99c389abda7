package raftnode

// The peer transport's wire: accepting and dialing connections, the
// hello that opens each, and the frames that carry raft messages. It is
// apart from the sender (peers_send.go) because both directions share
// it, and from peers.go, which keeps the peers and their addresses.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

func (t *tcpPeers) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a transient accept error
			continue
		}
		t.mu.Lock()
		ok := t.goLocked(func() { t.serve(c) })
		if ok {
			t.inbound[c] = struct{}{}
		}
		t.mu.Unlock()
		if !ok {
			c.Close()
		}
	}
}

// serve reads one inbound connection: its hello, then frames handed to
// raft in order until the connection ends or Close.
func (t *tcpPeers) serve(c net.Conn) {
	defer func() {
		t.mu.Lock()
		delete(t.inbound, c)
		t.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	from, addr, kind, err := t.readHello(r, c)
	if err != nil {
		if t.ctx.Err() == nil {
			t.log.Warn("peer connection refused", "remote", c.RemoteAddr(), "err", err)
		}
		return
	}
	_ = c.SetDeadline(time.Time{})
	t.learn(from, addr)
	if kind == connStream {
		t.mu.Lock()
		if old := t.streams[from]; old != nil {
			old.Close()
		}
		t.streams[from] = c
		t.mu.Unlock()
		defer func() {
			t.mu.Lock()
			if t.streams[from] == c {
				delete(t.streams, from)
			}
			t.mu.Unlock()
		}()
	}
	select {
	case <-t.started:
	case <-t.ctx.Done():
		return
	}
	limit := uint32(maxFrame)
	if kind == connSnapshot {
		limit = maxSnapshotFrame
	}
	for {
		m, err := readFrame(r, limit)
		if err != nil {
			if t.ctx.Err() == nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.log.Error("peer connection closed on a bad read", "from", from, "remote", c.RemoteAddr(), "err", err)
			}
			return
		}
		perr := t.h.Process(t.ctx, m)
		if perr != nil && t.ctx.Err() == nil {
			t.log.Debug("raft refused a message", "from", from, "type", m.Type, "err", perr)
		}
		if kind == connSnapshot {
			status := snapshotTaken
			if perr != nil {
				status = snapshotRejected
			}
			_ = c.SetWriteDeadline(time.Now().Add(peerWriteTimeout))
			_, _ = c.Write([]byte{status})
			return
		}
		if t.ctx.Err() != nil {
			return
		}
	}
}

// readHello reads and checks a hello, answering it on w unless its magic
// shows it is not this transport's traffic at all.
func (t *tcpPeers) readHello(r *bufio.Reader, w io.Writer) (from uint64, addr string, kind byte, err error) {
	var fixed [len(peerMagic) + 1 + 1 + 8]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return 0, "", 0, fmt.Errorf("reading the hello: %w", err)
	}
	if string(fixed[:len(peerMagic)]) != peerMagic {
		return 0, "", 0, errors.New("not a raft-engine peer (wrong magic): a node of the other engine, or not a Tenure node, dialed the raft port")
	}
	rest := fixed[len(peerMagic):]
	version, kind, from := rest[0], rest[1], binary.BigEndian.Uint64(rest[2:10])
	tag, err := readShortString(r)
	if err != nil {
		return 0, "", 0, fmt.Errorf("reading the hello's engine tag: %w", err)
	}
	addr, err = readShortString(r)
	if err != nil {
		return 0, "", 0, fmt.Errorf("reading the hello's address: %w", err)
	}
	answer := helloOK
	switch {
	case from == 0:
		answer, err = helloBadID, errors.New("a node dialed with raft ID 0")
	case version != peerVersion:
		answer, err = helloBadVersion, fmt.Errorf("node %d speaks peer protocol version %d, this node %d", from, version, peerVersion)
	case tag != t.cfg.EngineTag:
		answer, err = helloBadTag, fmt.Errorf("node %d runs engine %q, this node %q", from, tag, t.cfg.EngineTag)
	case kind != connStream && kind != connSnapshot:
		answer, err = helloBadKind, fmt.Errorf("node %d asked for an unknown connection kind %d", from, kind)
	}
	if _, werr := w.Write([]byte{answer}); werr != nil && err == nil {
		err = fmt.Errorf("answering the hello: %w", werr)
	}
	return from, addr, kind, err
}

// readShortString reads a length byte and that many bytes.
func readShortString(r *bufio.Reader) (string, error) {
	n, err := r.ReadByte()
	if err != nil {
		return "", err
	}
	b := make([]byte, n)
	_, err = io.ReadFull(r, b)
	return string(b), err
}

// dial connects to addr and has its hello accepted. The connection
// closes when ctx is done.
func (t *tcpPeers) dial(ctx context.Context, addr string, kind byte) (net.Conn, error) {
	nd := &net.Dialer{Timeout: peerDialTimeout}
	var c net.Conn
	var err error
	if t.cfg.TLS != nil {
		d := &tls.Dialer{NetDialer: nd, Config: dialTLS(t.cfg.TLS, addr)}
		c, err = d.DialContext(ctx, "tcp", addr)
	} else {
		c, err = nd.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	hello := make([]byte, 0, len(peerMagic)+12+len(t.cfg.EngineTag)+len(t.addr))
	hello = append(hello, peerMagic...)
	hello = append(hello, peerVersion, kind)
	hello = binary.BigEndian.AppendUint64(hello, t.cfg.ID)
	hello = append(hello, byte(len(t.cfg.EngineTag)))
	hello = append(hello, t.cfg.EngineTag...)
	hello = append(hello, byte(len(t.addr)))
	hello = append(hello, t.addr...)
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	var answer [1]byte
	if _, err = c.Write(hello); err == nil {
		_, err = io.ReadFull(c, answer[:])
	}
	if err == nil && answer[0] != helloOK {
		err = fmt.Errorf("%w: %s", errPeerRefused, refusal(answer[0]))
	}
	if err != nil {
		stop()
		c.Close()
		return nil, fmt.Errorf("hello to %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	return stopConn{Conn: c, stop: stop}, nil
}

func refusal(b byte) string {
	switch b {
	case helloBadVersion:
		return "another peer protocol version"
	case helloBadTag:
		return "another engine tag (a node of another raft engine)"
	case helloBadKind:
		return "unknown connection kind"
	case helloBadID:
		return "raft ID 0"
	}
	return fmt.Sprintf("answer %d", b)
}

// stopConn releases dial's context.AfterFunc when closed.
type stopConn struct {
	net.Conn
	stop func() bool
}

func (c stopConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

// writeFrame writes m's frame to w, marshalling through scratch, which
// it returns grown for the next call.
func writeFrame(w *bufio.Writer, m raftpb.Message, scratch []byte) ([]byte, error) {
	size := m.Size()
	if size > maxFrame {
		return scratch, fmt.Errorf("%w: a %s message of %d bytes is over the %d-byte frame limit", errUnsendable, m.Type, size, maxFrame)
	}
	if cap(scratch) < 4+size {
		scratch = make([]byte, 4+size)
	}
	scratch = scratch[:4+size]
	binary.BigEndian.PutUint32(scratch, uint32(size))
	if _, err := m.MarshalTo(scratch[4:]); err != nil {
		return scratch, fmt.Errorf("%w: marshalling a %s message: %w", errUnsendable, m.Type, err)
	}
	_, err := w.Write(scratch)
	return scratch, err
}

// readFrame reads one frame of at most limit bytes.
func readFrame(r *bufio.Reader, limit uint32) (raftpb.Message, error) {
	var m raftpb.Message
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return m, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > limit {
		return m, fmt.Errorf("a frame of %d bytes is over the %d-byte limit", size, limit)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(r, buf); err != nil {
		return m, fmt.Errorf("reading a %d-byte frame: %w", size, err)
	}
	if err := m.Unmarshal(buf); err != nil {
		return m, fmt.Errorf("decoding a message: %w", err)
	}
	return m, nil
}
