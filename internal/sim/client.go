package sim

// Clients run the real mix of commands through whichever node leads,
// one operation at a time each, and record what they saw for the
// checker:
//
//   - kv clients put, get, compare-and-swap and Txn on three keys
//     (porcupine's KV model, internal/linearizability);
//   - lin clients hold a session with a TTL longer than the run and
//     acquire, validate and release one mutex without waiting (the lease
//     model, which knows no expiry);
//   - mutex clients hold short sessions renewed by heartbeats every TTL/3
//     and queue for one mutex with Wait, holding it a while when granted.
//     They trust a grant only until their last acknowledged heartbeat's
//     send time + 0.75 TTL (DESIGN.md safety rule 5), and give the
//     session up when that passes.
//
// A call that times out, or that a node answers with "outcome unknown",
// is recorded as unknown: porcupine lets it have happened or not.

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tenurehq/tenure/internal/linearizability"
	"github.com/tenurehq/tenure/statemachine"
)

type clientKind int

const (
	kvClient clientKind = iota
	linClient
	mutexClient
)

const (
	callTimeout = int64(1500 * time.Millisecond)
	waitTimeout = int64(6 * time.Second) // a queued acquire waits this long
	mutexTTL    = int64(3 * time.Second)
	linTTL      = int64(24 * time.Hour)
)

var (
	linLease   = statemachine.LeaseID{Namespace: "lin", Name: "a"}
	mutexLease = statemachine.LeaseID{Namespace: "mx", Name: "b"}
	kvKeys     = []string{"k0", "k1", "k2"}
)

type client struct {
	s      *Sim
	id     int
	kind   clientKind
	target uint64
	seq    uint64

	cur  *call // the operation in flight
	beat *call // the heartbeat in flight

	session  int64
	ttl      int64
	lastBeat int64 // send time of the last acknowledged heartbeat, or of the open

	held      bool
	maybeHeld bool // an acquire's outcome is unknown
	token     int64
	since     int64

	// released are tokens this client asked to release: a release whose
	// outcome is unknown may still apply at any later time, so an
	// acquire that answers with one of them (an acquire is idempotent
	// per session) gives a grant the client must not trust.
	released map[int64]bool

	values  int // for unique values
	lastVal map[string]string
}

func (s *Sim) startClients() {
	kinds := []clientKind{kvClient, kvClient, kvClient, linClient, linClient, mutexClient, mutexClient, mutexClient}
	for i, k := range kinds {
		c := &client{s: s, id: i, kind: k, target: uint64(1 + i%len(s.nodes)), lastVal: map[string]string{}, released: map[int64]bool{}}
		s.clients = append(s.clients, c)
		s.after(s.randDur(100*time.Millisecond), c.next)
	}
}

func (c *client) think() {
	c.s.after(int64(5*time.Millisecond)+c.s.randDur(60*time.Millisecond), c.next)
}

// send sends a call to the client's current node, and times it out.
func (c *client) send(cl *call, done func(r reply, timedOut bool)) {
	c.seq++
	cl.seq = c.seq
	cl.c = c
	cl.done = done
	if cl.kind == opHeartbeat {
		c.beat = cl
	} else {
		c.cur = cl
	}
	n := c.s.nodes[c.target-1]
	c.s.net.toNode(n, func() { n.handle(cl) })
	timeout := callTimeout
	if a, ok := cl.cmd.(statemachine.Acquire); ok && a.Wait {
		timeout = waitTimeout
	}
	c.s.after(timeout, func() {
		if c.cur == cl || c.beat == cl {
			c.clear(cl)
			c.otherNode()
			cl.done(reply{}, true)
		}
	})
}

func (c *client) clear(cl *call) {
	if c.cur == cl {
		c.cur = nil
	}
	if c.beat == cl {
		c.beat = nil
	}
}

func (c *client) otherNode() { c.target = uint64(1 + c.s.rng.IntN(len(c.s.nodes))) }

