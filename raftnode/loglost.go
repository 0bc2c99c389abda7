package raftnode

import (
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
)

// LogLostError is ErrLogLost with what showed it.
type LogLostError struct {
	// Leader names the leader that sent the proof: its node ID when this
	// node knows it, else its raft ID in hex. Commit is the index up to which it knows this node's log reached;
	// LastIndex where this node's log ends.
	Leader            string
	Commit, LastIndex uint64
}

func (e *LogLostError) Error() string {
	return fmt.Sprintf("raft log lost: leader %s knows this node's log reached index %d, and it ends at %d: the data dir was emptied or replaced while the node stayed a member",
		e.Leader, e.Commit, e.LastIndex)
}

// Unwrap makes errors.Is(err, ErrLogLost) hold.
func (e *LogLostError) Unwrap() error { return ErrLogLost }

// LogLost reports whether m proves that the log of a node whose log ends
// at last is lost: a leader's heartbeat carries the commit index up to
// what it knows this follower holds (the least of its match index and
// its own commit index), and a follower acknowledges entries only once
// they are durable. Committed entries are never cut from a log, so a
// commit index past the end of this node's log means the log it
// acknowledged is gone. Raft would panic on it (commitTo). It is
// exported so that internal/sim stops a node on the same proof.
func LogLost(m raftpb.Message, last uint64) bool {
	return m.Type == raftpb.MsgHeartbeat && m.Commit > last
}

// checkLog refuses every message once the node has failed, and fails it
// on the proof of a lost log (LogLost).
func (e *engine) checkLog(m raftpb.Message) error {
	select {
	case <-e.failed:
		return e.failErr
	default:
	}
	if last := e.lastIndex.Load(); LogLost(m, last) {
		leader := fmt.Sprintf("%x", m.From)
		e.members.mu.RLock()
		if mi, ok := e.members.byID[m.From]; ok && mi.ID != "" {
			leader = mi.ID
		}
		e.members.mu.RUnlock()
		e.fail(&LogLostError{Leader: leader, Commit: m.Commit, LastIndex: last})
		return e.failErr
	}
	return nil
}

// fail records err as the reason the node can no longer take part in
// its cluster, once, and closes failed.
func (e *engine) fail(err error) {
	e.failOnce.Do(func() {
		e.failErr = err
		e.n.log.Error("raft: this node cannot go on as a member of its cluster; it takes no more raft traffic", "err", err)
		close(e.failed)
	})
}

// Failed is closed when this node can no longer take part in its
// cluster, for the reason Err gives (ErrLogLost): the caller should stop
// it and tell the operator. It is never closed otherwise, Close included.
func (n *Node) Failed() <-chan struct{} { return n.engine.failed }

// Err is why Failed was closed; nil while it is not.
func (n *Node) Err() error {
	select {
	case <-n.engine.failed:
		return n.engine.failErr
	default:
		return nil
	}
}
