package sim

// What the server does with a client's call, reduced to the core
// operations and mirrored from the real paths: a mutation is proposed on
// the leader only and answered when this node applies its entry
// (raftnode/propose.go); a read takes a ReadIndex, waits for apply to
// reach it and reads the state (raftnode/readindex.go); a heartbeat is
// handled in the leader's memory by the lessor and never logged
// (lessor/heartbeat.go); a blocking acquire that is queued is answered
// when the grant's entry is applied (server/waiters.go).
//
// The lessor here is a mirror, not lessor.Lessor: the real one runs its
// own goroutine on time.Now. It keeps the rules that matter to the
// invariants: a new leader times nothing until its NewEpoch entry is
// applied (a barrier), then gives every session TTL plus an election
// timeout; a heartbeat renews a session to now + TTL; an expiry carries
// the epoch; a node that did not run for an election timeout refuses
// heartbeats for two more (lessor/stall.go). Its clock is the simulated
// monotonic one: a wall-clock jump moves the time stamped on commands,
// as it would move time.Now's wall reading, and not the lessor's
// deadlines, which Go's monotonic clock keeps.

import (
	"encoding/binary"
	"slices"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/tenurehq/tenure/statemachine"
)

type opKind int

const (
	opWrite opKind = iota + 1
	opRead
	opHeartbeat
)

// call is one request from a client to a node.
type call struct {
	c       *client // nil for the node's own proposals
	done    func(r reply, timedOut bool)
	seq     uint64 // the client's number for it
	kind    opKind
	cmd     statemachine.Command
	read    func(m *statemachine.Machine) reply
	session int64 // heartbeat
	// internal, for the node's own proposals, runs at apply.
	internal func(res statemachine.Result)
	term     uint64
	readID   uint64
	readIdx  uint64
	ready    bool
}

// reply is what a node answers.
type reply struct {
	notLeader bool   // definite: nothing was done
	leader    uint64 // with notLeader: the leader this node knows of, 0 if none
	unknown   bool   // the outcome cannot be known
	res       statemachine.Result
	read      any
	token     int64 // a queued acquire's grant
	lost      bool  // heartbeat: the session is gone or cannot be renewed here
}

func (n *node) reply(c *call, r reply) {
	if c.c == nil {
		return
	}
	if r.notLeader && n.lead != n.id {
		r.leader = n.lead
	}
	cl := c.c
	n.s.net.toClient(func() { cl.complete(c, r) })
}

// handle is a client's call arriving at the node.
func (n *node) handle(c *call) {
	if !n.up || n.failed != "" {
		return
	}
	if n.paused() {
		inc := n.incarnation
		n.s.after(n.pausedUntil-n.s.now, func() {
			if inc == n.incarnation {
				n.handle(c)
			}
		})
		return
	}
	switch c.kind {
	case opHeartbeat:
		if n.role != etcdraft.StateLeader {
			n.reply(c, reply{notLeader: true})
			return
		}
		switch n.heartbeat(c.session) {
		case beatRenewed:
			n.reply(c, reply{})
		case beatRefused:
			n.reply(c, reply{notLeader: true})
		default:
			n.reply(c, reply{lost: true})
		}
	case opRead:
		if n.s.opts.Bugs.StaleRead {
			n.reply(c, c.read(n.m))
			return
		}
		if n.role != etcdraft.StateLeader {
			n.reply(c, reply{notLeader: true})
			return
		}
		n.readSeq++
		c.readID = n.readSeq
		c.term = n.term
		n.reads = append(n.reads, c)
		var ctx [8]byte
		binary.BigEndian.PutUint64(ctx[:], c.readID)
		n.rn.ReadIndex(ctx[:])
	case opWrite:
		if n.role != etcdraft.StateLeader {
			n.reply(c, reply{notLeader: true})
			return
		}
		if !n.propose(c) {
			n.reply(c, reply{notLeader: true})
			return
		}
		if _, ok := c.cmd.(statemachine.Put); ok && n.s.opts.Bugs.AckOnPropose {
			n.reply(c, reply{})
		}
	}
}

