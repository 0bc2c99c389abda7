package raftnode

// The synchronous core of the Ready loop: the order in which one Ready's
// work is done, with no goroutine, clock, channel or file of its own.
// Its caller steps it and supplies the effects, so that the engine's
// Ready loop (ready.go) and internal/sim's single-goroutine scheduler
// run the same order rather than two copies of it: what must be durable
// before which message leaves, when committed entries are applied, and
// how a failed write is retried.

import (
	"encoding/binary"
	"errors"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// RetryWrite is how long a driver waits before writing a Ready again
// after its write or sync failed (a full disk, say).
const RetryWrite = time.Second

// LogWriter is where a Ready's durable state goes: the WAL, its meta
// store and the snapshot files in the engine, the simulated disk in
// internal/sim. A write need not be synced when the call returns: the
// driver tells the core when it is (ReadyCore.Synced).
type LogWriter interface {
	SaveSnapshot(snap raftpb.Snapshot) error
	SaveHardState(hs raftpb.HardState) error
	Append(ents []raftpb.Entry) error
}

// RaftLog is raft's own storage (a MemoryStorage), which takes a Ready's
// snapshot, entries and hard state once they are durable, and not
// before: raft reads its log from it, and a node's answers must never
// rest on what a crash could take back.
type RaftLog interface {
	ApplySnapshot(snap raftpb.Snapshot) error
	Append(ents []raftpb.Entry) error
	SetHardState(hs raftpb.HardState) error
}

// Sender sends raft's messages to their peers, in order.
type Sender interface {
	Send(msgs []raftpb.Message)
}

// ApplyBatch is one Ready's work for apply, to be done in this order: a
// snapshot to restore, entries to apply, then the proposals to fail
// because the term moved on (Term) or this node stepped down.
type ApplyBatch struct {
	Snapshot *raftpb.Snapshot
	Entries  []raftpb.Entry
	Term     uint64 // the term rose to this one; 0: it did not
	StepDown bool
	// Durable: the Ready's write is already durable (a batch with a
	// snapshot is handed over after the write, every other before it).
	Durable bool
}

// Applier applies committed entries: the engine hands them to its apply
// goroutine, internal/sim applies them at once.
type Applier interface {
	// Apply takes a batch; false means the node is stopping.
	Apply(b ApplyBatch) bool
	// Persisted says the Ready's write is durable, and so in raft's
	// storage: a snapshot may be taken at the entries it applied.
	Persisted()
}

// ReadyHost is the rest of the node a Ready's work reaches.
type ReadyHost interface {
	// SetRole publishes raft's role and leader and reports whether this
	// node stopped leading.
	SetRole(role etcdraft.StateType, lead uint64) (steppedDown bool)
	// HardState publishes a Ready's hard state as the Ready arrives.
	HardState(hs raftpb.HardState)
	// ReadIndex answers the read-index round req: reads may be served
	// once apply reaches index.
	ReadIndex(req, index uint64)
	// FailReads fails every read-index round in flight: this node
	// stopped leading, the term moved on, or the log cannot be written.
	FailReads()
	// FailProposals fails every proposal in flight, outcome unknown: the
	// log cannot be written, so another node will lead, and the entries
	// may commit there.
	FailProposals()
	// WriteFailed reports a failed write or sync; attempt counts from 0.
	WriteFailed(err error, attempt int)
	// Resumed: a write succeeded after failing. Raft never learnt of the
	// pause, so no Ready will say the role changed: the host publishes
	// raft's own view of it again.
	Resumed()
}

// ReadyEffects are what a ReadyCore does its work with.
type ReadyEffects struct {
	Log   LogWriter
	Raft  RaftLog
	Send  Sender
	Apply Applier
	Host  ReadyHost
	// Advance tells raft that the Ready is done (Node.Advance,
	// RawNode.Advance); false means the node is stopping.
	Advance func(rd etcdraft.Ready) bool
	// Split divides a Ready's messages into those sent before the write
	// and those held until it is durable. nil is SplitMessages, what the
	// engine runs; internal/sim wraps it for a deliberately wrong build.
	Split func(msgs []raftpb.Message) (now, later []raftpb.Message)
}

// ReadyCore does one Ready's work at a time, stepped by its driver:
//
//	Begin(rd)  the role and hard state published; the messages that need
//	           nothing durable sent, above all the leader's appends, which
//	           followers write while the leader writes its own copy; the
//	           committed entries handed to apply unless the Ready holds a
//	           snapshot: they are durable on a quorum already, so they are
//	           applied while this Ready's write is under way, as etcd's
//	           server does, else every commit would wait for the next
//	           write too.
//	Write()    the snapshot, hard state and entries written.
//	           The driver makes them durable, then calls
//	Synced()   raft's storage takes them; a snapshot and the entries
//	           after it handed to apply; votes and append
//	           acknowledgements, which promise the write, sent.
//	Advance()  read-index rounds answered, raft advanced.
//
// A failed write or sync is reported with Failed, and the driver calls
// Write again, the whole Ready, after RetryWrite: nothing after it may
// happen before it, and the node stops heartbeating meanwhile, so that
// another node leads. The engine's Ready loop calls these in a row on
// its goroutine, its writes synced as they return; internal/sim calls
// them from its scheduler, its disk holding the writes in a page cache
// until a later event syncs them, or fails to.
type ReadyCore struct {
	fx   ReadyEffects
	term uint64 // the highest term a Ready has carried

	// The Ready in progress.
	rd      etcdraft.Ready
	later   []raftpb.Message
	batch   ApplyBatch
	attempt int
}

// NewReadyCore returns a core for a node whose durable hard state has
// term.
func NewReadyCore(fx ReadyEffects, term uint64) *ReadyCore {
	if fx.Split == nil {
		fx.Split = SplitMessages
	}
	return &ReadyCore{fx: fx, term: term}
}

// Begin starts rd's work; false means the node is stopping.
func (c *ReadyCore) Begin(rd etcdraft.Ready) bool {
	c.rd, c.attempt = rd, 0
	c.batch = ApplyBatch{Entries: rd.CommittedEntries}
	if rd.SoftState != nil {
		c.batch.StepDown = c.fx.Host.SetRole(rd.SoftState.RaftState, rd.SoftState.Lead)
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if rd.HardState.Term > c.term {
			c.batch.Term = rd.HardState.Term
			c.term = rd.HardState.Term
		}
		c.fx.Host.HardState(rd.HardState)
	}
	now, later := c.fx.Split(rd.Messages)
	c.fx.Send.Send(now)
	c.later = later
	hasWork := len(c.batch.Entries) > 0 || c.batch.StepDown || c.batch.Term > 0
	if etcdraft.IsEmptySnap(rd.Snapshot) && hasWork {
		return c.fx.Apply.Apply(c.batch)
	}
	return true
}

// Write writes the Ready's snapshot, hard state and entries, all of
// them again after a failure.
func (c *ReadyCore) Write() error {
	if !etcdraft.IsEmptySnap(c.rd.Snapshot) {
		if err := c.fx.Log.SaveSnapshot(c.rd.Snapshot); err != nil {
			return err
		}
	}
	if !etcdraft.IsEmptyHardState(c.rd.HardState) {
		if err := c.fx.Log.SaveHardState(c.rd.HardState); err != nil {
			return err
		}
	}
	return c.fx.Log.Append(c.rd.Entries)
}

// Failed reports that the write, or its sync, failed. The first failure
// stops this node acting as leader at once: calls that need the leader
// fail, naming the disk, instead of waiting on a write that cannot
// happen, and what is in flight fails as a lost leadership, since it may
// still commit on the others.
func (c *ReadyCore) Failed(err error) {
	if c.attempt == 0 {
		c.fx.Host.SetRole(etcdraft.StateFollower, 0)
		c.fx.Host.FailProposals()
		c.fx.Host.FailReads()
	}
	c.fx.Host.WriteFailed(err, c.attempt)
	c.attempt++
}

// errStopping is Synced's report that the applier refused a snapshot
// because the node is stopping.
var errStopping = errors.New("raftnode: stopping")

// Synced is told that the write is durable. An error from raft's
// storage (which a MemoryStorage never returns) is for the driver to
// report with Failed and retry as a failed write; IsStopping tells the
// node stopping from it.
func (c *ReadyCore) Synced() error {
	rd := c.rd
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		if err := c.fx.Raft.ApplySnapshot(rd.Snapshot); err != nil && !errors.Is(err, etcdraft.ErrSnapOutOfDate) {
			return err
		}
	}
	if err := c.fx.Raft.Append(rd.Entries); err != nil {
		return err
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if err := c.fx.Raft.SetHardState(rd.HardState); err != nil {
			return err
		}
	}
	if c.attempt > 0 {
		c.fx.Host.Resumed()
	}
	c.fx.Apply.Persisted()
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		snap := rd.Snapshot
		c.batch.Snapshot = &snap
		c.batch.Durable = true
		if !c.fx.Apply.Apply(c.batch) {
			return errStopping
		}
	}
	c.fx.Send.Send(c.later)
	return nil
}

