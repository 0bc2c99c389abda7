package raftnode

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// etcdEngine runs the replicated log on go.etcd.io/raft/v3, the library
// etcd itself runs. What it buys over hashicorp/raft is the order of a
// commit's work: a leader sends its new entries to the followers before
// it writes them to its own disk (raft thesis §10.2.1), and counts its
// own vote only once its write is durable (the library's self-ack), so a
// commit costs one disk write and a round trip instead of two writes and
// a round trip. Every proposal queued while a write is under way goes
// into the next write: one fsync per batch, as before.
//
// Three goroutines share the work:
//   - run owns the raft node's Ready channel: it sends what needs no
//     durability, writes the log and hard state, sends the rest (votes
//     and append acknowledgements, which must follow the write), and
//     hands committed entries to apply, in order;
//   - apply applies them to the state machine under the state lock,
//     answers the proposals waiting on them, and takes snapshots;
//   - reads batches ReadIndex requests, one round at a time, so that
//     many concurrent linearizable reads cost one quorum round.
//
// Proposals are tagged with this node's raft ID and a request number, so
// that apply can answer the proposer and nobody else; a term change
// fails the proposals of older terms with ErrLeadershipLost, since their
// entries may or may not commit.
type etcdEngine struct {
	n        *Node // the node this engine runs; shares its fsm, metrics and log
	rid      uint64
	self     memberInfo
	cfg      etcdraft.Config // the template for StartNode and RestartNode
	ms       *etcdraft.MemoryStorage
	disk     *diskStorage
	trans    peerTransport
	tick     time.Duration
	snapshot struct {
		threshold, catchUp uint64
	}

	node atomic.Pointer[raftHandle] // replaced once, by BootstrapCluster

	// Published by run for readers on other goroutines.
	role        atomic.Int32 // etcdraft.StateType
	leader      atomic.Uint64
	term        atomic.Uint64
	commit      atomic.Uint64
	lastIndex   atomic.Uint64
	lastContact atomic.Int64 // unix nanoseconds a follower last heard from its leader

	memMu   sync.RWMutex // guards members and conf, which apply changes in log order
	members map[uint64]memberInfo
	conf    raftpb.ConfState

	waitMu  sync.Mutex // guards nextReq and waiters
	nextReq uint64
	waiters map[uint64]*waiter

	confMu sync.Mutex // one membership change at a time: raft refuses a second while one is unapplied

	readMu      sync.Mutex // guards pendingRead and readWaiters
	pendingRead *readBatch
	readWaiters map[uint64]chan readResult
	readSignal  chan struct{}
	nextReadID  atomic.Uint64
	readyTerm   atomic.Uint64 // the term in which a barrier was applied; reads wait for one

	applyCh     chan applyTask
	bootstrapCh chan bootstrapRequest
	snapshotIdx atomic.Uint64 // the index of the last snapshot taken or restored
	snapping    sync.WaitGroup
	snapNow     chan chan error // snapshotNow's requests to apply
	snapWanted  chan struct{}   // raftStorage's: a snapshot to send names a configuration that is out of date
	stop        chan struct{}
	wg          sync.WaitGroup

	failOnce sync.Once
	failed   chan struct{} // closed by fail; failErr is set before
	failErr  error
}

// raftHandle boxes the raft node so that it can be swapped atomically.
type raftHandle struct{ etcdraft.Node }

type waiter struct {
	term uint64
	done chan proposalResult // buffered: apply never blocks on a waiter
}

type proposalResult struct {
	res statemachine.Result
	err error
}

type readResult struct {
	index uint64
	err   error
}

type readBatch struct {
	done  chan struct{}
	index uint64
	err   error
}

// applyTask is one Ready's worth of work for apply, in this order: a
// snapshot to restore, entries to apply, then proposals to fail because
// the term moved on (term) or this node stepped down.
type applyTask struct {
	snap     *raftpb.Snapshot
	ents     []raftpb.Entry
	term     uint64
	stepDown bool
	// confApplied, set when ents hold a configuration change, receives
	// the answers to this node's changes once the batch is applied: run
	// waits for it before Advance, and answers after, as etcd's server
	// does. Raft must not count votes or take the next change under a
	// configuration the state has not caught up with, and it refuses a
	// change proposed before it has been told the last one is applied.
	confApplied chan []resolved
	// persisted is closed once the Ready's own writes are durable, and so
	// in raft's storage: a snapshot may only be taken at an index there.
	persisted chan struct{}
}

type bootstrapRequest struct {
	peers []etcdraft.Peer
	done  chan error
}

// proposalHeader prefixes every normal entry this engine proposes: the
// proposer's raft ID and its request number. An entry with only the
// header is a barrier; one with none is raft's own empty entry.
const proposalHeader = 16

