package raftnode

// The peer transport's sender: one goroutine per peer draining a
// bounded queue onto one long-lived connection, and snapshots on a
// connection of their own. Apart from the wire (peers_wire.go) so that
// the batching and the back-off can be read on their own.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// tcpPeer is one peer's outbound side: a queue and the writer goroutine
// that owns the connection.
type tcpPeer struct {
	t      *tcpPeers
	id     uint64
	addr   string
	queue  chan raftpb.Message
	ctx    context.Context // cancelled when the peer is removed or changed, or on Close
	cancel context.CancelFunc
	// learned is set while the address came from the peer's hello rather
	// than SetPeer; guarded by tcpPeers.mu.
	learned bool

	scratch []byte // the writer's marshalling buffer

	// down is set once raft has been told the peer is unreachable, so
	// that a burst of drops tells it once; a successful write clears it.
	down atomic.Bool
}

func (p *tcpPeer) dropped(m raftpb.Message, why string) {
	p.t.metrics.dropped.Inc()
	p.t.log.Debug("raft message dropped", "to", p.id, "addr", p.addr, "type", m.Type, "reason", why)
	if !p.down.Swap(true) {
		p.t.reportUnreachable(p.id)
	}
}

// run is the peer's writer: it dials when there is something to send,
// writes everything queued as one batch, and after a failure drops what
// comes until the next dial is due.
func (p *tcpPeer) run() {
	var (
		conn     net.Conn
		w        *bufio.Writer
		backoff  = redialMin
		nextDial time.Time
	)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var m raftpb.Message
		select {
		case m = <-p.queue:
		case <-p.ctx.Done():
			return
		}
		if conn == nil {
			if time.Now().Before(nextDial) {
				p.dropped(m, "peer unreachable")
				continue
			}
			c, err := p.t.dial(p.ctx, p.addr, connStream)
			if err != nil {
				if p.ctx.Err() != nil {
					return
				}
				if !p.down.Load() {
					p.t.log.Warn("cannot reach peer", "to", p.id, "addr", p.addr, "err", err)
				}
				nextDial = time.Now().Add(backoff)
				backoff = min(2*backoff, redialMax)
				p.dropped(m, "dial failed")
				continue
			}
			conn, backoff = c, redialMin
			if w == nil {
				w = bufio.NewWriterSize(conn, 64<<10)
			} else {
				w.Reset(conn)
			}
		}
		_ = conn.SetWriteDeadline(time.Now().Add(peerWriteTimeout))
		n, err := p.writeBatch(w, m)
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.t.log.Warn("lost the connection to a peer", "to", p.id, "addr", p.addr, "err", err)
			conn.Close()
			conn = nil
			p.t.metrics.dropped.Add(float64(n))
			if !p.down.Swap(true) {
				p.t.reportUnreachable(p.id)
			}
			continue // redial at once: the peer may have restarted
		}
		p.down.Store(false)
	}
}

// writeBatch writes m and every message queued behind it to w, then
// flushes once: under load many messages share one syscall, and a lone
// message waits for nothing. n counts the messages taken, m included.
func (p *tcpPeer) writeBatch(w *bufio.Writer, m raftpb.Message) (n int, err error) {
	for n = 1; ; n++ {
		p.scratch, err = writeFrame(w, m, p.scratch)
		if errors.Is(err, errUnsendable) {
			// Nothing was written: drop this one alone.
			p.t.log.Error("raft message not sent", "to", p.id, "err", err)
			p.t.metrics.dropped.Inc()
		} else if err != nil {
			return n, err
		}
		select {
		case m = <-p.queue:
		default:
			if cap(p.scratch) > 1<<20 {
				p.scratch = nil // keep no large message's buffer for good
			}
			return n, w.Flush()
		}
	}
}

// sendSnapshot delivers one MsgSnap on a connection of its own and tells
// raft how it went.
func (p *tcpPeer) sendSnapshot(m raftpb.Message) {
	status := etcdraft.SnapshotFailure
	defer func() { p.t.reportSnapshot(p.id, status) }()
	err := p.deliverSnapshot(m)
	if err != nil {
		if p.ctx.Err() == nil {
			p.t.log.Warn("snapshot not delivered", "to", p.id, "addr", p.addr, "index", m.Snapshot.Metadata.Index, "err", err)
		}
		p.t.metrics.dropped.Inc()
		p.t.reportUnreachable(p.id)
		return
	}
	status = etcdraft.SnapshotFinish
}

func (p *tcpPeer) deliverSnapshot(m raftpb.Message) error {
	size := m.Size()
	if size > maxSnapshotFrame {
		return fmt.Errorf("the snapshot message is %d bytes, the limit is %d", size, maxSnapshotFrame)
	}
	buf := make([]byte, 4+size)
	binary.BigEndian.PutUint32(buf, uint32(size))
	if _, err := m.MarshalTo(buf[4:]); err != nil {
		return fmt.Errorf("marshalling the snapshot: %w", err)
	}
	conn, err := p.t.dial(p.ctx, p.addr, connSnapshot)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A deadline per chunk rather than one for the whole: a large
	// snapshot may take long, but never long without progress.
	for len(buf) > 0 {
		n := min(len(buf), snapshotChunk)
		_ = conn.SetWriteDeadline(time.Now().Add(peerWriteTimeout))
		if _, err := conn.Write(buf[:n]); err != nil {
			return fmt.Errorf("sending the snapshot: %w", err)
		}
		buf = buf[n:]
	}
	_ = conn.SetWriteDeadline(time.Time{})
	var status [1]byte
	if _, err := io.ReadFull(conn, status[:]); err != nil {
		return fmt.Errorf("waiting for the peer to take the snapshot: %w", err)
	}
	if status[0] != snapshotTaken {
		return errors.New("the peer's raft refused the snapshot")
	}
	return nil
}