// complete is a node's reply arriving.
func (c *client) complete(cl *call, r reply) {
	if c.cur != cl && c.beat != cl {
		return // timed out already
	}
	c.clear(cl)
	if r.notLeader {
		// Redirected, as a follower redirects a client to the leader.
		c.target = r.leader
		if c.target == 0 {
			c.otherNode()
		}
	}
	cl.done(r, false)
}

// call sends cl, and again (up to attempts times in all) after each
// definite "nothing done", to the node the answer names; done sees only
// the final answer.
func (c *client) call(cl *call, attempts int, done func(r reply, timedOut bool)) {
	c.send(cl, func(r reply, timedOut bool) {
		if r.notLeader && attempts > 1 && !c.s.stopping() {
			c.s.after(int64(20*time.Millisecond), func() {
				next := &call{kind: cl.kind, cmd: cl.cmd, read: cl.read, session: cl.session}
				c.call(next, attempts-1, done)
			})
			return
		}
		done(r, timedOut)
	})
}

func (s *Sim) stopping() bool { return s.now >= int64(s.opts.Duration) }

func (c *client) next() {
	if c.s.stopping() {
		return
	}
	switch c.kind {
	case kvClient:
		c.kvStep()
	case linClient:
		c.linStep()
	case mutexClient:
		c.mutexStep()
	}
}

// record starts an operation in a history and returns its completion.
func (c *client) record(h *[]porcupine.Operation, input any) func(output any, unknown bool) {
	call := c.s.now
	return func(output any, unknown bool) {
		ret := c.s.now
		if unknown {
			ret = math.MaxInt64
			c.s.stats.Unknown++
		}
		c.s.stats.Ops++
		*h = append(*h, porcupine.Operation{ClientId: c.id, Input: input, Call: call, Output: output, Return: ret})
	}
}

func (c *client) kvStep() {
	key := kvKeys[c.s.rng.IntN(len(kvKeys))]
	c.values++
	val := fmt.Sprintf("c%d-%d", c.id, c.values)
	h := &c.s.check.kvOps
	switch op := c.s.rng.IntN(10); {
	case op < 4:
		done := c.record(h, linearizability.KVInput{Op: linearizability.Put, Key: key, Value: val})
		c.s.check.wrote(key, val)
		c.call(&call{kind: opWrite, cmd: statemachine.Put{Key: key, Value: val}}, 3, func(r reply, to bool) {
			switch {
			case to || r.unknown:
				done(linearizability.KVOutput{Unknown: true}, true)
				c.s.check.putDone(key, val, false)
			case r.notLeader || r.res.Err != nil:
			default:
				done(linearizability.KVOutput{}, false)
				c.s.check.putDone(key, val, true)
			}
			c.think()
		})
	case op < 7:
		done := c.record(h, linearizability.KVInput{Op: linearizability.Get, Key: key})
		c.call(&call{kind: opRead, read: func(m *statemachine.Machine) reply {
			kv, ok := m.Key(key)
			return reply{read: linearizability.KVOutput{Found: ok, Value: kv.Value}}
		}}, 3, func(r reply, to bool) {
			if !to && !r.notLeader && !r.unknown {
				out := r.read.(linearizability.KVOutput)
				c.lastVal[key] = out.Value
				done(out, false)
			}
			c.think()
		})
	default:
		expect := c.lastVal[key]
		var cmd statemachine.Command = statemachine.CompareAndSwap{Key: key, Target: statemachine.CompareValue, Value: expect, NewValue: val}
		if op == 9 {
			cmd = statemachine.Txn{
				Compares: []statemachine.TxnCompare{{Key: key, Target: statemachine.TargetValue, Op: statemachine.CmpEqual, Value: expect}},
				Success:  []statemachine.TxnOp{{Type: statemachine.OpPut, Key: key, Value: val}},
			}
		}
		done := c.record(h, linearizability.KVInput{Op: linearizability.CompareAndSwap, Key: key, Value: val, Expect: expect})
		c.s.check.wrote(key, val)
		c.call(&call{kind: opWrite, cmd: cmd}, 3, func(r reply, to bool) {
			swapped := r.res.Err == nil
			if t := r.res.Txn; t != nil {
				swapped = t.Succeeded
			}
			switch {
			case to || r.unknown:
				done(linearizability.KVOutput{Unknown: true}, true)
				c.s.check.putDone(key, val, false)
			case r.notLeader || r.res.Err != nil && !isCompareFailed(r.res.Err):
			default:
				done(linearizability.KVOutput{Swapped: swapped}, false)
				c.s.check.putDone(key, val, swapped)
				if swapped {
					c.lastVal[key] = val
				}
			}
			c.think()
		})
	}
}