// openEtcd starts the engine on the stores open has opened.
func openEtcd(n *Node, cfg Config, st stores, trans peerTransport) (*etcdEngine, error) {
	e := &etcdEngine{
		n:           n,
		rid:         raftID(cfg.NodeID),
		self:        memberInfo{ID: cfg.NodeID, Addr: trans.LocalAddr()},
		ms:          etcdraft.NewMemoryStorage(),
		disk:        &diskStorage{logs: st.logs, stable: st.stable, snaps: st.snaps, log: n.log},
		trans:       trans,
		members:     map[uint64]memberInfo{},
		waiters:     map[uint64]*waiter{},
		readWaiters: map[uint64]chan readResult{},
		readSignal:  make(chan struct{}, 1),
		applyCh:     make(chan applyTask, 64),
		bootstrapCh: make(chan bootstrapRequest),
		snapNow:     make(chan chan error),
		snapWanted:  make(chan struct{}, 1),
		stop:        make(chan struct{}),
		failed:      make(chan struct{}),
		// Request numbers start at the clock, so that a restarted node
		// never reuses one an entry still in the log carries.
		nextReq: uint64(time.Now().UnixNano()),
	}
	e.nextReadID.Store(uint64(time.Now().UnixNano()))
	election := cmp.Or(cfg.ElectionTimeout, time.Second)
	e.tick = election / electionTicks
	e.snapshot.threshold = cmp.Or(cfg.SnapshotThreshold, 8192)
	e.snapshot.catchUp = cmp.Or(cfg.CatchUpEntries, 10240)

	boot, err := e.disk.load()
	if err != nil {
		return nil, err
	}
	if err := e.restoreBoot(boot); err != nil {
		return nil, err
	}
	e.cfg = etcdraft.Config{
		ID:                        e.rid,
		ElectionTick:              electionTicks,
		HeartbeatTick:             1,
		Storage:                   raftStorage{MemoryStorage: e.ms, e: e},
		Applied:                   boot.snap.Metadata.Index,
		MaxSizePerMsg:             1 << 20,
		MaxInflightMsgs:           256,
		MaxUncommittedEntriesSize: 1 << 30,
		CheckQuorum:               true,
		PreVote:                   true,
		// Proposals are made on the leader only; a follower refuses them
		// at once (*NotLeaderError) rather than forwarding an entry whose
		// fate it could not report.
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    slogRaftLogger{log: n.log.With("component", "etcd-raft")},
	}
	fresh := etcdraft.IsEmptySnap(boot.snap) && len(boot.ents) == 0 && etcdraft.IsEmptyHardState(boot.hs)
	var node etcdraft.Node
	if fresh && cfg.Bootstrap {
		peers, err := bootstrapPeers(cfg, e.self)
		if err != nil {
			return nil, err
		}
		c := e.cfg
		node = etcdraft.StartNode(&c, peers)
	} else {
		c := e.cfg
		node = etcdraft.RestartNode(&c)
	}
	e.node.Store(&raftHandle{node})
	trans.Start(e)
	e.wg.Add(3)
	go e.run()
	go e.applyLoop()
	go e.readLoop()
	return e, nil
}

// electionTicks is raft's election timeout in ticks: a tick is a tenth of
// Config.ElectionTimeout, and the leader heartbeats every tick, etcd's
// ratio.
const electionTicks = 10

// bootstrapPeers is the first configuration, cfg.InitialVoters or this
// node alone, as raft's bootstrap entries.
func bootstrapPeers(cfg Config, self memberInfo) ([]etcdraft.Peer, error) {
	voters := cfg.InitialVoters
	if len(voters) == 0 {
		voters = []Peer{{ID: self.ID, Address: self.Addr}}
	}
	var peers []etcdraft.Peer
	seen := map[uint64]string{}
	for _, p := range voters {
		addr := p.Address
		if p.ID == self.ID {
			if addr != "" && addr != self.Addr {
				return nil, fmt.Errorf("raftnode: InitialVoters lists this node %s at %s, but its address is %s", p.ID, p.Address, self.Addr)
			}
			addr = self.Addr
		}
		id := raftID(p.ID)
		if other, ok := seen[id]; ok {
			return nil, fmt.Errorf("raftnode: node IDs %s and %s hash to the same raft ID: rename one", other, p.ID)
		}
		seen[id] = p.ID
		ctx, _ := json.Marshal(confContext{memberInfo: memberInfo{ID: p.ID, Addr: addr}})
		peers = append(peers, etcdraft.Peer{ID: id, Context: ctx})
	}
	return peers, nil
}

