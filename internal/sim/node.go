package sim

// A simulated node: etcd raft's RawNode, configured as raftnode
// configures its Node (raftnode/engine.go startEngine), its Ready handled
// in the order raftnode's Ready loop handles it (raftnode/ready.go), its
// committed entries applied to a real statemachine.Machine the way
// raftnode's applier decodes them (raftnode/apply.go, applier.go), and
// the catch-up rule after a damaged log (raftnode/catchup.go). The one
// difference in kind: raftnode runs three goroutines around a
// goroutine-driven etcdraft.Node; here the scheduler calls RawNode
// directly, so one step of the simulation is one thing that happens.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math"
	"slices"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// proposalHeader is raftnode/propose.go's: every normal entry starts
// with the proposing node's raft ID and its request number, so that
// apply can answer the proposer.
const proposalHeader = 16

// maxSizePerMsg is raftnode/config.go's maxSizePerMsg; maxLogMemory its
// defaultMaxLogMemoryBytes, from which engine.go sets raft's byte limits.
const (
	maxSizePerMsg = 1 << 20
	maxLogMemory  = 64 << 20
)

var quiet = &etcdraft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

type node struct {
	s  *Sim
	id uint64

	up          bool
	incarnation int // bumped by every crash; a completion from an older one is void
	refused     string
	failed      string // set when the node stops on a lost log (raftnode/loglost.go)

	disk *disk
	ms   *etcdraft.MemoryStorage
	rn   *etcdraft.RawNode
	m    *statemachine.Machine

	applied   uint64
	confState raftpb.ConfState
	role      etcdraft.StateType
	lead      uint64
	term      uint64
	writing   bool // a Ready's write is in flight: no ticks, no next Ready
	lastSnap  uint64

	catchUp      uint64 // raftnode/catchup.go: the index the log must reach before the node votes
	lastHandOver int64

	clockOffset int64 // wall clock minus simulated time: jumps move it
	pausedUntil int64
	lastTick    int64
	stallUntil  int64 // lessor/stall.go: heartbeats refused until then
	failSync    bool  // the next sync fails

	proposals map[uint64]*call // request number → the call waiting for its entry
	reqSeq    uint64
	reads     []*call // linearizable reads waiting for their ReadState and apply
	readSeq   uint64
	waiters   map[int64]*call // session → a queued acquire waiting for its grant
	lessor    lessor
}

func newNode(s *Sim, id uint64) *node {
	return &node{s: s, id: id, disk: &disk{}}
}

// config mirrors raftnode/engine.go's etcdraft.Config, field by field.
func (n *node) config(applied uint64) *etcdraft.Config {
	return &etcdraft.Config{
		ID:                        n.id,
		ElectionTick:              10, // electionTicks
		HeartbeatTick:             1,
		Storage:                   n.ms,
		Applied:                   applied,
		MaxSizePerMsg:             maxSizePerMsg,
		MaxInflightMsgs:           256,
		MaxInflightBytes:          maxLogMemory / 4,
		MaxUncommittedEntriesSize: maxLogMemory,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    quiet,
	}
}