// IsStopping reports whether Synced's error means the node is stopping.
func IsStopping(err error) bool { return errors.Is(err, errStopping) }

// Later is what Synced sent: the messages held until the write was
// durable.
func (c *ReadyCore) Later() []raftpb.Message { return c.later }

// Advance answers the Ready's read-index rounds and tells raft the Ready
// is done; false means the node is stopping.
func (c *ReadyCore) Advance() bool {
	for _, rs := range c.rd.ReadStates {
		c.fx.Host.ReadIndex(binary.BigEndian.Uint64(rs.RequestCtx), rs.Index)
	}
	if c.batch.StepDown || c.batch.Term > 0 {
		c.fx.Host.FailReads()
	}
	rd := c.rd
	c.rd, c.later, c.batch = etcdraft.Ready{}, nil, ApplyBatch{}
	return c.fx.Advance(rd)
}

// SplitMessages splits a Ready's messages into those that may be sent
// before the Ready's write is durable and those that must wait for it:
// votes and append acknowledgements, which promise that the write is
// done (the same split raft makes itself with asynchronous storage
// writes). Each keeps raft's order.
func SplitMessages(msgs []raftpb.Message) (now, later []raftpb.Message) {
	now = msgs[:0:0]
	for _, m := range msgs {
		switch m.Type {
		case raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
			later = append(later, m)
		default:
			now = append(now, m)
		}
	}
	return now, later
}