// restoreBoot loads what the node restarts from into raft's storage and
// the state machine; the entries after the snapshot are applied again as
// raft hands them over.
func (e *etcdEngine) restoreBoot(b bootState) error {
	if !etcdraft.IsEmptySnap(b.snap) {
		if err := e.ms.ApplySnapshot(b.snap); err != nil {
			return fmt.Errorf("raftnode: load snapshot: %w", err)
		}
		if err := e.n.fsm.restoreBytes(b.state); err != nil {
			return err
		}
		e.setMembership(b.snap.Metadata.ConfState, b.members)
		e.snapshotIdx.Store(b.snap.Metadata.Index)
	}
	if err := e.ms.Append(b.ents); err != nil {
		return fmt.Errorf("raftnode: load log: %w", err)
	}
	if !etcdraft.IsEmptyHardState(b.hs) {
		if err := e.ms.SetHardState(b.hs); err != nil {
			return fmt.Errorf("raftnode: load hard state: %w", err)
		}
	}
	e.term.Store(b.hs.Term)
	e.commit.Store(b.hs.Commit)
	last, _ := e.ms.LastIndex()
	e.lastIndex.Store(last)
	return nil
}

func (e *etcdEngine) raft() etcdraft.Node { return e.node.Load().Node }

// run is the Ready loop.
func (e *etcdEngine) run() {
	defer e.wg.Done()
	defer close(e.applyCh)
	ticker := time.NewTicker(e.tick)
	defer ticker.Stop()
	for {
		node := e.raft()
		select {
		case <-ticker.C:
			node.Tick()
		case rd := <-node.Ready():
			if !e.handleReady(node, rd) {
				return
			}
		case req := <-e.bootstrapCh:
			req.done <- e.bootstrap(node, req.peers)
		case <-e.stop:
			return
		}
	}
}

// handleReady does one Ready's work; false means the engine is stopping.
func (e *etcdEngine) handleReady(node etcdraft.Node, rd etcdraft.Ready) bool {
	task := applyTask{}
	if rd.SoftState != nil {
		task.stepDown = e.setRole(rd.SoftState.RaftState, rd.SoftState.Lead)
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if rd.HardState.Term > e.term.Load() {
			task.term = rd.HardState.Term
		}
		e.term.Store(rd.HardState.Term)
		e.commit.Store(rd.HardState.Commit)
	}
	// What needs nothing durable goes first: above all the leader's
	// appends, which followers write while the leader writes its own copy.
	later := e.sendBeforeWrite(rd.Messages)
	task.ents = rd.CommittedEntries
	if slices.ContainsFunc(task.ents, isConfChange) {
		task.confApplied = make(chan []resolved, 1)
	}
	task.persisted = make(chan struct{})
	hasWork := len(task.ents) > 0 || task.stepDown || task.term > 0
	// Committed entries are durable on a quorum already, so they are
	// applied while this Ready's new entries are written, as etcd's
	// server does: otherwise every commit would wait for the next write
	// too. A snapshot is the exception: it is written first.
	if etcdraft.IsEmptySnap(rd.Snapshot) && hasWork && !e.handOver(task) {
		return false
	}
	if !e.persist(node, rd) {
		return false
	}
	close(task.persisted)
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		snap := rd.Snapshot
		task.snap = &snap
		if !e.handOver(task) {
			return false
		}
	}
	e.trans.Send(later)
	for _, rs := range rd.ReadStates {
		e.readDone(binary.BigEndian.Uint64(rs.RequestCtx), readResult{index: rs.Index})
	}
	if task.stepDown || task.term > 0 {
		e.failReads()
	}
	var answers []resolved
	if task.confApplied != nil {
		select {
		case answers = <-task.confApplied:
		case <-e.stop:
			return false
		}
	}
	node.Advance()
	for _, a := range answers {
		e.answer(a.req, proposalResult{res: a.res})
	}
	return true
}

// handOver queues a task for apply; false means the engine is stopping.
func (e *etcdEngine) handOver(task applyTask) bool {
	select {
	case e.applyCh <- task:
		return true
	case <-e.stop:
		return false
	}
}

// setRole publishes this node's role and leader, and reports whether it
// stopped leading.
func (e *etcdEngine) setRole(role etcdraft.StateType, leader uint64) (steppedDown bool) {
	wasLeader := etcdraft.StateType(e.role.Swap(int32(role))) == etcdraft.StateLeader
	e.leader.Store(leader)
	isLeader := role == etcdraft.StateLeader
	if wasLeader != isLeader {
		e.n.metrics.isLeader.Set(map[bool]float64{true: 1}[isLeader])
		e.n.publishLeader(isLeader)
	}
	return wasLeader && !isLeader
}

