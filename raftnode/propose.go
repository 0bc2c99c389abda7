package raftnode

// Proposals: appending a command on the leader and waiting for its entry
// to be applied here. The waiters are their own type because three
// goroutines touch them (the proposer, apply that answers, the Ready
// loop that fails them on a term change), and the framing of a proposed
// entry (proposalHeader) is what lets apply tell this node's proposals
// from everyone else's.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/tenurehq/tenure/statemachine"
)

// proposalHeader prefixes every normal entry this engine proposes: the
// proposer's raft ID and its request number. An entry with only the
// header is a barrier; one with none is raft's own empty entry.
const proposalHeader = 16

// FrameProposal is the entry data the engine proposes for cmd: the
// proposer's raft ID from and its request number req, then cmd. It and
// ParseProposal are exported so that internal/sim frames and reads
// entries as the engine does.
func FrameProposal(from, req uint64, cmd []byte) []byte {
	data := make([]byte, proposalHeader+len(cmd))
	binary.BigEndian.PutUint64(data, from)
	binary.BigEndian.PutUint64(data[8:], req)
	copy(data[proposalHeader:], cmd)
	return data
}

// ParseProposal reads a normal entry's data back: ok is false for raft's
// own empty entry (no header), and cmd is empty for a barrier.
func ParseProposal(data []byte) (from, req uint64, cmd []byte, ok bool) {
	if len(data) < proposalHeader {
		return 0, 0, nil, false
	}
	return binary.BigEndian.Uint64(data), binary.BigEndian.Uint64(data[8:]), data[proposalHeader:], true
}

// proposals are this node's proposals waiting for their entries to be
// applied. Each is tagged with a request number, which apply reads back
// from the entry to answer the proposer and nobody else; a term change
// fails the proposals of older terms, since their entries may or may not
// commit. The Ready loop, apply and the proposers all reach it, so it
// keeps its own lock rather than borrowing the engine's.
type proposals struct {
	mu      sync.Mutex // guards next and waiting
	next    uint64     // the last request number handed out
	waiting map[uint64]*waiter
}

type waiter struct {
	term uint64              // the term it was proposed in
	done chan proposalResult // buffered: apply never blocks on a waiter
}

type proposalResult struct {
	res statemachine.Result
	err error
}

// newProposals starts request numbers at the clock, so that a restarted
// node never reuses one an entry still in its log carries.
func newProposals() *proposals {
	return &proposals{next: uint64(time.Now().UnixNano()), waiting: map[uint64]*waiter{}}
}

// register makes a waiter for a proposal this node is about to make in
// term.
func (p *proposals) register(term uint64) (uint64, *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	w := &waiter{term: term, done: make(chan proposalResult, 1)}
	p.waiting[p.next] = w
	return p.next, w
}

// forget drops a waiter whose proposer gave up or never appended.
func (p *proposals) forget(req uint64) {
	p.mu.Lock()
	delete(p.waiting, req)
	p.mu.Unlock()
}

// answer hands r to the proposer of req, if it still waits.
func (p *proposals) answer(req uint64, r proposalResult) {
	p.mu.Lock()
	w := p.waiting[req]
	delete(p.waiting, req)
	p.mu.Unlock()
	if w != nil {
		w.done <- r
	}
}

// failBefore fails the proposals registered before term (all of them
// for 0) with ErrLeadershipLost: their entries may still commit, or may
// have been overwritten.
func (p *proposals) failBefore(term uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for req, w := range p.waiting {
		if term == 0 || w.term < term {
			delete(p.waiting, req)
			w.done <- proposalResult{err: ErrLeadershipLost}
		}
	}
}

// propose appends header+cmd and waits for it to be applied here.
func (e *engine) propose(ctx context.Context, op string, cmd []byte) (statemachine.Result, error) {
	if !e.isLeader() {
		return statemachine.Result{}, e.n.notLeader()
	}
	req, w := e.proposals.register(e.term.Load())
	if err := e.raft().Propose(ctx, FrameProposal(e.rid, req, cmd)); err != nil {
		e.proposals.forget(req)
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
		e.proposals.forget(req)
		return statemachine.Result{}, fmt.Errorf("raftnode: %s: %w", op, ctx.Err())
	case <-e.stop:
		e.proposals.forget(req)
		return statemachine.Result{}, ErrClosed
	}
}

// proposeError maps a refused proposal: dropped means it was never
// appended (not leader, a leadership transfer under way, or the leader's
// uncommitted tail at Config.MaxLogMemoryBytes), so the caller may send
// it again, elsewhere or later.
func (e *engine) proposeError(op string, err error) error {
	switch {
	case errors.Is(err, etcdraft.ErrProposalDropped):
		if e.isLeader() {
			// Transferring, or the uncommitted tail is full: as good as
			// not leader for now.
			return &NotLeaderError{}
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
