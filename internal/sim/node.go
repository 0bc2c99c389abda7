package sim

// A simulated node: etcd raft's RawNode, with raftnode's own
// configuration (raftnode.RaftConfig), each Ready's work done by
// raftnode's own ReadyCore (the order the engine's Ready loop does it
// in: messages split around the write by SplitMessages, committed
// entries applied while the write is under way, a snapshot first, a
// failed write retried whole), its committed entries read with
// raftnode's framing and decoding (ParseProposal, DecodeCommand) and
// applied to a real statemachine.Machine, and raftnode's catch-up rule
// after a damaged log (CatchUp, HandOvers, HandOverTarget) and lost-log
// proof (LogLost) deciding what happens to each message. What this file
// does itself is the driving: raftnode runs goroutines around a
// goroutine-driven etcdraft.Node; here the scheduler calls RawNode and
// the ReadyCore directly, so one step of the simulation is one thing
// that happens, and a Ready's write waits in the disk's page cache until
// a later event syncs it. Each batch of committed entries is applied by
// raftnode's own rule (ApplyEntries: entries a snapshot covers skipped,
// this node's proposals answered, configuration changes applied); what
// is the simulator's is what applying an entry does to its calls and
// its record of the run.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math"
	"slices"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

var quiet = &etcdraft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

type node struct {
	s  *Sim
	id uint64

	up          bool
	incarnation int // bumped by every crash; a completion from an older one is void
	refused     string
	failed      string // set when the node stops on a lost log (raftnode/loglost.go)

	disk  *disk
	store *raftnode.Disk // raftnode's disk storage over disk; nil while down
	ms    *etcdraft.MemoryStorage
	rn    *etcdraft.RawNode
	core  *raftnode.ReadyCore // raftnode's order of a Ready's work, driven by process and synced
	m     *statemachine.Machine

	applied   uint64
	confState raftpb.ConfState
	role      etcdraft.StateType
	lead      uint64
	term      uint64
	writing   bool // a Ready's write is in flight: no ticks, no next Ready
	lastSnap  uint64
	writeErr  error // the Ready's write failed (a failed fsync); synced reports it
	// catchUp is the catch-up point, as the meta store holds it; members
	// the member count last recorded there.
	catchUp raftnode.CatchUp
	members uint64
	// snapWanted: raft asked for a snapshot naming every member now
	// (raftStorage); the next apply takes one.
	snapWanted bool

	handOvers *raftnode.HandOvers   // the leader's side of the catch-up rule
	lease     *raftnode.LeaderLease // the leader's lease, which heartbeats need

	clockOffset int64 // wall clock minus simulated time: jumps move it
	pausedUntil int64

	proposals map[uint64]*call // request number → the call waiting for its entry
	reqSeq    uint64
	reads     []*call // linearizable reads waiting for their ReadState and apply
	readSeq   uint64
	waiters   map[int64]*call // session → a queued acquire waiting for its grant
	lessor    lessorDriver
}

func newNode(s *Sim, id uint64) *node {
	return &node{s: s, id: id, disk: newDisk()}
}