// boot starts the node from its disk, or bootstraps the cluster's first
// configuration on an empty one, as raftnode does with Config.Bootstrap.
func (n *node) boot() {
	n.up = true
	n.writing = false
	n.failSync = false
	n.role, n.lead, n.term = etcdraft.StateFollower, 0, 0
	n.proposals = map[uint64]*call{}
	n.waiters = map[int64]*call{}
	n.reads = nil
	n.lessor = lessor{}
	n.m = statemachine.New()
	n.applied = 0
	n.confState = raftpb.ConfState{}
	n.ms = etcdraft.NewMemoryStorage()
	l := n.disk.load(n.s.opts.Bugs.SkipCatchUp)
	if l.refused != "" {
		n.up = false
		n.refused = l.refused
		n.s.stats.Refused++
		n.s.tracef(n.id, "refuses to start: %s", l.refused)
		return
	}
	if l.damaged {
		n.s.tracef(n.id, "log damaged: cut the damage off, owes entries up to %d", l.owed)
	}
	if !etcdraft.IsEmptySnap(l.snap) {
		must(n.ms.ApplySnapshot(l.snap))
		n.restore(l.snap)
	}
	must(n.ms.Append(l.ents))
	if !etcdraft.IsEmptyHardState(l.hs) {
		must(n.ms.SetHardState(l.hs))
	}
	n.term = l.hs.Term
	n.catchUp = n.disk.catchUp
	n.lastTick = n.s.now
	fresh := etcdraft.IsEmptySnap(l.snap) && len(l.ents) == 0 && etcdraft.IsEmptyHardState(l.hs)
	rn, err := etcdraft.NewRawNode(n.config(l.snap.Metadata.Index))
	must(err)
	n.rn = rn
	if fresh && n.id <= uint64(n.s.opts.Nodes) {
		var peers []etcdraft.Peer
		for i := range n.s.opts.Nodes {
			peers = append(peers, etcdraft.Peer{ID: uint64(i + 1)})
		}
		must(rn.Bootstrap(peers))
	}
	n.s.tracef(n.id, "starts: last index %d, commit %d, term %d, catch-up %d", lastIndex(n.ms), l.hs.Commit, l.hs.Term, n.catchUp)
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
	if n.s.now-n.lastTick > int64(electionTimeout) {
		// lessor/stall.go: a node that did not run for an election
		// timeout refuses heartbeats for two more, until raft has ended
		// or confirmed its leadership.
		n.stallUntil = n.s.now + 2*int64(electionTimeout)
	}
	n.lastTick = n.s.now
	if n.writing || n.failed != "" {
		return
	}
	if n.catchUp == 0 || n.s.opts.Bugs.SkipCatchUp {
		n.rn.Tick()
	} else {
		n.catchUpAlone()
	}
	n.lessorTick()
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
	if m.Type == raftpb.MsgHeartbeat && m.Commit > lastIndex(n.ms) {
		// raftnode/loglost.go checkLog: the leader knows this log reached
		// further than it does; the data was lost. The node stops.
		n.failed = fmt.Sprintf("log lost: leader %d knows index %d, log ends at %d", m.From, m.Commit, lastIndex(n.ms))
		n.s.stats.Failed++
		n.s.tracef(n.id, "stops: %s", n.failed)
		return
	}
	if n.s.opts.Bugs.VoteIgnoresLog && (m.Type == raftpb.MsgVote || m.Type == raftpb.MsgPreVote) {
		m.LogTerm, m.Index = math.MaxUint32, math.MaxUint32
	}
	_ = n.rn.Step(m)
}

// process handles one Ready, if there is one and no write is in flight
// (raftnode/ready.go handleReady).
func (n *node) process() {
	if !n.up || n.failed != "" || n.writing || n.paused() || !n.rn.HasReady() {
		return
	}
	rd := n.rn.Ready()
	if rd.SoftState != nil {
		n.setRole(rd.SoftState.RaftState, rd.SoftState.Lead)
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) && rd.HardState.Term > n.term {
		n.term = rd.HardState.Term
		n.failProposals("term moved on")
	}
	later := n.sendBeforeWrite(rd.Messages)
	if etcdraft.IsEmptySnap(rd.Snapshot) {
		// Committed entries are durable on a quorum: applied while this
		// Ready's write is under way.
		n.applyEntries(rd.CommittedEntries)
	}
	n.writing = true
	n.write(rd)
	inc := n.incarnation
	n.s.after(n.s.randDur(n.s.opts.Faults.MaxDiskLatency)+int64(50_000), func() { n.synced(inc, rd, later, 0) })
}

// sendBeforeWrite mirrors raftnode: votes and append acknowledgements
// wait for the write; everything else leaves now.
func (n *node) sendBeforeWrite(msgs []raftpb.Message) (later []raftpb.Message) {
	var now []raftpb.Message
	for _, m := range msgs {
		switch m.Type {
		case raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
			if !n.s.opts.Bugs.AckBeforeSync {
				later = append(later, m)
				continue
			}
		}
		now = append(now, m)
	}
	n.s.net.send(n, now)
	return later
}

// write puts a Ready's snapshot, hard state and entries in the page
// cache (raftnode/ready.go write); synced makes them durable.
func (n *node) write(rd etcdraft.Ready) {
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		n.disk.saveSnapshot(rd.Snapshot) // raftnode writes and syncs snapshot files whole
	}
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		hs := rd.HardState
		if n.s.opts.Bugs.ForgetVote {
			hs.Vote = 0
		}
		n.disk.setHardState(hs)
	}
	n.disk.appendEntries(rd.Entries)
}