func isCompareFailed(err error) bool {
	return err != nil && errorsIs(err, statemachine.ErrCompareFailed)
}

// openSession opens the client's session, then continues with then.
func (c *client) openSession(identity string, ttl int64, then func()) {
	sent := c.s.now
	c.call(&call{kind: opWrite, cmd: statemachine.OpenSession{Identity: identity, TTL: ttl}}, 5, func(r reply, to bool) {
		if !to && !r.unknown && !r.notLeader && r.res.Err == nil && r.res.Session != nil {
			c.session, c.ttl, c.lastBeat = r.res.Session.ID, ttl, sent
			c.s.check.beatAcked(c.session, sent, ttl)
			c.s.tracef(0, "client %d opened session %d", c.id, c.session)
		}
		if then != nil {
			then()
		}
	})
}

func (c *client) linStep() {
	if c.session == 0 {
		c.openSession(fmt.Sprintf("lin-%d", c.id), linTTL, c.think)
		return
	}
	h := &c.s.check.leaseOps
	readLease := func(m *statemachine.Machine) reply {
		l, _ := m.Lease(linLease)
		var tok, sid int64
		if len(l.Holders) > 0 {
			tok, sid = l.Holders[0].Token, l.Holders[0].SessionID
		}
		return reply{read: [2]int64{tok, sid}}
	}
	switch {
	case c.maybeHeld || c.held && c.s.rng.IntN(2) == 0:
		in := linearizability.LeaseInput{Op: linearizability.Validate, Lease: linLease.String(), Token: c.token}
		done := c.record(h, in)
		c.call(&call{kind: opRead, read: readLease}, 3, func(r reply, to bool) {
			if !to && !r.notLeader && !r.unknown {
				v := r.read.([2]int64)
				done(linearizability.LeaseOutput{OK: v[0] != 0 && v[0] == c.token, Token: v[0]}, false)
				if c.maybeHeld && v[1] == c.session {
					c.hold(v[0])
				}
				c.maybeHeld = false
			}
			c.think()
		})
	case c.held:
		tok := c.token
		done := c.record(h, linearizability.LeaseInput{Op: linearizability.Release, Lease: linLease.String(), Token: tok})
		c.unhold()
		c.call(&call{kind: opWrite, cmd: statemachine.Release{Lease: linLease, Token: tok}}, 3, func(r reply, to bool) {
			switch {
			case to || r.unknown:
				done(linearizability.LeaseOutput{Unknown: true}, true)
			case r.notLeader:
			case r.res.Err == nil:
				done(linearizability.LeaseOutput{OK: true}, false)
			case errorsIs(r.res.Err, statemachine.ErrNotHolder):
				done(linearizability.LeaseOutput{}, false)
			}
			c.think()
		})
	default:
		done := c.record(h, linearizability.LeaseInput{Op: linearizability.Acquire, Lease: linLease.String(), Session: c.session})
		c.call(&call{kind: opWrite, cmd: statemachine.Acquire{SessionID: c.session, Lease: linLease, Capacity: 1}}, 3, func(r reply, to bool) {
			switch {
			case to || r.unknown:
				done(linearizability.LeaseOutput{Unknown: true}, true)
				c.maybeHeld = true
			case r.notLeader:
			case r.res.Err == nil && r.res.Grant != nil:
				done(linearizability.LeaseOutput{OK: true, Token: r.res.Grant.Token}, false)
				c.hold(r.res.Grant.Token)
			case errorsIs(r.res.Err, statemachine.ErrLocked):
				done(linearizability.LeaseOutput{}, false)
			}
			c.think()
		})
	}
}

