package raftnode

// The engine: starting go.etcd.io/raft/v3 on what the node restarts
// from, and the state every concept shares (the raft node, its
// MemoryStorage and the WAL behind it, the transport, the role and
// indexes the Ready loop publishes). Each concept's own state and
// methods live in its file: ready.go (with readycore.go, the order of a
// Ready's work it steps), propose.go, readindex.go, apply.go,
// snapshot.go, membership.go, status.go. The boundary follows
// etcd's server (raft.go, apply.go, v3_server.go, snapshot code), so
// that each file can be read against the one goroutine or protocol it
// serves.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// engine runs the replicated log on the raft engine, go.etcd.io/raft/v3.
// What it buys over hashicorp/raft is the order of a commit's work: a
// leader sends its new entries to the followers before it writes them to
// its own WAL (raft thesis §10.2.1), and counts its own vote only once
// its write is durable (the library's self-ack), so a commit costs one
// disk write and a round trip instead of two writes and a round trip.
// Every proposal queued while a write is under way goes into the next
// write: one fsync per batch.
//
// Raft itself is a RawNode behind a mutex (rawraft.go), stepped on the
// goroutine of whoever brings it something: a proposer, the transport,
// the ticker. Three goroutines share the rest, each in a file of its own:
//   - run, the Ready loop (ready.go), takes raft's Readys and steps the
//     ReadyCore (readycore.go) through each: it sends what needs no
//     durability, writes the WAL and hard state, sends the rest (votes
//     and append acknowledgements, which must follow the write), and
//     hands committed entries to apply, in order; a Ready that writes no
//     entries it applies itself when apply is idle (applyInline);
//   - applyLoop (apply.go) applies them by ApplyEntries' rule to the
//     state through the applier, which owns the state's lock, answers the
//     proposals waiting on them (propose.go), and takes snapshots
//     (snapshot.go);
//   - readLoop (readindex.go) batches ReadIndex requests, one round at a
//     time, so that many concurrent linearizable reads cost one quorum
//     round.
//
// The engine's own fields are what every concept needs (raft itself, its
// storage, the transport, the published role and indexes); what only one
// concept needs lives in that concept's type: proposals, reads,
// members, snapshots.
type engine struct {
	n     *Node // the node this engine runs; shares its applier, metrics and log
	rid   uint64
	self  memberInfo
	cfg   etcdraft.Config // the template for newRawRaft
	ms    *memoryLog      // raft's MemoryStorage, its bytes counted (memlog.go)
	disk  *diskStorage
	trans peerTransport
	tick  time.Duration

	node   atomic.Pointer[rawRaft] // replaced once, by BootstrapCluster
	ready  *ReadyCore              // the order of a Ready's work, stepped by run (ready.go)
	driver *readyDriver            // its effects in this engine

	// Published by the Ready loop for readers on other goroutines.
	role        atomic.Int32 // etcdraft.StateType
	leader      atomic.Uint64
	term        atomic.Uint64
	commit      atomic.Uint64
	lastIndex   atomic.Uint64
	lastContact atomic.Int64 // unix nanoseconds a follower last heard from its leader

	catchUp       atomic.Uint64 // the index the log must reach again; 0: none (catchup.go)
	catchUpTerm   atomic.Uint64 // the catch-up point's term
	membersStored atomic.Uint64 // the member count last written to the meta store
	handOvers     *HandOvers    // the leader's hand-overs for catching-up members
	lease         *LeaderLease  // lease.go: while it holds, no other leader was elected
	soleVoter     atomic.Bool   // the applied configuration's one voter is this node (lease.go)

	proposals *proposals   // propose.go
	reads     *readRounds  // readindex.go
	members   *membership  // membership.go
	snapshots *snapshotter // snapshot.go
	batch     batchApplier // apply.go: the batch apply is applying

	applyCh chan applyTask
	// applyPending counts tasks handed to apply and not yet done, and
	// applyMu is held by whoever applies (apply, or the Ready loop
	// applying inline): together they keep batches in order (apply.go).
	applyPending  atomic.Int64
	applyMu       sync.Mutex
	snapshotCheck chan struct{} // after an inline apply: apply checks whether a snapshot is due
	inlineApplies atomic.Uint64 // batches the Ready loop applied itself
	bootstrapCh   chan bootstrapRequest
	stop          chan struct{}
	wg            sync.WaitGroup

	failOnce sync.Once
	failed   chan struct{} // closed by fail; failErr is set before
	failErr  error
}