// synced completes a Ready's write: on success the entries go to raft's
// storage, the held-back messages leave, and raft is told to advance. A
// failed sync is retried a second later, with the whole Ready written
// again, and nothing is acknowledged meanwhile (raftnode/ready.go
// persist).
func (n *node) synced(inc int, rd etcdraft.Ready, later []raftpb.Message, attempt int) {
	if !n.up || inc != n.incarnation {
		return
	}
	if n.failSync {
		n.failSync = false
		n.disk.dropPending()
		n.s.tracef(n.id, "fsync fails (attempt %d): nothing acknowledged, retry in 1s", attempt)
		if attempt == 0 {
			n.setRole(etcdraft.StateFollower, 0)
			n.failProposals("disk failed")
			n.failReads()
		}
		n.s.after(int64(1e9), func() {
			if !n.up || inc != n.incarnation {
				return
			}
			n.write(rd)
			n.s.after(n.s.randDur(n.s.opts.Faults.MaxDiskLatency)+int64(50_000), func() { n.synced(inc, rd, later, attempt+1) })
		})
		return
	}
	n.disk.sync()
	if attempt > 0 {
		st := n.rn.BasicStatus()
		n.setRole(st.RaftState, st.Lead)
	}
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		if err := n.ms.ApplySnapshot(rd.Snapshot); err == nil {
			n.restore(rd.Snapshot)
		}
	}
	must(n.ms.Append(rd.Entries))
	if !etcdraft.IsEmptyHardState(rd.HardState) {
		must(n.ms.SetHardState(rd.HardState))
	}
	if !etcdraft.IsEmptySnap(rd.Snapshot) {
		n.applyEntries(rd.CommittedEntries)
	}
	n.s.net.send(n, later)
	if n.votedNow(later) {
		return
	}
	for _, rs := range rd.ReadStates {
		n.readState(binary.BigEndian.Uint64(rs.RequestCtx), rs.Index)
	}
	n.writing = false
	n.rn.Advance(rd)
	n.maybeSnapshot()
	n.serveReads()
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
	}
	if was == etcdraft.StateLeader {
		n.lessor = lessor{}
		n.failProposals("stepped down")
		n.failReads()
	}
}

// applyEntries applies committed entries in order (raftnode/apply.go
// applyEntries). A restored snapshot may cover some already.
func (n *node) applyEntries(ents []raftpb.Entry) {
	if n.s.opts.Bugs.ApplyOutOfOrder && n.id == 1 && len(ents) >= 2 {
		ents = slices.Clone(ents)
		ents[0], ents[1] = ents[1], ents[0]
	}
	for _, ent := range ents {
		if ent.Index <= n.applied && !(n.s.opts.Bugs.ApplyOutOfOrder && n.id == 1) {
			continue
		}
		var res statemachine.Result
		var cmd statemachine.Command
		switch ent.Type {
		case raftpb.EntryNormal:
			if len(ent.Data) >= proposalHeader {
				from, req := binary.BigEndian.Uint64(ent.Data), binary.BigEndian.Uint64(ent.Data[8:])
				if data := ent.Data[proposalHeader:]; len(data) > 0 {
					cmd, res = n.applyData(data)
				}
				if from == n.id {
					n.answer(req, ent.Index, res)
				}
			}
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			must(cc.Unmarshal(ent.Data))
			n.confState = *n.rn.ApplyConfChange(cc)
			n.recordMembers()
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			must(cc.Unmarshal(ent.Data))
			n.confState = *n.rn.ApplyConfChange(cc)
			n.recordMembers()
		}

		n.s.check.applied(n, ent, res, n.m.Revision())
		n.applied = max(n.applied, ent.Index)
		n.observe(cmd, res)
	}
	n.serveReads()
}

// applyData is raftnode/applier.go applyData: decode with the
// statemachine codec, refuse a binary entry below BinaryVersion, apply.
func (n *node) applyData(data []byte) (statemachine.Command, statemachine.Result) {
	now, cmd, err := statemachine.Decode(data)
	if err == nil && statemachine.IsBinary(data) && n.m.ClusterVersion() < statemachine.BinaryVersion {
		err = fmt.Errorf("%w: binary entry at cluster version %d", statemachine.ErrNotSupported, n.m.ClusterVersion())
	}
	if err != nil {
		return nil, statemachine.Result{Revision: n.m.Revision(), Err: err}
	}
	return cmd, n.m.Apply(now, cmd)
}