// hold and unhold are the client's belief that it holds its grant: what
// the one-holder invariant reads.
func (c *client) hold(token int64) {
	if c.released[token] {
		c.s.tracef(0, "client %d does not trust token %d: it asked to release it", c.id, token)
		return
	}
	lease := linLease
	if c.kind == mutexClient {
		lease = mutexLease
	}
	c.held, c.token, c.since = true, token, c.s.now
	c.s.check.granted(c, lease, token)
	c.s.tracef(0, "client %d holds %s with token %d (session %d)", c.id, lease, token, c.session)
}

func (c *client) unhold() {
	c.held = false
	c.released[c.token] = true
}

// validUntil is when the client stops trusting its grant.
func (c *client) validUntil() int64 {
	if c.s.opts.Bugs.TrustPastTTL {
		return c.lastBeat + 2*c.ttl
	}
	return c.lastBeat + c.ttl*3/4
}

// mutexStep is the mutex client's loop: it runs every 50ms whatever is
// in flight, since it must heartbeat while it waits.
func (c *client) mutexStep() {
	c.s.after(int64(50*time.Millisecond), c.next)
	if c.session != 0 && c.s.now >= c.validUntil() {
		// Rule 5: the session may be gone; everything it held is.
		c.s.tracef(0, "client %d gives up session %d", c.id, c.session)
		c.abandon()
	}
	if c.session == 0 {
		if c.cur == nil {
			c.openSession(fmt.Sprintf("mx-%d", c.id), mutexTTL, nil)
		}
		return
	}
	if c.beat == nil && c.s.now-c.lastBeat >= c.ttl/3 {
		c.heartbeat()
	}
	if c.cur != nil {
		return
	}
	if c.held {
		if c.s.now-c.since < int64(200*time.Millisecond)+c.s.randDur(2*time.Second) {
			return
		}
		tok := c.token
		c.unhold()
		c.call(&call{kind: opWrite, cmd: statemachine.Release{Lease: mutexLease, Token: tok}}, 3, func(reply, bool) {})
		return
	}
	sid := c.session
	c.call(&call{kind: opWrite, cmd: statemachine.Acquire{SessionID: sid, Lease: mutexLease, Capacity: 1, Wait: true}}, 3, func(r reply, to bool) {
		switch {
		case c.session != sid:
		case r.res.Err == nil && r.res.Grant != nil && !to && !r.unknown && !r.notLeader:
			c.hold(r.res.Grant.Token)
		case r.token != 0 && !to:
			c.hold(r.token)
		case to || r.unknown:
			// It may be queued or granted without our knowing: give the
			// whole session up rather than hold a grant nobody knows of.
			c.abandon()
		}
	})
}

// heartbeat renews the session (the stream's KeepAlive).
func (c *client) heartbeat() {
	sent, sid := c.s.now, c.session
	c.send(&call{kind: opHeartbeat, session: sid}, func(r reply, to bool) {
		if c.session != sid || to || r.notLeader {
			return
		}
		if r.lost {
			c.s.tracef(0, "client %d: session %d is gone", c.id, sid)
			c.abandon()
			return
		}
		c.lastBeat = max(c.lastBeat, sent)
		c.s.check.beatAcked(sid, sent, c.ttl)
	})
}

// abandon gives the session up and closes it, without waiting.
func (c *client) abandon() {
	if c.session == 0 {
		return
	}
	sid := c.session
	c.session, c.held, c.beat = 0, false, nil
	cl := &call{kind: opWrite, cmd: statemachine.CloseSession{SessionID: sid}, c: c}
	cl.done = func(reply, bool) {}
	n := c.s.nodes[c.target-1]
	c.s.net.toNode(n, func() { n.handle(cl) })
}

var errorsIs = errors.Is
