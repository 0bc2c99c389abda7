package raftnode

import (
	"context"
	"encoding/binary"
	"fmt"
)

type readResult struct {
	index uint64
	err   error
}

type readBatch struct {
	done  chan struct{}
	index uint64
	err   error
}

// readIndex returns an index that covers every entry committed before it
// was called, confirmed by a quorum that still follows this leader
// (ReadIndex, raft thesis §6.4). Concurrent callers share a round.
func (e *engine) readIndex(ctx context.Context) (uint64, error) {
	e.readMu.Lock()
	b := e.pendingRead
	if b == nil {
		b = &readBatch{done: make(chan struct{})}
		e.pendingRead = b
	}
	e.readMu.Unlock()
	select {
	case e.readSignal <- struct{}{}:
	default:
	}
	select {
	case <-b.done:
		return b.index, b.err
	case <-ctx.Done():
		return 0, fmt.Errorf("raftnode: read: %w", ctx.Err())
	}
}

// readLoop runs one ReadIndex round at a time for whoever has gathered
// in pendingRead meanwhile.
func (e *engine) readLoop() {
	defer e.wg.Done()
	for {
		select {
		case <-e.readSignal:
		case <-e.stop:
			e.readMu.Lock()
			b := e.pendingRead
			e.pendingRead = nil
			e.readMu.Unlock()
			if b != nil {
				b.err = ErrClosed
				close(b.done)
			}
			return
		}
		e.readMu.Lock()
		b := e.pendingRead
		e.pendingRead = nil
		e.readMu.Unlock()
		if b == nil {
			continue
		}
		b.index, b.err = e.readRound()
		close(b.done)
	}
}

func (e *engine) readRound() (uint64, error) {
	// A leader's commit index covers the previous leaders' entries only
	// once an entry of its own term commits: raft holds read requests
	// back until then, except in a one-voter cluster, which answers with
	// whatever commit index it restarted with. A barrier settles both.
	// A follower's round (Sync) is the leader's to settle: raft sends it
	// there and the leader holds it back the same way.
	if term := e.term.Load(); e.isLeader() && e.readyTerm.Load() != term {
		// Bounded loosely: a step-down fails it at once (failWaiters),
		// and the callers' own contexts bound their waits.
		ctx, cancel := context.WithTimeout(context.Background(), defaultApplyTimeout)
		_, err := e.propose(ctx, "read", nil)
		cancel()
		if err != nil {
			return 0, err
		}
		e.readyTerm.Store(term)
	}
	id := e.nextReadID.Add(1)
	ch := make(chan readResult, 1)
	e.readMu.Lock()
	e.readWaiters[id] = ch
	e.readMu.Unlock()
	defer func() {
		e.readMu.Lock()
		delete(e.readWaiters, id)
		e.readMu.Unlock()
	}()
	// A round whose leader steps down is answered by failReads; one
	// whose quorum is unreachable waits for check-quorum to step it down.
	// The timeout is only a backstop: a loaded machine may take long to
	// confirm, and the callers' contexts bound their own waits.
	ctx, cancel := context.WithTimeout(context.Background(), defaultApplyTimeout)
	defer cancel()
	rctx := make([]byte, 8)
	binary.BigEndian.PutUint64(rctx, id)
	if err := e.raft().ReadIndex(ctx, rctx); err != nil {
		return 0, e.proposeError("read", err)
	}
	select {
	case r := <-ch:
		return r.index, r.err
	case <-ctx.Done():
		if !e.isLeader() {
			return 0, e.n.notLeader()
		}
		return 0, fmt.Errorf("raftnode: read: no quorum confirmed this leader: %w", ErrLeadershipLost)
	case <-e.stop:
		return 0, ErrClosed
	}
}

func (e *engine) readDone(id uint64, r readResult) {
	e.readMu.Lock()
	ch := e.readWaiters[id]
	delete(e.readWaiters, id)
	e.readMu.Unlock()
	if ch != nil {
		ch <- r
	}
}

// failReads answers the read rounds in flight when the term moves: their
// confirmation will not come from this term's leader.
func (e *engine) failReads() {
	e.readMu.Lock()
	defer e.readMu.Unlock()
	for id, ch := range e.readWaiters {
		delete(e.readWaiters, id)
		ch <- readResult{err: e.n.notLeader()}
	}
}