// resume publishes raft's own view of the role again once the log can
// be written after a failure: raft never learnt of the pause, so no
// Ready will say the role changed.
func (e *etcdEngine) resume(node etcdraft.Node) {
	st := node.Status()
	e.setRole(st.RaftState, st.Lead)
	e.n.log.Info("raft: the log can be written again", "role", etcdRoleName(st.RaftState))
}

// sendBeforeWrite sends the messages that may leave before this Ready's
// write is durable and returns the others: votes and append
// acknowledgements, which promise that the write is done (the same split
// raft makes itself with asynchronous storage writes).
func (e *etcdEngine) sendBeforeWrite(msgs []raftpb.Message) (later []raftpb.Message) {
	now := msgs[:0:0]
	for _, m := range msgs {
		switch m.Type {
		case raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
			later = append(later, m)
		default:
			now = append(now, m)
		}
	}
	e.trans.Send(now)
	return later
}

// persist writes a Ready's snapshot, hard state and entries, retrying
// while the disk refuses (full): nothing after it may happen before it,
// and the node stops heartbeating meanwhile, so another node leads. It
// returns false if the engine stops first.
func (e *etcdEngine) persist(node etcdraft.Node, rd etcdraft.Ready) bool {
	for attempt := 0; ; attempt++ {
		err := e.write(rd)
		if err == nil {
			if attempt > 0 {
				e.resume(node)
			}
			return true
		}
		if attempt == 0 {
			// Calls that need the leader now fail at once, naming the
			// disk (notLeader), instead of waiting on a write that cannot
			// happen; a cluster elects another leader meanwhile, since
			// this node has stopped heartbeating. What is in flight may
			// still commit there (the followers have it), so it fails as
			// a lost leadership, outcome unknown.
			e.setRole(etcdraft.StateFollower, 0)
			e.failWaiters(0)
			e.failReads()
		}
		if attempt%60 == 0 {
			e.n.log.Error("raft: cannot write the log; retrying, and not acknowledging anything meanwhile", "error", err)
		}
		select {
		case <-time.After(time.Second):
		case <-e.stop:
			return false
		}
	}
}

func (e *etcdEngine) write(rd etcdraft.Ready) error {
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		if err := e.disk.saveSnapshot(rd.Snapshot); err != nil {
			return err
		}
		if err := e.ms.ApplySnapshot(rd.Snapshot); err != nil && !errors.Is(err, etcdraft.ErrSnapOutOfDate) {
			return err
		}
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if err := e.disk.saveHardState(rd.HardState); err != nil {
			return err
		}
	}
	if err := e.disk.append(rd.Entries); err != nil {
		return err
	}
	if err := e.ms.Append(rd.Entries); err != nil {
		return err
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		if err := e.ms.SetHardState(rd.HardState); err != nil {
			return err
		}
	}
	if n := len(rd.Entries); n > 0 {
		e.lastIndex.Store(rd.Entries[n-1].Index)
	} else if !etcdraft.IsEmptySnap(rd.Snapshot) {
		e.lastIndex.Store(rd.Snapshot.Metadata.Index)
	}
	return nil
}

// bootstrap forms a cluster on a node that has no state, replacing the
// raft node that was waiting to be added.
func (e *etcdEngine) bootstrap(node etcdraft.Node, peers []etcdraft.Peer) error {
	if last, _ := e.ms.LastIndex(); last > 0 || e.term.Load() > 0 {
		return ErrAlreadyFormed
	}
	node.Stop()
	c := e.cfg
	e.node.Store(&raftHandle{etcdraft.StartNode(&c, peers)})
	return nil
}

// applyLoop applies what run hands over, in order.
func (e *etcdEngine) applyLoop() {
	defer e.wg.Done()
	defer e.snapping.Wait()
	for {
		var task applyTask
		select {
		case t, ok := <-e.applyCh:
			if !ok {
				return
			}
			task = t
		case <-e.snapWanted:
			e.snapshotInBackground("raft: snapshot for a peer", slog.LevelDebug)
			continue
		case done := <-e.snapNow:
			// Between batches, so the state, its index and the membership
			// agree.
			e.snapping.Wait()
			write, err := e.copyState()
			if err == nil {
				err = write()
			}
			done <- err
			continue
		}
		if task.snap != nil {
			e.restoreSnapshot(*task.snap)
		}
		confAnswers := e.applyEntries(task.ents)
		if task.confApplied != nil {
			task.confApplied <- confAnswers
		}
		if task.stepDown {
			e.failWaiters(0)
		} else if task.term > 0 {
			e.failWaiters(task.term)
		}
		select {
		case <-task.persisted:
			e.maybeSnapshot()
		case <-e.stop:
			// run stops at once; the next start snapshots instead.
		}
	}
}

