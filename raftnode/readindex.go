package raftnode

// The read index (raft thesis §6.4): a linearizable read learns from a
// quorum that this node still leads, and at which commit index, and then
// waits for the state to be applied that far. Its state is apart from
// the proposals' because a read appends nothing: it never waits on a
// log entry, only on a round of heartbeats, shared by every read that
// gathered while the previous round ran.

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// readRounds gathers concurrent reads into one ReadIndex round at a
// time. Readers join the pending batch; readLoop takes it and runs its
// round; the Ready loop hands raft's answers (ReadStates) to done.
type readRounds struct {
	mu      sync.Mutex // guards pending and waiting
	pending *readBatch // the batch the next round answers; nil when none gathered
	waiting map[uint64]chan readResult
	signal  chan struct{} // wakes readLoop; holds one value
	nextID  atomic.Uint64
	// readyTerm is the term in which this leader's barrier was applied;
	// a round waits for one first (readRound says why).
	readyTerm atomic.Uint64
}

type readResult struct {
	index uint64
	err   error
}

// readBatch is the readers waiting on one round: done is closed once
// index or err is set.
type readBatch struct {
	done  chan struct{}
	index uint64
	err   error
}

// newReadRounds starts round IDs at the clock, so that an answer to a
// round of a previous run of this node can never match one of this run.
func newReadRounds() *readRounds {
	r := &readRounds{waiting: map[uint64]chan readResult{}, signal: make(chan struct{}, 1)}
	r.nextID.Store(uint64(time.Now().UnixNano()))
	return r
}

// join adds the caller to the pending batch and wakes readLoop.
func (r *readRounds) join() *readBatch {
	r.mu.Lock()
	b := r.pending
	if b == nil {
		b = &readBatch{done: make(chan struct{})}
		r.pending = b
	}
	r.mu.Unlock()
	select {
	case r.signal <- struct{}{}:
	default:
	}
	return b
}

// take hands the pending batch to the round about to run.
func (r *readRounds) take() *readBatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.pending
	r.pending = nil
	return b
}

// expect registers a round's ID, whose answer done delivers on the
// returned channel; the caller calls the returned func when it stops
// waiting.
func (r *readRounds) expect() (id uint64, answer <-chan readResult, stop func()) {
	id = r.nextID.Add(1)
	ch := make(chan readResult, 1)
	r.mu.Lock()
	r.waiting[id] = ch
	r.mu.Unlock()
	return id, ch, func() {
		r.mu.Lock()
		delete(r.waiting, id)
		r.mu.Unlock()
	}
}

// done answers round id, if it is still awaited.
func (r *readRounds) done(id uint64, res readResult) {
	r.mu.Lock()
	ch := r.waiting[id]
	delete(r.waiting, id)
	r.mu.Unlock()
	if ch != nil {
		ch <- res
	}
}

// failAll answers the rounds in flight with the error why gives when
// the term moves: their confirmation will not come from this term's
// leader. why is called only when a round is in flight.
func (r *readRounds) failAll(why func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, ch := range r.waiting {
		delete(r.waiting, id)
		ch <- readResult{err: why()}
	}
}

// readIndex returns an index that covers every entry committed before it
// was called, confirmed by a quorum that still follows this leader.
// Concurrent callers share a round.
func (e *engine) readIndex(ctx context.Context) (uint64, error) {
	b := e.reads.join()
	select {
	case <-b.done:
		return b.index, b.err
	case <-ctx.Done():
		return 0, fmt.Errorf("raftnode: read: %w", ctx.Err())
	}
}

// readLoop runs one ReadIndex round at a time for whoever has gathered
// in the pending batch meanwhile.
func (e *engine) readLoop() {
	defer e.wg.Done()
	for {
		select {
		case <-e.reads.signal:
		case <-e.stop:
			if b := e.reads.take(); b != nil {
				b.err = ErrClosed
				close(b.done)
			}
			return
		}
		b := e.reads.take()
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
	if term := e.term.Load(); e.isLeader() && e.reads.readyTerm.Load() != term {
		// Bounded loosely: a step-down fails it at once (failBefore),
		// and the callers' own contexts bound their waits.
		ctx, cancel := context.WithTimeout(context.Background(), defaultApplyTimeout)
		_, err := e.propose(ctx, "read", nil)
		cancel()
		if err != nil {
			return 0, err
		}
		e.reads.readyTerm.Store(term)
	}
	id, answer, stop := e.reads.expect()
	defer stop()
	// A round whose leader steps down is answered by failAll; one
	// whose quorum is unreachable waits for check-quorum to step it down.
	// The timeout is only a backstop: a loaded machine may take long to
	// confirm, and the callers' contexts bound their own waits.
	ctx, cancel := context.WithTimeout(context.Background(), defaultApplyTimeout)
	defer cancel()
	rctx := make([]byte, 8)
	binary.BigEndian.PutUint64(rctx, id)
	if term := e.leaderTerm(); term != 0 {
		e.lease.Begin(id, term, time.Now())
	}
	if err := e.raft().ReadIndex(ctx, rctx); err != nil {
		return 0, e.proposeError("read", err)
	}
	select {
	case r := <-answer:
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