// propose appends the call's command to the log, framed as
// raftnode/propose.go frames it, encoded in the form the cluster version
// allows (statemachine.EncodeFor). False: raft dropped it, nothing done.
func (n *node) propose(c *call) bool {
	data, err := statemachine.EncodeFor(n.m.ClusterVersion(), n.wall(), c.cmd)
	if err != nil {
		return false
	}
	n.reqSeq++
	buf := make([]byte, proposalHeader+len(data))
	binary.BigEndian.PutUint64(buf, n.id)
	binary.BigEndian.PutUint64(buf[8:], n.reqSeq)
	copy(buf[proposalHeader:], data)
	if n.rn.Propose(buf) != nil {
		return false
	}
	c.term = n.term
	n.proposals[n.reqSeq] = c
	return true
}

// answer answers this node's proposal req, applied at index.
func (n *node) answer(req, index uint64, res statemachine.Result) {
	c, ok := n.proposals[req]
	if !ok {
		return
	}
	delete(n.proposals, req)
	if c.internal != nil {
		c.internal(res)
		return
	}
	if a, ok := c.cmd.(statemachine.Acquire); ok && res.Err == nil && res.Queued {
		n.waiters[a.SessionID] = c
		return
	}
	if _, ok := c.cmd.(statemachine.Put); ok && n.s.opts.Bugs.AckOnPropose {
		return // answered already
	}
	if _, ok := c.cmd.(statemachine.Acquire); ok && res.Grant != nil && n.s.opts.Bugs.TokenFromSession {
		g := *res.Grant
		g.Token = g.SessionID
		res.Grant = &g
	}
	n.reply(c, reply{res: res})
}

// observe is what the server and lessor learn from an applied command's
// events: a queued acquire granted, a waiter or session gone.
func (n *node) observe(cmd statemachine.Command, res statemachine.Result) {
	if cmd == nil {
		return
	}
	for _, ev := range res.Events {
		switch ev.Type {
		case statemachine.EventLeaseAcquired:
			if c, ok := n.waiters[ev.SessionID]; ok {
				delete(n.waiters, ev.SessionID)
				tok := ev.Token
				if n.s.opts.Bugs.TokenFromSession {
					tok = ev.SessionID
				}
				n.reply(c, reply{token: tok})
			}
		case statemachine.EventLeaseWaitEnded, statemachine.EventSessionExpired, statemachine.EventSessionClosed:
			if c, ok := n.waiters[ev.SessionID]; ok {
				delete(n.waiters, ev.SessionID)
				n.reply(c, reply{unknown: true})
			}
		}
		n.lessorObserve(ev)
	}
}

// failProposals answers every open proposal and queued acquire with an
// unknown outcome: the entry may still commit under the next leader.
func (n *node) failProposals(why string) {
	for _, req := range sortedKeys(n.proposals) {
		c := n.proposals[req]
		delete(n.proposals, req)
		if c.internal == nil {
			n.reply(c, reply{unknown: true})
		}
	}
	for _, sid := range sortedKeys(n.waiters) {
		n.reply(n.waiters[sid], reply{unknown: true})
		delete(n.waiters, sid)
	}
}

func (n *node) failReads() {
	for _, c := range n.reads {
		n.reply(c, reply{notLeader: true})
	}
	n.reads = nil
}

// dropCalls forgets every call at a crash: their clients time out.
func (n *node) dropCalls() {
	n.proposals = map[uint64]*call{}
	n.waiters = map[int64]*call{}
	n.reads = nil
}

func (n *node) readState(id, index uint64) {
	for _, c := range n.reads {
		if c.readID == id {
			c.readIdx, c.ready = index, true
		}
	}
}

// serveReads answers the reads whose index apply has reached.
func (n *node) serveReads() {
	if len(n.reads) == 0 {
		return
	}
	keep := n.reads[:0]
	for _, c := range n.reads {
		switch {
		case c.term != n.term:
			n.reply(c, reply{notLeader: true})
		case c.ready && n.applied >= c.readIdx:
			n.reply(c, c.read(n.m))
		default:
			keep = append(keep, c)
		}
	}
	n.reads = keep
}

