package raftnode

import (
	"context"
	"errors"
	"sync"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// rawRaft is raft's RawNode behind a mutex, with the methods of
// etcdraft.Node the engine calls. It replaces etcdraft.Node, whose own
// goroutine (node.run) every proposal, message and Ready went through:
// a proposal was a channel send to that goroutine, its Ready another to
// the Ready loop, and its Advance a third back. A trace of one client's
// Lock+Unlock pairs counted three wake-ups of node.run per commit, a
// third of all the goroutine hand-offs a commit made. Here a caller
// steps raft itself, on its own goroutine, under the mutex, and pokes
// the Ready loop, which takes the Ready under the mutex too and does its
// work (writing the WAL above all) without it, so that proposals and
// messages keep being stepped while a write is under way, as node.run
// allowed.
//
// The rules of RawNode that node.run kept are kept here: one Ready at a
// time, the next only after Advance (the Ready loop alone calls Ready
// and Advance); messages of local types from the wire dropped, and
// responses from peers that left the configuration too (Step).
type rawRaft struct {
	mu      sync.Mutex
	rn      *etcdraft.RawNode
	stopped bool
	// wake tells the Ready loop there may be a Ready: anything stepped
	// may make one. Its buffer of one coalesces pokes made while the loop
	// is busy.
	wake chan struct{}
}

// newRawRaft starts raft on c, bootstrapped with peers when there are any
// (etcdraft.StartNode), else restarted from c.Storage
// (etcdraft.RestartNode).
func newRawRaft(c *etcdraft.Config, peers []etcdraft.Peer) (*rawRaft, error) {
	rn, err := etcdraft.NewRawNode(c)
	if err != nil {
		return nil, err
	}
	if len(peers) > 0 {
		if err := rn.Bootstrap(peers); err != nil {
			return nil, err
		}
	}
	return &rawRaft{rn: rn, wake: make(chan struct{}, 1)}, nil
}

// poke wakes the Ready loop, if it is not awake already.
func (r *rawRaft) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// do runs f on the RawNode under the mutex and pokes the Ready loop;
// ErrStopped once Stop was called.
func (r *rawRaft) do(f func(rn *etcdraft.RawNode) error) error {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return etcdraft.ErrStopped
	}
	err := f(r.rn)
	r.mu.Unlock()
	r.poke()
	return err
}

func (r *rawRaft) Tick() {
	_ = r.do(func(rn *etcdraft.RawNode) error { rn.Tick(); return nil })
}

func (r *rawRaft) Propose(_ context.Context, data []byte) error {
	return r.do(func(rn *etcdraft.RawNode) error { return rn.Propose(data) })
}

func (r *rawRaft) ProposeConfChange(_ context.Context, cc raftpb.ConfChangeI) error {
	return r.do(func(rn *etcdraft.RawNode) error { return rn.ProposeConfChange(cc) })
}

// Step steps a message from a peer. As etcdraft.Node's Step did, it
// drops what raft refuses from the wire without an error: messages of
// local types, and responses from nodes no longer in the configuration.
func (r *rawRaft) Step(_ context.Context, m raftpb.Message) error {
	err := r.do(func(rn *etcdraft.RawNode) error { return rn.Step(m) })
	if errors.Is(err, etcdraft.ErrStepLocalMsg) || errors.Is(err, etcdraft.ErrStepPeerNotFound) {
		return nil
	}
	return err
}

func (r *rawRaft) ReadIndex(_ context.Context, rctx []byte) error {
	return r.do(func(rn *etcdraft.RawNode) error { rn.ReadIndex(rctx); return nil })
}

func (r *rawRaft) ReportUnreachable(id uint64) {
	_ = r.do(func(rn *etcdraft.RawNode) error { rn.ReportUnreachable(id); return nil })
}

func (r *rawRaft) ReportSnapshot(id uint64, status etcdraft.SnapshotStatus) {
	_ = r.do(func(rn *etcdraft.RawNode) error { rn.ReportSnapshot(id, status); return nil })
}

// TransferLeadership asks this node, the leader, to hand leadership to
// transferee.
func (r *rawRaft) TransferLeadership(_ context.Context, _, transferee uint64) {
	_ = r.do(func(rn *etcdraft.RawNode) error { rn.TransferLeader(transferee); return nil })
}

func (r *rawRaft) ApplyConfChange(cc raftpb.ConfChangeI) *raftpb.ConfState {
	var cs *raftpb.ConfState
	if err := r.do(func(rn *etcdraft.RawNode) error { cs = rn.ApplyConfChange(cc); return nil }); err != nil {
		return &raftpb.ConfState{}
	}
	return cs
}

func (r *rawRaft) Status() etcdraft.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rn.Status()
}

// Ready returns the next Ready, if there is one. Only the Ready loop may
// call it, and not again before it has called Advance.
func (r *rawRaft) Ready() (etcdraft.Ready, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || !r.rn.HasReady() {
		return etcdraft.Ready{}, false
	}
	return r.rn.Ready(), true
}

// Advance tells raft the last Ready's work is done.
func (r *rawRaft) Advance(rd etcdraft.Ready) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.rn.Advance(rd)
	}
}

// Stop makes every later call a no-op or ErrStopped.
func (r *rawRaft) Stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}