// recordMembers is raftnode/catchup.go recordMembers: the member count
// a start that finds damage decides by.
func (n *node) recordMembers() {
	n.disk.members = uint64(len(n.confState.Voters) + len(n.confState.Learners))
}

// restore replaces the state with a snapshot's.
func (n *node) restore(snap raftpb.Snapshot) {
	m := statemachine.New()
	must(m.Restore(bytes.NewReader(snap.Data)))
	n.m = m
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
	if every == 0 || n.applied < n.lastSnap+every || n.applied > lastIndex(n.ms) {
		return
	}
	var buf bytes.Buffer
	must(n.m.Snapshot(&buf))
	cs := n.confState
	snap, err := n.ms.CreateSnapshot(n.applied, &cs, buf.Bytes())
	if err != nil {
		return
	}
	n.disk.saveSnapshot(snap)
	n.lastSnap = n.applied
	if keep := every / 2; n.applied > keep {
		_ = n.ms.Compact(n.applied - keep)
	}
	n.s.stats.Snaps++
	n.s.tracef(n.id, "snapshot at %d", n.applied)
}

// crash stops the node at once: memory gone, unsynced writes lost, the
// first of them perhaps torn.
func (n *node) crash() {
	if !n.up {
		return
	}
	n.up = false
	n.incarnation++
	tear := n.s.rng.IntN(3) == 0
	torn := tear && len(n.disk.pending) > 0
	unsynced := len(n.disk.pending)
	n.disk.crash(tear, 1+n.s.rng.IntN(64))
	n.s.tracef(n.id, "crashes: %d unsynced records lost, torn write: %v", unsynced, torn)
	n.dropCalls()
}

// catchingUp is raftnode/catchup.go catchingUp, on the sim's clock: it
// reports whether m is dropped, and cuts a heartbeat's commit to the
// log's end in place.
func (n *node) catchingUp(m *raftpb.Message) bool {
	if n.catchUp == 0 || n.s.opts.Bugs.SkipCatchUp {
		return false
	}
	switch m.Type {
	case raftpb.MsgVote, raftpb.MsgPreVote:
		t, i := n.disk.catchUpTerm, n.catchUp
		return t == 0 || m.LogTerm < t || m.LogTerm == t && m.Index < i
	case raftpb.MsgTimeoutNow:
		return true
	case raftpb.MsgHeartbeat:
		last := lastIndex(n.ms)
		if m.Commit > last {
			if m.Commit > n.catchUp {
				n.setCatchUp(m.Commit, max(n.disk.catchUpTerm, m.Term))
			}
			n.s.net.send(n, []raftpb.Message{{Type: raftpb.MsgUnreachable, From: n.id, To: m.From}})
			m.Commit = last
			return false
		}
		if last >= n.catchUp {
			n.setCatchUp(0, 0)
			n.s.stats.CaughtUp++
			n.s.tracef(n.id, "caught up past its damaged log (last index %d): votes again", last)
		}
	}
	return false
}

func (n *node) setCatchUp(i, term uint64) {
	n.catchUp = i
	n.disk.catchUp, n.disk.catchUpTerm = i, term
}

// handOverRequest is raftnode/catchup.go handOverRequest: a leader asked
// by a catching-up member hands leadership to its most up-to-date other
// voter, at most once an election timeout.
func (n *node) handOverRequest(m raftpb.Message) bool {
	if m.Type != raftpb.MsgUnreachable {
		return false
	}
	if n.role != etcdraft.StateLeader || n.s.now-n.lastHandOver < int64(electionTimeout) {
		return true
	}
	n.lastHandOver = n.s.now
	var target, best uint64
	st := n.rn.Status()
	ids := make([]uint64, 0, len(st.Progress))
	for id := range st.Progress {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		pr := st.Progress[id]
		if id != n.id && id != m.From && !pr.IsLearner && (target == 0 || pr.Match > best) {
			target, best = id, pr.Match
		}
	}
	if target != 0 {
		n.s.tracef(n.id, "hands leadership to %d so that %d catches up", target, m.From)
		n.rn.TransferLeader(target)
	}
	return true
}

// catchUpAlone is raftnode/catchup.go catchUpAlone.
func (n *node) catchUpAlone() {
	if n.applied < lastIndex(n.ms) {
		return
	}
	if len(n.confState.Voters)+len(n.confState.Learners) == 1 {
		n.setCatchUp(0, 0)
	}
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