// boot starts the node from its disk, or bootstraps the cluster's first
// configuration on an empty one, as raftnode does with Config.Bootstrap.
func (n *node) boot() {
	n.up = true
	n.writing = false
	n.snapWanted = false
	n.writeErr = nil
	n.role, n.lead, n.term = etcdraft.StateFollower, 0, 0
	n.proposals = map[uint64]*call{}
	n.waiters = map[int64]*call{}
	n.reads = nil
	n.lease = raftnode.NewLeaderLease(tickInterval, n.lessorNow())
	n.lessorBoot()
	n.handOvers = raftnode.NewHandOvers(electionTimeout)
	n.m = statemachine.New()
	n.applied = 0
	n.confState = raftpb.ConfState{}
	n.ms = etcdraft.NewMemoryStorage()
	// raftnode's open: the verifying reader, the repair of damage (the
	// entries cut owed, in the catch-up point) or a refusal, over what
	// the crash left of the disk.
	store, l, err := raftnode.OpenDisk(n.disk.files(), segmentSize, discard)
	n.s.check.count(invRepairs)
	if err != nil {
		n.up = false
		n.refused = err.Error()
		n.s.stats.Refused++
		n.s.tracef(n.id, "refuses to start: %s", n.refused)
		// Every simulated node is a member with peers to catch up from:
		// raftnode cuts damage off and owes it (CutDamage), and refuses
		// only a node alone.
		n.s.fail(invRepairs, "n%d refuses to start: %s", n.id, n.refused)
		return
	}
	n.store = store
	n.catchUp, err = store.CatchUp()
	must(err)
	n.members = 0
	if !etcdraft.IsEmptySnap(l.Snap) {
		l.Snap = unwrapSnapshot(l.Snap)
		must(n.ms.ApplySnapshot(l.Snap))
		n.restore(l.Snap)
	}
	must(n.ms.Append(l.Entries))
	if !etcdraft.IsEmptyHardState(l.HardState) {
		must(n.ms.SetHardState(l.HardState))
	}
	n.term = l.HardState.Term
	fresh := etcdraft.IsEmptySnap(l.Snap) && len(l.Entries) == 0 && etcdraft.IsEmptyHardState(l.HardState)
	cfg := raftnode.RaftConfig(n.id, raftStorage{n.ms, n}, l.Snap.Metadata.Index, 0)
	cfg.Logger = quiet
	rn, err := etcdraft.NewRawNode(&cfg)
	must(err)
	n.rn = rn
	fx := readyFx{n}
	n.core = raftnode.NewReadyCore(raftnode.ReadyEffects{
		Log:   fx,
		Raft:  n.ms,
		Send:  fx,
		Apply: fx,
		Host:  fx,
		Advance: func(rd etcdraft.Ready) bool {
			rn.Advance(rd)
			return true
		},
		Split: fx.split,
	}, l.HardState.Term)
	if fresh && n.id <= uint64(n.s.opts.Nodes) {
		var peers []etcdraft.Peer
		for i := range n.s.opts.Nodes {
			peers = append(peers, etcdraft.Peer{ID: uint64(i + 1)})
		}
		must(rn.Bootstrap(peers))
	}
	n.s.tracef(n.id, "starts: last index %d, commit %d, term %d, catch-up %d", lastIndex(n.ms), l.HardState.Commit, l.HardState.Term, n.catchUp.Index)
	inc := n.incarnation
	n.s.after(n.s.randDur(tickInterval), func() { n.tick(inc) })
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func lastIndex(ms *etcdraft.MemoryStorage) uint64 {
	i, _ := ms.LastIndex()
	return i
}

// wall is the node's wall clock, which the leader stamps on commands.
func (n *node) wall() int64 { return 1_700_000_000e9 + n.s.now + n.clockOffset }

func (n *node) paused() bool { return n.s.now < n.pausedUntil }

// tick is the node's ticker (raftnode/ready.go run). A paused node's
// tick fires when it resumes; a node that is writing loses the tick, as
// raftnode's loop does while persist blocks it.
func (n *node) tick(inc int) {
	if !n.up || inc != n.incarnation {
		return
	}
	if n.paused() {
		n.s.after(n.pausedUntil-n.s.now, func() { n.tick(inc) })
		return
	}
	n.s.after(int64(tickInterval), func() { n.tick(inc) })
	// The lessor's pulse (lessor/stall.go): a goroutine of its own in
	// the server, so it beats while persist blocks the Ready loop.
	n.lessor.l.Pulse()
	if n.writing || n.failed != "" {
		return
	}
	if p := n.catchUpPoint(); !p.Owes() || n.s.opts.Bugs.SkipCatchUp {
		n.rn.Tick()
	} else if p.EndsAlone(n.applied, lastIndex(n.ms), raftnode.Members(n.confState)) {
		n.setCatchUp(raftnode.CatchUp{})
	}
	n.renewLease()
	n.lessorTick()
}

// renewLease begins a ReadIndex round for the leader's lease when it
// wants renewing, as the engine's tick does (raftnode/ready.go).
func (n *node) renewLease() {
	if n.role == etcdraft.StateLeader && n.lease.Due(n.lessorNow()) {
		n.readIndex()
	}
}

// readIndex begins a ReadIndex round and returns its ID; a leader's
// round counts for its lease (raftnode/readindex.go readRound).
func (n *node) readIndex() uint64 {
	n.readSeq++
	if n.role == etcdraft.StateLeader && !n.s.opts.Bugs.NoLeaderLease {
		n.lease.Begin(n.readSeq, n.term, n.lessorNow())
	}
	var ctx [8]byte
	binary.BigEndian.PutUint64(ctx[:], n.readSeq)
	n.rn.ReadIndex(ctx[:])
	return n.readSeq
}

// receive is the transport's Process (raftnode/engine.go).
func (n *node) receive(m raftpb.Message) {
	if !n.up || n.failed != "" {
		return
	}
	if n.paused() {
		inc := n.incarnation
		n.s.after(n.pausedUntil-n.s.now, func() {
			if inc == n.incarnation {
				n.receive(m)
			}
		})
		return
	}
	n.s.tracef(n.id, "recv %s", msgString(m))
	if n.handOverRequest(m) || n.catchingUp(&m) {
		return
	}
	if raftnode.LogLost(m, lastIndex(n.ms)) {
		// The leader knows this log reached further than it does; the
		// data was lost. The node stops, as raftnode's checkLog stops it.
		n.failed = fmt.Sprintf("log lost: leader %d knows index %d, log ends at %d", m.From, m.Commit, lastIndex(n.ms))
		n.s.stats.Failed++
		n.s.tracef(n.id, "stops: %s", n.failed)
		return
	}
	if n.s.opts.Bugs.VoteIgnoresLog && (m.Type == raftpb.MsgVote || m.Type == raftpb.MsgPreVote) {
		// The wrong build, around raft itself: the request claims a log
		// no voter's beats.
		m.LogTerm, m.Index = math.MaxUint32, math.MaxUint32
	}
	_ = n.rn.Step(m)
}

// process starts one Ready's work, if there is one and no write is in
// flight, through raftnode's own ReadyCore: the messages that need
// nothing durable sent, committed entries applied, the write put in the
// disk's page cache, which a later event syncs (synced).
func (n *node) process() {
	if !n.up || n.failed != "" || n.writing || n.paused() || !n.rn.HasReady() {
		return
	}
	n.core.Begin(n.rn.Ready())
	n.writing = true
	n.write()
	n.syncLater(0)
}

// write makes the Ready's write, which stays in flight in the disk's
// page cache until the sync event; an error (a failed fsync) waits for
// that event too, when the fsync would have returned.
func (n *node) write() {
	n.disk.inReady = true
	n.writeErr = n.core.Write()
	n.disk.inReady = false
}

// syncLater schedules the sync of the write in flight, after the disk's
// latency.
func (n *node) syncLater(attempt int) {
	inc := n.incarnation
	n.s.after(n.s.randDur(n.s.opts.Faults.MaxDiskLatency)+int64(50_000), func() { n.synced(inc, attempt) })
}

var errSyncFailed = errors.New("fsync failed")

// synced completes the write in flight: on success the core hands raft
// the write, sends the held-back messages and advances. A failed sync
// drops what was written, and the core writes the whole Ready again
// after raftnode.RetryWrite, acknowledging nothing meanwhile.
func (n *node) synced(inc, attempt int) {
	if !n.up || inc != n.incarnation {
		return
	}
	if err := n.writeErr; err != nil {
		n.writeErr = nil
		if errors.Is(err, raftnode.ErrLogDamaged) {
			// The engine stops the node (Node.Failed), and the server
			// exits; a supervisor starts it again, which repairs the log.
			n.s.tracef(n.id, "stops: %v", err)
			n.crash()
			n.s.restartLater(n)
			return
		}
		n.core.Failed(err)
		n.s.after(int64(raftnode.RetryWrite), func() {
			if !n.up || inc != n.incarnation {
				return
			}
			n.write()
			n.syncLater(attempt + 1)
		})
		return
	}
	n.disk.sync()
	must(n.core.Synced())
	if n.votedNow(n.core.Later()) {
		return
	}
	n.writing = false
	n.snapWanted = false
	n.core.Advance()
	n.maybeSnapshot()
	n.serveReads()
}

// readyFx is what the node's ReadyCore does its work with: the simulated
// network and disk, and apply, run at once on the scheduler's goroutine.
type readyFx struct{ n *node }

func (f readyFx) Send(msgs []raftpb.Message) { f.n.s.net.send(f.n, msgs) }

// split is raftnode.SplitMessages; the AckBeforeSync bug sends
// everything before the write, in raft's order.
func (f readyFx) split(msgs []raftpb.Message) (now, later []raftpb.Message) {
	if f.n.s.opts.Bugs.AckBeforeSync {
		return msgs, nil
	}
	return raftnode.SplitMessages(msgs)
}

// SaveSnapshot, SaveHardState and Append are raftnode's disk storage's
// own; their writes wait in the disk's page cache for the sync event.
func (f readyFx) SaveSnapshot(snap raftpb.Snapshot) error {
	return f.n.store.SaveSnapshot(wrapSnapshot(snap))
}

func (f readyFx) SaveHardState(hs raftpb.HardState) error {
	if f.n.s.opts.Bugs.ForgetVote {
		hs.Vote = 0
	}
	return f.n.store.SaveHardState(hs)
}

func (f readyFx) Append(ents []raftpb.Entry) error { return f.n.store.Append(ents) }

// Apply applies a batch at once, in raftnode's order: a snapshot, the
// entries, then the proposals of an older term failed. A step-down has
// failed them already (setRole, which also stops the lessor).
func (f readyFx) Apply(b raftnode.ApplyBatch) bool {
	if b.Snapshot != nil {
		f.n.restore(*b.Snapshot)
	}
	f.n.applyEntries(b.Entries)
	if b.Term > 0 {
		f.n.failProposals("term moved on")
	}
	return true
}

// Persisted needs nothing: apply is done by then, and the node
// snapshots after the Ready (maybeSnapshot).
func (f readyFx) Persisted() {}

func (f readyFx) SetRole(role etcdraft.StateType, lead uint64) bool {
	was := f.n.role
	f.n.setRole(role, lead)
	return was == etcdraft.StateLeader && role != etcdraft.StateLeader
}

func (f readyFx) HardState(hs raftpb.HardState) { f.n.term = hs.Term }

func (f readyFx) ReadIndex(req, index uint64) { f.n.readState(req, index) }

func (f readyFx) FailReads() { f.n.failReads() }

func (f readyFx) FailProposals() { f.n.failProposals("disk failed") }

func (f readyFx) WriteFailed(_ error, attempt int) {
	f.n.s.tracef(f.n.id, "fsync fails (attempt %d): nothing acknowledged, retry in %v", attempt, raftnode.RetryWrite)
}

func (f readyFx) Resumed() {
	st := f.n.rn.BasicStatus()
	f.n.setRole(st.RaftState, st.Lead)
}

// votedNow crashes the node, with the chance Faults.CrashAfterVote, if
// it just granted a vote, and reports whether it did.
func (n *node) votedNow(sent []raftpb.Message) bool {
	p := n.s.opts.Faults.CrashAfterVote
	if p == 0 || n.s.healing {
		return false
	}
	for _, m := range sent {
		if m.Type == raftpb.MsgVoteResp && !m.Reject && n.s.rng.Float64() < p {
			n.s.stats.Faults["crash after vote"]++
			n.crash()
			inc := n.incarnation
			n.s.after(int64(100*time.Millisecond)+n.s.randDur(300*time.Millisecond), func() {
				if !n.up && n.incarnation == inc && n.refused == "" {
					n.boot()
				}
			})
			return true
		}
	}
	return false
}

// setRole notes a role change, and starts or stops the lessor.
func (n *node) setRole(role etcdraft.StateType, lead uint64) {
	was := n.role
	n.role, n.lead = role, lead
	if was == role {
		return
	}
	n.s.tracef(n.id, "becomes %s (term %d, leader %d)", role, n.rn.BasicStatus().Term, lead)
	if role == etcdraft.StateLeader {
		n.s.stats.Leaders++
		term := n.rn.BasicStatus().Term
		n.s.check.leader(n.id, term)
		n.s.check.leaderComplete(n, term)
		n.lessorStart()
		n.renewLease()
	}
	if was == etcdraft.StateLeader {
		n.lease.End()
		n.lessorDemote()
		n.failProposals("stepped down")
		n.failReads()
	}
}

// applyEntries applies committed entries by raftnode's own rule
// (raftnode.ApplyEntries, what the engine's apply runs). The
// ApplyOutOfOrder bug swaps two entries of node 1's batch around the
// real call.
func (n *node) applyEntries(ents []raftpb.Entry) {
	if n.s.opts.Bugs.ApplyOutOfOrder && n.id == 1 && len(ents) >= 2 {
		ents = slices.Clone(ents)
		ents[0], ents[1] = ents[1], ents[0]
	}
	raftnode.ApplyEntries(ents, n.applied, n.id, &entryFx{n: n})
	n.serveReads()
}

// entryFx is what raftnode.ApplyEntries applies each entry with: the
// machine, the node's calls, and the invariants' record of every entry
// applied.
type entryFx struct {
	n   *node
	cmd statemachine.Command // the command of the entry being applied
}

func (f *entryFx) Command(_ raftpb.Entry, data []byte) statemachine.Result {
	cmd, res := f.n.applyData(data)
	f.cmd = cmd
	return res
}

func (f *entryFx) Answer(req uint64, ent raftpb.Entry, res statemachine.Result) {
	f.n.answer(req, ent.Index, res)
}

func (f *entryFx) ConfChange(ent raftpb.Entry) {
	n := f.n
	if ent.Type == raftpb.EntryConfChange {
		var cc raftpb.ConfChange
		must(cc.Unmarshal(ent.Data))
		n.confState = *n.rn.ApplyConfChange(cc)
	} else {
		var cc raftpb.ConfChangeV2
		must(cc.Unmarshal(ent.Data))
		n.confState = *n.rn.ApplyConfChange(cc)
	}
	n.recordMembers()
}

func (f *entryFx) Applied(ent raftpb.Entry, res statemachine.Result) {
	n := f.n
	n.s.check.applied(n, ent, res, n.m.Revision())
	n.applied = max(n.applied, ent.Index)
	n.observe(f.cmd, res)
	n.s.publish(n, res.Events)
	f.cmd = nil
}

// applyData decodes a command as raftnode's applier does
// (raftnode.DecodeCommand: a binary entry below BinaryVersion refused)
// and applies it.
func (n *node) applyData(data []byte) (statemachine.Command, statemachine.Result) {
	now, cmd, err := raftnode.DecodeCommand(data, n.m.ClusterVersion())
	if err != nil {
		return nil, statemachine.Result{Revision: n.m.Revision(), Err: err}
	}
	return cmd, n.m.Apply(now, cmd)
}

// recordMembers records the member count a start that finds damage
// decides by, as raftnode's recordMembers does at every configuration.
func (n *node) recordMembers() {
	if m := raftnode.Members(n.confState); m != n.members {
		must(n.store.SetMembers(m))
		n.members = m
	}
}

// restore replaces the state with a snapshot's.
func (n *node) restore(snap raftpb.Snapshot) {
	m := statemachine.New()
	must(m.Restore(bytes.NewReader(snap.Data)))
	n.m = m
	n.s.restoredHub(n, m.Revision())
	n.applied = snap.Metadata.Index
	n.lastSnap = snap.Metadata.Index
	n.confState = snap.Metadata.ConfState
	n.recordMembers() // raftnode/membership.go setMembership does too
	n.s.check.restored(n, snap.Metadata.Index, m.Revision())
	n.s.stats.Restores++
	n.s.tracef(n.id, "restores snapshot at %d", snap.Metadata.Index)
}

// maybeSnapshot snapshots every SnapshotEvery applied entries, at an
// index raft's storage holds (raftnode/apply.go snapshotWhenPersisted),
// and compacts the log behind it, keeping a tail for slow followers.
func (n *node) maybeSnapshot() {
	every := n.s.opts.SnapshotEvery
	wanted := n.snapWanted && n.applied > n.lastSnap
	if every == 0 || (n.applied < n.lastSnap+every && !wanted) || n.applied > lastIndex(n.ms) {
		return
	}
	n.snapWanted = false
	var buf bytes.Buffer
	must(n.m.Snapshot(&buf))
	cs := n.confState
	snap, err := n.ms.CreateSnapshot(n.applied, &cs, buf.Bytes())
	if err != nil {
		return
	}
	var compactTo uint64
	if keep := every / 2; n.applied > keep {
		compactTo = n.applied - keep
	}
	must(n.store.Snapshot(snap.Metadata, wrapSnapshot(snap).Data, compactTo))
	n.lastSnap = n.applied
	if compactTo > 0 {
		_ = n.ms.Compact(compactTo)
	}
	n.s.stats.Snaps++
	n.s.tracef(n.id, "snapshot at %d", n.applied)
}

// raftStorage is raftnode's raftStorage (raftnode/snapshot.go): raft's
// MemoryStorage, except that a snapshot to send that does not name every
// member now (raftnode.NamesEveryMember) is withheld, raft told to try
// again, and a fresh one asked for, which maybeSnapshot takes at the
// next apply. Without it, a learner added after the newest snapshot
// refused that snapshot until the next one, 300 entries later (seed 2
// with five voters: n6 was sent it 1,860 times and never promoted).
type raftStorage struct {
	*etcdraft.MemoryStorage
	n *node
}

func (s raftStorage) Snapshot() (raftpb.Snapshot, error) {
	snap, err := s.MemoryStorage.Snapshot()
	if err != nil || etcdraft.IsEmptySnap(snap) {
		return snap, err
	}
	if !raftnode.NamesEveryMember(snap.Metadata.ConfState, s.n.confState) {
		// raftnode's apply loop takes it as soon as it is asked, not at
		// the next entry: the cluster may be idle.
		if n, inc := s.n, s.n.incarnation; !n.snapWanted {
			n.snapWanted = true
			n.s.after(0, func() {
				if n.up && n.incarnation == inc {
					n.maybeSnapshot()
				}
			})
		}
		return raftpb.Snapshot{}, etcdraft.ErrSnapshotTemporarilyUnavailable
	}
	return snap, nil
}

// crash stops the node at once: memory gone, unsynced writes lost, the
// first of them perhaps torn.
func (n *node) crash() {
	if !n.up {
		return
	}
	n.up = false
	n.incarnation++
	inFlight, torn := n.disk.crash(n.s.rng, n.s.rng.IntN(3) == 0)
	// raftnode's storage goes with the process; Close only stops
	// raft-wal's goroutine, and writes nothing (the crash made every
	// handle it holds stale).
	if n.store != nil {
		_ = n.store.Close()
		n.store = nil
	}
	n.s.tracef(n.id, "crashes: %d writes and syncs in flight, torn write: %v", inFlight, torn)
	n.dropCalls()
}

// catchUpPoint is the node's catch-up point, as its meta store holds it.
func (n *node) catchUpPoint() raftnode.CatchUp {
	return n.catchUp
}

// setCatchUp records the catch-up point; the meta store is written
// synchronously, as raftnode writes it.
func (n *node) setCatchUp(p raftnode.CatchUp) {
	n.catchUp = p
	must(n.store.SetCatchUp(p))
}

// catchingUp runs raftnode's catch-up rule (raftnode.CatchUp.Receive) on
// m, as raftnode's engine does: it reports whether m is dropped, and
// cuts a heartbeat's commit to the log's end in place. The SkipCatchUp
// bug skips the rule.
func (n *node) catchingUp(m *raftpb.Message) bool {
	p := n.catchUpPoint()
	if !p.Owes() || n.s.opts.Bugs.SkipCatchUp {
		return false
	}
	last := lastIndex(n.ms)
	lastTerm, _ := n.ms.Term(last)
	step := p.Receive(*m, last, lastTerm)
	if step.Next != p {
		n.setCatchUp(step.Next)
		if !step.Next.Owes() {
			n.s.stats.CaughtUp++
			n.s.tracef(n.id, "caught up past its damaged log (last index %d): votes again", last)
		}
	}
	if step.HandOver {
		n.s.net.send(n, []raftpb.Message{raftnode.HandOverRequest(n.id, m.From)})
	}
	*m = step.Msg
	return step.Drop
}

// handOverRequest is the leader's side of the rule, as raftnode's engine
// answers it: a leader asked by a catching-up member hands leadership to
// raftnode.HandOverTarget, at most as often as raftnode.HandOvers
// admits, on the simulated clock.
func (n *node) handOverRequest(m raftpb.Message) bool {
	if !raftnode.IsHandOverRequest(m) {
		return false
	}
	if n.role != etcdraft.StateLeader || !n.handOvers.Admit(time.Unix(0, n.s.now)) {
		return true
	}
	if target := raftnode.HandOverTarget(n.rn.Status(), m.From); target != 0 {
		n.s.tracef(n.id, "hands leadership to %d so that %d catches up", target, m.From)
		n.lease.Void(n.lessorNow())
		n.rn.TransferLeader(target)
	}
	return true
}

// digest is an entry's identity for the invariants.
func digest(ent raftpb.Entry) uint64 {
	h := fnv.New64a()
	var b [17]byte
	binary.BigEndian.PutUint64(b[:], ent.Term)
	b[8] = byte(ent.Type)
	h.Write(b[:9])
	h.Write(ent.Data)
	return h.Sum64()
}