func (e *etcdEngine) restoreSnapshot(snap raftpb.Snapshot) {
	members, state, err := decodeSnapshotData(snap.Data)
	if err == nil {
		err = e.n.fsm.restoreBytes(state)
	}
	if err != nil {
		// The snapshot was checked when it was written; failing to read it
		// back means the state cannot be trusted at all.
		panic(fmt.Sprintf("raftnode: restore snapshot %d: %v", snap.Metadata.Index, err))
	}
	e.setMembership(snap.Metadata.ConfState, members)
	e.snapshotIdx.Store(snap.Metadata.Index)
}

type resolved struct {
	req uint64
	res statemachine.Result
}

// applyEntries applies a batch under one write lock, as the hashicorp
// engine's ApplyBatch does, and answers the waiting proposals after the
// applied index has moved, so that their callers' next reads see them.
func (e *etcdEngine) applyEntries(ents []raftpb.Entry) (confAnswers []resolved) {
	f := e.n.fsm
	if len(ents) == 0 || ents[len(ents)-1].Index <= f.applied.Load() {
		return nil
	}
	start := time.Now()
	var answers []resolved
	f.mu.Lock()
	for _, ent := range ents {
		if ent.Index <= f.applied.Load() {
			continue // in a snapshot already restored
		}
		switch ent.Type {
		case raftpb.EntryNormal:
			if len(ent.Data) < proposalHeader {
				continue // the empty entry a new leader appends
			}
			from, req := binary.BigEndian.Uint64(ent.Data), binary.BigEndian.Uint64(ent.Data[8:])
			var res statemachine.Result
			if cmd := ent.Data[proposalHeader:]; len(cmd) > 0 {
				res = f.applyData(ent.Index, ent.Term, cmd)
			}
			if from == e.rid {
				answers = append(answers, resolved{req: req, res: res})
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			if req, mine := e.applyConfChange(ent); mine {
				confAnswers = append(confAnswers, resolved{req: req})
			}
		}
	}
	f.mu.Unlock()
	f.advance(ents[len(ents)-1].Index)
	e.n.metrics.applyBatch.Observe(time.Since(start).Seconds())
	e.n.metrics.batchSize.Observe(float64(len(ents)))
	for _, a := range answers {
		e.answer(a.req, proposalResult{res: a.res})
	}
	return confAnswers
}

func isConfChange(e raftpb.Entry) bool {
	return e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2
}

// applyConfChange applies a membership entry to raft and to the members
// this engine knows, and reports the request it answers.
func (e *etcdEngine) applyConfChange(ent raftpb.Entry) (req uint64, mine bool) {
	var cc raftpb.ConfChangeV2
	if ent.Type == raftpb.EntryConfChange {
		var v1 raftpb.ConfChange
		if err := v1.Unmarshal(ent.Data); err != nil {
			panic(fmt.Sprintf("raftnode: configuration entry %d: %v", ent.Index, err))
		}
		cc = v1.AsV2()
	} else if err := cc.Unmarshal(ent.Data); err != nil {
		panic(fmt.Sprintf("raftnode: configuration entry %d: %v", ent.Index, err))
	}
	var ctx confContext
	if len(cc.Context) > 0 {
		if err := json.Unmarshal(cc.Context, &ctx); err != nil {
			e.n.log.Error("raft: configuration entry with an unreadable context", "index", ent.Index, "error", err)
		}
	}
	cs := e.raft().ApplyConfChange(cc)
	e.memMu.Lock()
	for _, ch := range cc.Changes {
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			if ctx.ID != "" {
				e.members[ch.NodeID] = ctx.memberInfo
			}
			if m, ok := e.members[ch.NodeID]; ok && ch.NodeID != e.rid {
				e.trans.SetPeer(ch.NodeID, m.Addr)
			}
		case raftpb.ConfChangeRemoveNode:
			delete(e.members, ch.NodeID)
			if ch.NodeID != e.rid {
				e.trans.RemovePeer(ch.NodeID)
			}
		}
	}
	if cs != nil {
		e.conf = *cs
	}
	e.memMu.Unlock()
	return ctx.Req, ctx.From == e.rid && ctx.Req != 0
}

// setMembership replaces the members, from a snapshot.
func (e *etcdEngine) setMembership(cs raftpb.ConfState, members map[uint64]memberInfo) {
	e.memMu.Lock()
	defer e.memMu.Unlock()
	for id := range e.members {
		if _, ok := members[id]; !ok && id != e.rid {
			e.trans.RemovePeer(id)
		}
	}
	e.members = members
	e.conf = cs
	for id, m := range members {
		if id != e.rid {
			e.trans.SetPeer(id, m.Addr)
		}
	}
}

