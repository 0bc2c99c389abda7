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
// The lessor is the real lessor.Lessor, in its driven form
// (lessor.NewDriven): the scheduler does what its two goroutines would.
// It calls Due at the deadline the lessor last named, or at once when
// the lessor asks (the wake function), proposes each Expiry through the
// node's proposal path and reports the outcome with Proposed; the node's
// tick is its pulse. What the server does around it is mirrored from
// server/server.go: a new leader proposes the cluster version and its
// NewEpoch, and promotes the lessor when NewEpoch applies (the barrier);
// it demotes it when it steps down; it passes every applied command's
// events to Observe. The lessor's clock is the simulated monotonic one: a
// wall-clock jump moves the time stamped on commands, as it would move
// time.Now's wall reading, and not the lessor's deadlines, which Go's
// monotonic clock keeps.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/raftnode"
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
		c.term = n.term
		c.readID = n.readIndex()
		n.reads = append(n.reads, c)
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
	if n.rn.Propose(raftnode.FrameProposal(n.id, n.reqSeq, data)) != nil {
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
	}
	n.lessorObserve(res.Events)
}

// failProposals answers every open proposal and queued acquire with an
// unknown outcome: the entry may still commit under the next leader. The
// node's own proposals get it as an error, as raftnode's Propose returns
// one to the lessor.
func (n *node) failProposals(why string) {
	for _, req := range sortedKeys(n.proposals) {
		c := n.proposals[req]
		delete(n.proposals, req)
		if c.internal != nil {
			c.internal(statemachine.Result{Err: errors.New(why)})
		} else {
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
	if n.role == etcdraft.StateLeader {
		n.lease.Confirmed(id, n.term)
	}
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

// lessorDriver is the node's lessor, driven by the scheduler, and the
// promotion the server makes before it times anything.
type lessorDriver struct {
	l        *lessor.Lessor
	proposed bool // NewEpoch is in flight

	// The one scheduled call of Due that counts: the lessor's loop sleeps
	// until one deadline at a time.
	wakeSeq uint64
	wakeAt  int64
	waking  bool
}

// lessorBoot gives a starting node its lessor, not yet leader, as
// server.New does.
func (n *node) lessorBoot() {
	n.lessor = lessorDriver{}
	// The wake function is called under the lessor's lock: it only
	// schedules.
	n.lessor.l = lessor.NewDriven(lessor.Config{Now: n.lessorNow, Leased: n.leased}, func() { n.lessorWakeAt(n.s.now) })
}

// leased is the lessor's Config.Leased: the node's leader lease, or
// always with the NoLeaderLease bug.
func (n *node) leased(now time.Time) bool {
	return n.s.opts.Bugs.NoLeaderLease || n.lease.Held(now)
}

// lessorNow is the node's clock as the lessor reads it: the simulated
// time, without the wall clock's jumps, as the monotonic reading of Go's
// time.Now would be. (A time.Time with a wall reading of its own cannot
// be made outside package time, so the lessor's wall readings, which it
// uses only for LastHeartbeat and for the idle time of leases the
// simulator does not collect, do not see the jumps either.)
func (n *node) lessorNow() time.Time { return time.Unix(0, n.wall()-n.clockOffset) }

// lessorWakeAt schedules a call of Due at at, unless one is scheduled no
// later.
func (n *node) lessorWakeAt(at int64) {
	ld := &n.lessor
	if ld.waking && ld.wakeAt <= at {
		return
	}
	ld.wakeSeq++
	ld.wakeAt, ld.waking = at, true
	seq, inc := ld.wakeSeq, n.incarnation
	n.s.after(at-n.s.now, func() { n.lessorRun(inc, seq) })
}

// lessorRun is one round of the lessor's expiry loop (lessor/expiry.go
// run): what is due is proposed, and the next round is set for the next
// deadline. A paused node's loop runs when it resumes.
func (n *node) lessorRun(inc int, seq uint64) {
	ld := &n.lessor
	if !n.up || inc != n.incarnation || seq != ld.wakeSeq || n.failed != "" {
		return
	}
	ld.waking = false
	if n.paused() {
		n.lessorWakeAt(n.pausedUntil)
		return
	}
	due, wait := ld.l.Due()
	if wait >= 0 {
		n.lessorWakeAt(n.s.now + int64(wait))
	}
	for _, e := range due {
		n.proposeExpiry(e)
	}
}

// proposeExpiry proposes e and reports the outcome to the lessor when
// the entry applies, or when raft drops it or the leadership ends.
func (n *node) proposeExpiry(e *lessor.Expiry) {
	l := n.lessor.l
	cmd, items := n.expiryCommand(e)
	n.s.tracef(n.id, "lessor proposes %s of %v (epoch %d)", strings.TrimPrefix(fmt.Sprintf("%T", cmd), "statemachine."), items, e.Epoch)
	c := &call{kind: opWrite, cmd: cmd, internal: func(res statemachine.Result) { l.Proposed(e, res.Err) }}
	if !n.propose(c) {
		l.Proposed(e, errors.New("proposal dropped"))
	}
}

// expiryCommand is the lessor's command for e (lessor.Command, what the
// server proposes), and e's items for the trace. The last heartbeats it
// logs are read on the lessor's clock, which does not see the simulated
// wall clock's jumps (lessorNow): they are moved by the node's offset, as
// time.Now's wall reading would have them.
func (n *node) expiryCommand(e *lessor.Expiry) (statemachine.Command, any) {
	cmd := n.lessor.l.Command(e)
	switch c := cmd.(type) {
	case statemachine.ExpireSessions:
		for i, t := range c.Renewed {
			if t != 0 {
				c.Renewed[i] = t + n.clockOffset
			}
		}
		return c, e.Sessions
	case statemachine.ExpireKeys:
		return c, e.Keys
	case statemachine.EndLockDelays:
		return c, e.Delays
	default:
		return c, e.Leases
	}
}

// lessorStart begins a leadership: the lessor times nothing until the
// NewEpoch entry applies.
func (n *node) lessorStart() {
	n.lessor.proposed = false
	n.lessorTick()
}

// lessorDemote ends a leadership, as the server does when raft reports
// it lost (server/server.go).
func (n *node) lessorDemote() {
	n.lessor.proposed = false
	n.lessor.l.Demote()
}

// lessorTick proposes what a new leader owes before its lessor times
// anything: the cluster version and its NewEpoch, again at the next tick
// if raft dropped the proposal.
func (n *node) lessorTick() {
	if n.role != etcdraft.StateLeader || n.lessor.proposed {
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
	n.lessor.proposed = n.propose(c)
}

// promote starts the lessor timing, with the deadlines read from the
// state at NewEpoch's apply and an election timeout of grace
// (server/server.go promote).
func (n *node) promote(epoch int64) {
	d := n.m.Deadlines()
	if n.s.opts.Bugs.EarlyExpiry { // the lessor is told a quarter of each TTL
		d.Sessions = slices.Clone(d.Sessions)
		for i := range d.Sessions {
			d.Sessions[i].TTL /= 4
		}
	}
	stallLimit := electionTimeout
	if n.s.opts.Bugs.NoLeaderLease {
		stallLimit = 0
	}
	n.lessor.l.Promote(epoch, d, stallLimit)
	n.s.tracef(n.id, "lessor promoted: epoch %d, %d sessions", epoch, len(d.Sessions))
}

// lessorObserve passes an applied command's events to the lessor.
func (n *node) lessorObserve(events []statemachine.Event) {
	if n.s.opts.Bugs.EarlyExpiry { // the lessor is told a quarter of each TTL
		events = slices.Clone(events)
		for i := range events {
			if s := events[i].Session; events[i].Type == statemachine.EventSessionOpened && s != nil {
				short := *s
				short.TTL /= 4
				events[i].Session = &short
			}
		}
	}
	n.lessor.l.Observe(events)
}

const (
	beatRenewed = iota
	beatRefused // not promoted yet, or stalled: ask again
	beatGone    // the session is not open
)

// heartbeat renews a session in the lessor (server/frontnode.go).
func (n *node) heartbeat(id int64) int {
	_, err := n.lessor.l.Heartbeat(id)
	switch {
	case err == nil:
		return beatRenewed
	case errors.Is(err, lessor.ErrNotLeader):
		return beatRefused
	default:
		return beatGone
	}
}