// startEngine starts the engine on the stores open has opened.
func startEngine(n *Node, cfg Config, st stores, trans peerTransport) (*engine, error) {
	tick := cmp.Or(cfg.ElectionTimeout, time.Second) / electionTicks
	e := &engine{
		n:             n,
		rid:           raftID(cfg.NodeID),
		self:          memberInfo{ID: cfg.NodeID, Addr: trans.LocalAddr()},
		ms:            newMemoryLog(),
		disk:          &diskStorage{wal: st.wal, meta: st.meta, snapshots: st.snapshots, log: n.log},
		trans:         trans,
		tick:          tick,
		lease:         NewLeaderLease(tick, time.Now()),
		proposals:     newProposals(),
		reads:         newReadRounds(),
		members:       &membership{byID: map[uint64]memberInfo{}},
		snapshots:     newSnapshotter(cfg),
		handOvers:     NewHandOvers(cfg.ElectionTimeout),
		applyCh:       make(chan applyTask, 64),
		snapshotCheck: make(chan struct{}, 1),
		bootstrapCh:   make(chan bootstrapRequest),
		stop:          make(chan struct{}),
		failed:        make(chan struct{}),
	}
	boot, err := e.disk.load()
	if err != nil {
		return nil, err
	}
	if v, err := e.disk.meta.GetUint64(membersKey); err == nil {
		e.membersStored.Store(v)
	}
	if err := e.restoreBoot(boot); err != nil {
		return nil, err
	}
	if err := e.loadCatchUp(); err != nil {
		return nil, err
	}
	drv := &readyDriver{e: e}
	e.driver = drv
	e.ready = NewReadyCore(ReadyEffects{
		Log:     walLog{d: e.disk},
		Raft:    memLog{e: e},
		Send:    trans,
		Apply:   drv,
		Host:    drv,
		Advance: drv.advance,
	}, e.term.Load())
	e.cfg = RaftConfig(e.rid, raftStorage{MemoryStorage: e.ms.MemoryStorage, e: e}, boot.snap.Metadata.Index, cfg.MaxLogMemoryBytes)
	e.cfg.Logger = slogRaftLogger{log: n.log.With("component", "etcd-raft")}
	fresh := etcdraft.IsEmptySnap(boot.snap) && len(boot.ents) == 0 && etcdraft.IsEmptyHardState(boot.hs)
	var peers []etcdraft.Peer
	if fresh && cfg.Bootstrap {
		if peers, err = bootstrapPeers(cfg, e.self); err != nil {
			return nil, err
		}
	}
	c := e.cfg
	node, err := newRawRaft(&c, peers)
	if err != nil {
		return nil, fmt.Errorf("raftnode: start raft: %w", err)
	}
	e.node.Store(node)
	e.batch.e = e
	trans.Start(e)
	e.wg.Add(3)
	go e.run()
	go e.applyLoop()
	go e.readLoop()
	return e, nil
}

// RaftConfig is the configuration the engine starts raft with, for the
// node with raft ID id on storage, restarting after applied. It is
// exported so that internal/sim runs raft as the engine does, not as a
// copy of these values says it does. maxLogMemoryBytes is
// Config.MaxLogMemoryBytes, 0 for its default. Logger is left to the
// caller: the engine's goes to its slog logger.
func RaftConfig(id uint64, storage etcdraft.Storage, applied uint64, maxLogMemoryBytes int64) etcdraft.Config {
	maxLog := cmp.Or(maxLogMemoryBytes, defaultMaxLogMemoryBytes)
	return etcdraft.Config{
		ID:            id,
		ElectionTick:  electionTicks,
		HeartbeatTick: 1,
		Storage:       storage,
		Applied:       applied,
		// The byte limits raft has of its own, set from the log's bound
		// (Config.MaxLogMemoryBytes): an append message carries at most
		// maxSizePerMsg of entries; the leader's uncommitted tail is
		// bounded by the log's bound, since it is held in memory until it
		// commits; and so is, by a quarter of it, what the leader has
		// sent a follower without hearing back, which the transport's
		// queue holds a copy of.
		MaxSizePerMsg:             maxSizePerMsg,
		MaxInflightMsgs:           256,
		MaxInflightBytes:          uint64(max(maxLog/4, maxSizePerMsg)),
		MaxUncommittedEntriesSize: uint64(maxLog),
		CheckQuorum:               true,
		PreVote:                   true,
		// Proposals are made on the leader only; a follower refuses them
		// at once (*NotLeaderError) rather than forwarding an entry whose
		// fate it could not report.
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
	}
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
func (e *engine) restoreBoot(b bootState) error {
	if !etcdraft.IsEmptySnap(b.snap) {
		if err := e.ms.ApplySnapshot(b.snap); err != nil {
			return fmt.Errorf("raftnode: load snapshot: %w", err)
		}
		if err := e.n.applier.restoreBytes(b.state); err != nil {
			return err
		}
		e.setMembership(b.snap.Metadata.ConfState, b.members)
		e.snapshots.index.Store(b.snap.Metadata.Index)
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

func (e *engine) raft() *rawRaft { return e.node.Load() }

// Process, ReportUnreachable and ReportSnapshot are the transport's way
// into raft (messageHandler).
func (e *engine) Process(ctx context.Context, m raftpb.Message) error {
	if e.answerHandOver(m) || e.catchingUp(&m) {
		return nil
	}
	if err := e.checkLog(m); err != nil {
		return err
	}
	switch m.Type {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
		e.lastContact.Store(time.Now().UnixNano())
	}
	return e.raft().Step(ctx, m)
}

func (e *engine) ReportUnreachable(id uint64) { e.raft().ReportUnreachable(id) }

func (e *engine) ReportSnapshot(id uint64, status etcdraft.SnapshotStatus) {
	e.sentSnapshot()
	e.raft().ReportSnapshot(id, status)
}

// close stops the loops and raft; the caller closes the transport and
// stores afterwards.
func (e *engine) close() error {
	close(e.stop)
	e.wg.Wait()
	e.raft().Stop()
	e.snapshots.toSend.reads.Wait()
	e.role.Store(int32(etcdraft.StateFollower))
	e.leader.Store(0)
	return nil
}

// bootstrapCluster is BootstrapCluster for the raft engine: it is run by
// the Ready loop, which swaps the waiting raft node for a bootstrapped one.
func (e *engine) bootstrapCluster(voters []Peer) error {
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