// maybeSnapshot snapshots the state once enough entries have been
// applied since the last one: the state is copied here, between batches,
// and written by a goroutine of its own while applies go on.
func (e *etcdEngine) maybeSnapshot() {
	if e.n.fsm.applied.Load()-e.snapshotIdx.Load() >= e.snapshot.threshold {
		e.snapshotInBackground("raft: snapshot", slog.LevelError)
	}
}

// snapshotInBackground copies the state now and writes it on a goroutine
// of its own, one snapshot at a time. A copy that fails is logged at
// copyFailed: Debug for a peer's snapshot, since raft asks again with its
// next attempt to send.
func (e *etcdEngine) snapshotInBackground(what string, copyFailed slog.Level) {
	e.snapping.Wait()
	write, err := e.copyState()
	if err != nil {
		e.n.log.Log(context.Background(), copyFailed, what, "error", err)
		return
	}
	e.snapping.Add(1)
	go func() {
		defer e.snapping.Done()
		if err := write(); err != nil {
			e.n.log.Error(what, "error", err)
		}
	}()
}

// raftStorage is what raft reads its log and snapshot from: the
// MemoryStorage, except that a snapshot it is to send a peer must name
// the configuration as it is now. Raft takes the newest stored snapshot,
// and a node added since it was taken (a learner joining a cluster whose
// log was compacted, or a converted node's first peer) refuses one whose
// configuration lacks it. So such a snapshot is withheld, raft is told to
// try again, and apply takes a fresh one, as etcd's server sends its
// current state instead of the stored snapshot.
type raftStorage struct {
	*etcdraft.MemoryStorage
	e *etcdEngine
}

func (s raftStorage) Snapshot() (raftpb.Snapshot, error) {
	snap, err := s.MemoryStorage.Snapshot()
	if err != nil || s.e.namesEveryMember(snap.Metadata.ConfState) {
		return snap, err
	}
	select {
	case s.e.snapWanted <- struct{}{}:
	default:
	}
	return raftpb.Snapshot{}, etcdraft.ErrSnapshotTemporarilyUnavailable
}

// namesEveryMember reports whether cs lists every node of the applied
// configuration.
func (e *etcdEngine) namesEveryMember(cs raftpb.ConfState) bool {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	for _, ids := range [][]uint64{e.conf.Voters, e.conf.Learners} {
		for _, id := range ids {
			if !slices.Contains(cs.Voters, id) && !slices.Contains(cs.Learners, id) {
				return false
			}
		}
	}
	return true
}

// snapshotNow takes a snapshot of the state as it is and waits until it
// is written and the log behind it compacted.
func (e *etcdEngine) snapshotNow() error {
	done := make(chan error, 1)
	select {
	case e.snapNow <- done:
		return <-done
	case <-e.stop:
		return ErrClosed
	}
}

// copyState copies the state, its index and membership, and returns
// what writes them out. It runs on the apply goroutine, between batches.
func (e *etcdEngine) copyState() (write func() error, err error) {
	f := e.n.fsm
	f.mu.RLock()
	applied := f.applied.Load()
	e.memMu.RLock()
	cs := e.conf
	members := make(map[uint64]memberInfo, len(e.members))
	for id, m := range e.members {
		members[id] = m
	}
	e.memMu.RUnlock()
	state, err := f.snapshotLocked()
	f.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	term, err := e.ms.Term(applied)
	if err != nil {
		return nil, fmt.Errorf("raftnode: snapshot at %d: %w", applied, err)
	}
	e.snapshotIdx.Store(applied)
	return func() error { return e.takeSnapshot(applied, term, cs, members, state) }, nil
}

func (e *etcdEngine) takeSnapshot(index, term uint64, cs raftpb.ConfState, members map[uint64]memberInfo, state []byte) error {
	meta := raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: cs}
	if err := e.disk.writeSnapshot(meta, members, state); err != nil {
		return err
	}
	if _, err := e.ms.CreateSnapshot(index, &cs, encodeSnapshotData(members, state)); err != nil {
		if errors.Is(err, etcdraft.ErrSnapOutOfDate) {
			return nil // a newer snapshot arrived from the leader meanwhile
		}
		return err
	}
	if index <= e.snapshot.catchUp {
		return nil
	}
	upTo := index - e.snapshot.catchUp
	if err := e.ms.Compact(upTo); err != nil && !errors.Is(err, etcdraft.ErrCompacted) {
		return err
	}
	return e.disk.compact(upTo)
}

// register makes a waiter for a proposal this node is about to make.
func (e *etcdEngine) register() (uint64, *waiter) {
	e.waitMu.Lock()
	defer e.waitMu.Unlock()
	e.nextReq++
	w := &waiter{term: e.term.Load(), done: make(chan proposalResult, 1)}
	e.waiters[e.nextReq] = w
	return e.nextReq, w
}

func (e *etcdEngine) forget(req uint64) {
	e.waitMu.Lock()
	delete(e.waiters, req)
	e.waitMu.Unlock()
}

