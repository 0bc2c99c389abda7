package raftnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/tenurehq/tenure/statemachine"
)

// proposalHeader prefixes every normal entry this engine proposes: the
// proposer's raft ID and its request number. An entry with only the
// header is a barrier; one with none is raft's own empty entry.
const proposalHeader = 16

type waiter struct {
	term uint64
	done chan proposalResult // buffered: apply never blocks on a waiter
}

type proposalResult struct {
	res statemachine.Result
	err error
}

// register makes a waiter for a proposal this node is about to make.
func (e *engine) register() (uint64, *waiter) {
	e.waitMu.Lock()
	defer e.waitMu.Unlock()
	e.nextReq++
	w := &waiter{term: e.term.Load(), done: make(chan proposalResult, 1)}
	e.waiters[e.nextReq] = w
	return e.nextReq, w
}

func (e *engine) forget(req uint64) {
	e.waitMu.Lock()
	delete(e.waiters, req)
	e.waitMu.Unlock()
}

func (e *engine) answer(req uint64, r proposalResult) {
	e.waitMu.Lock()
	w := e.waiters[req]
	delete(e.waiters, req)
	e.waitMu.Unlock()
	if w != nil {
		w.done <- r
	}
}

// failWaiters fails the proposals registered before term (all of them
// for 0): their entries may still commit, or may have been overwritten.
func (e *engine) failWaiters(term uint64) {
	e.waitMu.Lock()
	defer e.waitMu.Unlock()
	for req, w := range e.waiters {
		if term == 0 || w.term < term {
			delete(e.waiters, req)
			w.done <- proposalResult{err: ErrLeadershipLost}
		}
	}
}

// propose appends header+cmd and waits for it to be applied here.
func (e *engine) propose(ctx context.Context, op string, cmd []byte) (statemachine.Result, error) {
	if !e.isLeader() {
		return statemachine.Result{}, e.n.notLeader()
	}
	req, w := e.register()
	data := make([]byte, proposalHeader+len(cmd))
	binary.BigEndian.PutUint64(data, e.rid)
	binary.BigEndian.PutUint64(data[8:], req)
	copy(data[proposalHeader:], cmd)
	if err := e.raft().Propose(ctx, data); err != nil {
		e.forget(req)
		return statemachine.Result{}, e.proposeError(op, err)
	}
	return e.await(ctx, op, req, w)
}

func (e *engine) await(ctx context.Context, op string, req uint64, w *waiter) (statemachine.Result, error) {
	select {
	case r := <-w.done:
		if r.err != nil {
			return statemachine.Result{}, fmt.Errorf("raftnode: %s: %w", op, r.err)
		}
		return r.res, nil
	case <-ctx.Done():
		e.forget(req)
		return statemachine.Result{}, fmt.Errorf("raftnode: %s: %w", op, ctx.Err())
	case <-e.stop:
		e.forget(req)
		return statemachine.Result{}, ErrClosed
	}
}

// proposeError maps a refused proposal: dropped means it was never
// appended (not leader, or a leadership transfer under way), so the
// caller may send it elsewhere.
func (e *engine) proposeError(op string, err error) error {
	switch {
	case errors.Is(err, etcdraft.ErrProposalDropped):
		if e.isLeader() {
			return &NotLeaderError{} // transferring: as good as not leader
		}
		return e.n.notLeader()
	case errors.Is(err, etcdraft.ErrStopped):
		return ErrClosed
	default:
		return fmt.Errorf("raftnode: %s: %w", op, err)
	}
}

func (e *engine) isLeader() bool {
	return etcdraft.StateType(e.role.Load()) == etcdraft.StateLeader
}