func sortedKeys[K int64 | uint64, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// lessor is the leader's mirror of lessor.Lessor (see the file comment).
type lessor struct {
	active   bool
	proposed bool // NewEpoch is in flight
	epoch    int64
	sessions map[int64]*leased
	expiring int64 // when expiries were last proposed
}

type leased struct{ deadline, ttl, heard int64 }

func (n *node) lessorStart() {
	n.lessor = lessor{}
	n.lessorTick()
}

// lessorTick proposes what the leader owes: the cluster version, its
// NewEpoch, and the expiries that are due.
func (n *node) lessorTick() {
	if n.role != etcdraft.StateLeader {
		return
	}
	l := &n.lessor
	if !l.active {
		if l.proposed {
			return
		}
		if n.m.ClusterVersion() < statemachine.Version {
			n.propose(&call{kind: opWrite, cmd: statemachine.SetVersion{Version: statemachine.Version}, internal: func(statemachine.Result) {}})
		}
		term := n.term
		c := &call{kind: opWrite, cmd: statemachine.NewEpoch{}}
		c.internal = func(res statemachine.Result) {
			if n.role != etcdraft.StateLeader || n.term != term || res.Err != nil {
				return
			}
			n.promote(res.Epoch)
		}
		l.proposed = n.propose(c)
		return
	}
	var due []int64
	for _, id := range sortedKeys(l.sessions) {
		if l.sessions[id].deadline <= n.s.now {
			due = append(due, id)
		}
	}
	if len(due) == 0 || n.s.now-l.expiring < int64(tickInterval)*5 {
		return
	}
	renewed := make([]int64, len(due))
	for i, id := range due {
		renewed[i] = l.sessions[id].heard
	}
	l.expiring = n.s.now
	n.s.tracef(n.id, "lessor proposes expiry of sessions %v (epoch %d)", due, l.epoch)
	n.propose(&call{kind: opWrite, cmd: statemachine.ExpireSessions{Epoch: l.epoch, IDs: due, Renewed: renewed}, internal: func(statemachine.Result) {}})
}

// promote starts timing: every session gets TTL plus an election timeout
// from now (lessor/promote.go).
func (n *node) promote(epoch int64) {
	l := &n.lessor
	l.active, l.epoch = true, epoch
	l.sessions = map[int64]*leased{}
	for _, st := range n.m.Deadlines().Sessions {
		l.sessions[st.ID] = &leased{deadline: n.s.now + st.TTL + int64(electionTimeout), ttl: st.TTL}
	}
	n.s.tracef(n.id, "lessor promoted: epoch %d, %d sessions", epoch, len(l.sessions))
}

func (n *node) lessorObserve(ev statemachine.Event) {
	l := &n.lessor
	if !l.active {
		return
	}
	switch ev.Type {
	case statemachine.EventSessionOpened:
		if ev.Session != nil {
			l.sessions[ev.SessionID] = &leased{deadline: n.s.now + ev.Session.TTL, ttl: ev.Session.TTL, heard: n.wall()}
		}
	case statemachine.EventSessionClosed, statemachine.EventSessionExpired:
		delete(l.sessions, ev.SessionID)
	}
}

const (
	beatRenewed = iota
	beatRefused // not promoted yet, or stalled: ask again
	beatGone    // the session is not open
)

// heartbeat renews a session.
func (n *node) heartbeat(id int64) int {
	l := &n.lessor
	if !l.active || n.s.now < n.stallUntil {
		return beatRefused
	}
	ls, ok := l.sessions[id]
	if !ok {
		return beatGone
	}
	ls.deadline = n.s.now + ls.ttl
	if n.s.opts.Bugs.EarlyExpiry {
		ls.deadline = n.s.now + ls.ttl/4
	}
	ls.heard = n.wall()
	return beatRenewed
}