func (e *etcdEngine) answer(req uint64, r proposalResult) {
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
func (e *etcdEngine) failWaiters(term uint64) {
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
func (e *etcdEngine) propose(ctx context.Context, op string, cmd []byte) (statemachine.Result, error) {
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

func (e *etcdEngine) await(ctx context.Context, op string, req uint64, w *waiter) (statemachine.Result, error) {
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
func (e *etcdEngine) proposeError(op string, err error) error {
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

func (e *etcdEngine) isLeader() bool {
	return etcdraft.StateType(e.role.Load()) == etcdraft.StateLeader
}

// readIndex returns an index that covers every entry committed before it
// was called, confirmed by a quorum that still follows this leader
// (ReadIndex, raft thesis §6.4). Concurrent callers share a round.
func (e *etcdEngine) readIndex(ctx context.Context) (uint64, error) {
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
func (e *etcdEngine) readLoop() {
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

func (e *etcdEngine) readRound() (uint64, error) {
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

func (e *etcdEngine) readDone(id uint64, r readResult) {
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
func (e *etcdEngine) failReads() {
	e.readMu.Lock()
	defer e.readMu.Unlock()
	for id, ch := range e.readWaiters {
		delete(e.readWaiters, id)
		ch <- readResult{err: e.n.notLeader()}
	}
}

// Process, ReportUnreachable and ReportSnapshot are the transport's way
// into raft (messageHandler).
func (e *etcdEngine) Process(ctx context.Context, m raftpb.Message) error {
	if err := e.checkLog(m); err != nil {
		return err
	}
	switch m.Type {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
		e.lastContact.Store(time.Now().UnixNano())
	}
	return e.raft().Step(ctx, m)
}

func (e *etcdEngine) ReportUnreachable(id uint64) { e.raft().ReportUnreachable(id) }

func (e *etcdEngine) ReportSnapshot(id uint64, status etcdraft.SnapshotStatus) {
	e.raft().ReportSnapshot(id, status)
}

// close stops the loops and raft; the caller closes the transport and
// stores afterwards.
func (e *etcdEngine) close() error {
	close(e.stop)
	e.wg.Wait()
	e.raft().Stop()
	e.role.Store(int32(etcdraft.StateFollower))
	e.leader.Store(0)
	return nil
}

// changeMembership proposes one configuration change and waits until it
// is applied here.
func (e *etcdEngine) changeMembership(ctx context.Context, op string, typ raftpb.ConfChangeType, m memberInfo) error {
	e.confMu.Lock()
	defer e.confMu.Unlock()
	if !e.isLeader() {
		return e.n.notLeader()
	}
	id := raftID(m.ID)
	e.memMu.RLock()
	known, exists := e.members[id]
	voter, learner := slices.Contains(e.conf.Voters, id), slices.Contains(e.conf.Learners, id)
	e.memMu.RUnlock()
	if exists && known.ID != m.ID {
		return fmt.Errorf("raftnode: %s: node IDs %s and %s hash to the same raft ID: rename one", op, known.ID, m.ID)
	}
	switch typ {
	case raftpb.ConfChangeAddNode:
		if voter && known.Addr == m.Addr {
			return nil
		}
	case raftpb.ConfChangeAddLearnerNode:
		if learner && known.Addr == m.Addr {
			return nil
		}
		if voter {
			// Raft only demotes through a joint configuration; today's
			// engine never asked for that either.
			return fmt.Errorf("raftnode: %s: %s is a voter", op, m.ID)
		}
	case raftpb.ConfChangeRemoveNode:
		if !voter && !learner {
			return nil
		}
	}
	ctx, cancel := membershipContext(ctx)
	defer cancel()
	req, w := e.register()
	cc, _ := json.Marshal(confContext{memberInfo: m, Req: req, From: e.rid})
	change := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: id}}, Context: cc}
	if err := e.raft().ProposeConfChange(ctx, change); err != nil {
		e.forget(req)
		return e.proposeError(op, err)
	}
	_, err := e.await(ctx, op, req, w)
	return err
}

// membershipContext bounds a change without a deadline: raft turns a
// change it refuses (one already pending) into an empty entry, which
// answers nobody.
func membershipContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultApplyTimeout)
}

// transferLeadership hands leadership to id, or to the voter whose log is
// furthest along, and waits until another node leads or the election
// timeout passes.
func (e *etcdEngine) transferLeadership(ctx context.Context, id string) error {
	if !e.isLeader() {
		return e.n.notLeader()
	}
	st := e.raft().Status()
	var target uint64
	if id != "" {
		target = raftID(id)
		e.memMu.RLock()
		_, known := e.members[target]
		voter := slices.Contains(e.conf.Voters, target)
		e.memMu.RUnlock()
		switch {
		case !known:
			return fmt.Errorf("raftnode: transfer leadership: %w: %s", ErrUnknownMember, id)
		case !voter:
			return fmt.Errorf("raftnode: transfer leadership: %s does not vote, so it cannot lead", id)
		}
	} else {
		var best uint64
		for pid, pr := range st.Progress {
			if pid != e.rid && !pr.IsLearner && (target == 0 || pr.Match > best) {
				target, best = pid, pr.Match
			}
		}
		if target == 0 {
			return errors.New("raftnode: transfer leadership: no other voter")
		}
	}
	if target == e.rid {
		return nil
	}
	e.raft().TransferLeadership(ctx, e.rid, target)
	deadline := time.NewTimer(2 * e.n.election)
	defer deadline.Stop()
	tick := time.NewTicker(e.tick)
	defer tick.Stop()
	for {
		if l := e.leader.Load(); l != e.rid && l != 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("raftnode: transfer leadership: %s did not take over within %v", e.memberName(target), 2*e.n.election)
		case <-ctx.Done():
			return fmt.Errorf("raftnode: transfer leadership: %w", ctx.Err())
		case <-e.stop:
			return ErrClosed
		}
	}
}

func (e *etcdEngine) memberName(id uint64) string {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	if m, ok := e.members[id]; ok {
		return m.ID
	}
	return strconv.FormatUint(id, 16)
}

// leaderInfo is the leader's peer address and node ID, empty when no
// leader is known.
func (e *etcdEngine) leaderInfo() (addr, id string) {
	l := e.leader.Load()
	if l == 0 {
		return "", ""
	}
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	if l == e.rid {
		return e.self.Addr, e.self.ID
	}
	m := e.members[l]
	return m.Addr, m.ID
}

func (e *etcdEngine) membersList() []Member {
	_, leader := e.leaderInfo()
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	var out []Member
	add := func(ids []uint64, voter bool) {
		for _, id := range ids {
			m := e.members[id]
			if id == e.rid {
				m = memberInfo{ID: e.self.ID, Addr: cmp.Or(m.Addr, e.self.Addr)}
			}
			out = append(out, Member{ID: m.ID, Address: m.Addr, Voter: voter, Leader: m.ID == leader && leader != ""})
		}
	}
	add(e.conf.Voters, true)
	add(e.conf.Learners, false)
	return out
}

func (e *etcdEngine) status() Status {
	addr, id := e.leaderInfo()
	st := Status{
		ID:           e.self.ID,
		Addr:         e.self.Addr,
		Role:         etcdRoleName(etcdraft.StateType(e.role.Load())),
		LeaderID:     id,
		Leader:       addr,
		Term:         e.term.Load(),
		CommitIndex:  e.commit.Load(),
		AppliedIndex: e.n.fsm.applied.Load(),
		LastLogIndex: e.lastIndex.Load(),
	}
	if st.Role != "leader" {
		if t := e.lastContact.Load(); t != 0 {
			st.LastContact = time.Unix(0, t)
		}
	}
	return st
}

func etcdRoleName(s etcdraft.StateType) string {
	switch s {
	case etcdraft.StateLeader:
		return "leader"
	case etcdraft.StateCandidate, etcdraft.StatePreCandidate:
		return "candidate"
	default:
		return "follower"
	}
}

func (e *etcdEngine) stats() map[string]string {
	st := e.status()
	return map[string]string{
		"engine":            engineEtcd,
		"state":             st.Role,
		"term":              strconv.FormatUint(st.Term, 10),
		"commit_index":      strconv.FormatUint(st.CommitIndex, 10),
		"last_log_index":    strconv.FormatUint(st.LastLogIndex, 10),
		"last_snapshot_idx": strconv.FormatUint(e.snapshotIndex(), 10),
		"leader":            st.LeaderID,
		"num_peers":         strconv.Itoa(max(len(e.membersList())-1, 0)),
	}
}

func (e *etcdEngine) snapshotIndex() uint64 {
	s, err := e.ms.Snapshot()
	if err != nil {
		return 0
	}
	return s.Metadata.Index
}

// bootstrapCluster is BootstrapCluster for the etcd engine: it is run by
// the Ready loop, which swaps the waiting raft node for a bootstrapped one.
func (e *etcdEngine) bootstrapCluster(voters []Peer) error {
	peers, err := bootstrapPeers(Config{InitialVoters: voters}, e.self)
	if err != nil {
		return err
	}
	req := bootstrapRequest{peers: peers, done: make(chan error, 1)}
	select {
	case e.bootstrapCh <- req:
	case <-e.stop:
		return ErrClosed
	}
	return <-req.done
}
