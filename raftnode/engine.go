package raftnode

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
type engine struct {
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

// openEtcd starts the engine on the stores open has opened.
func startEngine(n *Node, cfg Config, st stores, trans peerTransport) (*engine, error) {
	e := &engine{
		n:           n,
		rid:         raftID(cfg.NodeID),
		self:        memberInfo{ID: cfg.NodeID, Addr: trans.LocalAddr()},
		ms:          etcdraft.NewMemoryStorage(),
		disk:        &diskStorage{wal: st.wal, meta: st.meta, snapshots: st.snapshots, log: n.log},
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
func (e *engine) restoreBoot(b bootState) error {
	if !etcdraft.IsEmptySnap(b.snap) {
		if err := e.ms.ApplySnapshot(b.snap); err != nil {
			return fmt.Errorf("raftnode: load snapshot: %w", err)
		}
		if err := e.n.applier.restoreBytes(b.state); err != nil {
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

func (e *engine) raft() etcdraft.Node { return e.node.Load().Node }

// Process, ReportUnreachable and ReportSnapshot are the transport's way
// into raft (messageHandler).
func (e *engine) Process(ctx context.Context, m raftpb.Message) error {
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
	e.raft().ReportSnapshot(id, status)
}

// close stops the loops and raft; the caller closes the transport and
// stores afterwards.
func (e *engine) close() error {
	close(e.stop)
	e.wg.Wait()
	e.raft().Stop()
	e.role.Store(int32(etcdraft.StateFollower))
	e.leader.Store(0)
	return nil
}

// bootstrapCluster is BootstrapCluster for the etcd engine: it is run by
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
