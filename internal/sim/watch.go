package sim

// Watch clients, on the project's own watch code. Each node has a real
// watch.Hub, published to with every applied command's events and reset
// at every snapshot restore, as server/server.go observe and restored do
// (the two hooks in node.go). A watch is a real keyfeed.Feed, the join of
// the state machine's history and the hub that every key watch of the
// server is, over a Source that reads the node's own state.
//
// Neither needs a goroutine or a clock to be driven from here. A feed's
// Next with a context that is already done hands over what is ready and
// returns ctx.Err() where it would have waited: its only wait is a select
// on the hub's wake channel (not closed, since nothing publishes while
// this goroutine reads), the feed's Mark channel (never used here) and
// the context. So after every step the scheduler drains each open feed
// (pumpWatches), and what it hands over goes to the client in order, as
// on one gRPC stream.
//
// A watch client watches the kv clients' keys (the prefix "k", or one of
// them) from a revision on some node. When the node crashes or stops,
// when its stream is cut for longer than the keepalive, or when the
// client chooses to move, it resumes on another node from the revision
// after the last one it received, as etcd's client does. When the
// revision it resumes from is compacted, the node refuses it (a
// *watch.CompactedError, etcd's cancel with the compact revision), and
// the client reads the current revision through the leader and watches
// again from the one after: the events in between are gone for it, and
// the checker starts its span there.
//
// What keyfeed's Source.Sync does on a follower (a ReadIndex round, so
// that a compaction acknowledged elsewhere is seen) is left out: the
// feed serves from the node's state as it is, as the server's syncLocal
// does when no leader answers in time. A follower behind serves its
// older state, whose events are as committed; only a refusal may come
// later than the server's.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/tenurehq/tenure/keyfeed"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

const (
	// watchHistory is the events a node's hub keeps. Small, so that a
	// feed falls a history behind in one large apply and reads the
	// history again (the lag resync), which the server's 65,536 would
	// never show in a run.
	watchHistory = 64
	// keepalive is how long a client takes to give up on a stream that
	// went silent: a cut shorter than this only delays its messages.
	keepalive = int64(time.Second)
	// watchMove is the mean interval between a watch client's own moves
	// to another node, a load balancer rebalancing.
	watchMove = 4 * time.Second
	// compactEvery is the mean interval between the leader's compactions
	// of the key history, etcd's periodic auto-compaction.
	compactEvery = 2 * time.Second
)

// ready is a context that is already done: a feed read with it returns
// what is ready and never waits.
var ready = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// nodeHub is a node's hub for one incarnation: a crash loses it, as the
// process's memory.
type nodeHub struct {
	inc int
	hub *watch.Hub
}

// hub is n's hub, a new one for a new incarnation: its first expected
// revision is 1, the fresh state machine's next, and a restore resets
// it (restoredHub).
func (s *Sim) hub(n *node) *watch.Hub {
	h := s.hubs[n.id]
	if h == nil || h.inc != n.incarnation {
		h = &nodeHub{inc: n.incarnation, hub: watch.NewHub(watchHistory)}
		s.hubs[n.id] = h
	}
	return h.hub
}

// publish is server/server.go observe's hub.Publish: an applied
// command's events, in apply order.
func (s *Sim) publish(n *node, events []statemachine.Event) { s.hub(n).Publish(events) }

// restoredHub is server/server.go restored's hub.Reset: a snapshot
// restored, the history starts again from its revision.
func (s *Sim) restoredHub(n *node, revision int64) { s.hub(n).Reset(revision) }

// source is keyfeed.Source on a simulated node (server/frontnode.go's).
type source struct{ n *node }

func (src source) Read(_ context.Context, _ bool, fn func(m *statemachine.Machine) error) error {
	return fn(src.n.m)
}

// Sync is left out; see the file comment.
func (source) Sync(context.Context) {}

func (src source) Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error) {
	return src.n.s.hub(src.n).Watch(start, filter)
}

// stream is one watch on one node, as one gRPC stream: what the node
// sends reaches the client in order.
type stream struct {
	w    *watchClient
	n    *node
	inc  int // the node's incarnation when it opened the feed
	feed *keyfeed.Feed
	at   int64 // when the last message sent reaches the client
	// heldUntil: a cut shorter than the keepalive holds messages until
	// it heals; TCP delivers them late, in order.
	heldUntil int64
	cut       bool // cut for good: nothing more reaches the client
	closed    bool // the node side is done with it
}

// watchMsg is what a stream carries: the watch created, a batch of
// events, or the error that ends it.
type watchMsg struct {
	created bool
	events  []statemachine.Event
	err     error
}

func (st *stream) send(m watchMsg) {
	s := st.w.s
	st.at = max(st.at, s.now+s.net.delay(), st.heldUntil)
	s.after(st.at-s.now, func() { st.w.receive(st, m) })
}

func (st *stream) close() {
	if !st.closed {
		st.closed = true
		if st.feed != nil {
			st.feed.Close()
		}
	}
}

// pump hands over what the feed has ready. A node that crashed or
// stopped has lost the stream: the client notices within the keepalive.
func (st *stream) pump() {
	n, s := st.n, st.w.s
	if !n.up || n.incarnation != st.inc || n.failed != "" {
		st.close()
		w := st.w
		s.after(int64(100*time.Millisecond)+s.randDur(time.Duration(keepalive)), func() {
			if w.stream == st {
				w.moveOn("its node went away")
			}
		})
		return
	}
	if n.paused() {
		return
	}
	for {
		b, err := st.feed.Next(ready)
		if errors.Is(err, context.Canceled) {
			return
		}
		if err != nil {
			st.send(watchMsg{err: err})
			st.close()
			return
		}
		if len(b.Events) > 0 {
			st.send(watchMsg{events: b.Events})
		}
	}
}

// pumpWatches runs after every step: each open stream hands over what
// its node has applied.
func (s *Sim) pumpWatches() {
	open := s.streams[:0]
	for _, st := range s.streams {
		if !st.closed {
			st.pump()
		}
		if !st.closed {
			open = append(open, st)
		}
	}
	clear(s.streams[len(open):])
	s.streams = open
}

// openWatch is a watch request reaching node n: it opens a feed from
// start for the stream, or answers the refusal.
func (n *node) openWatch(st *stream, start int64, filter func(*statemachine.Event) bool) {
	if !n.up || n.failed != "" || st.w.stream != st {
		return
	}
	if n.paused() {
		inc := n.incarnation
		n.s.after(n.pausedUntil-n.s.now, func() {
			if inc == n.incarnation {
				n.openWatch(st, start, filter)
			}
		})
		return
	}
	st.n, st.inc = n, n.incarnation
	f, err := keyfeed.Open(ready, source{n}, start, filter)
	if err != nil {
		st.closed = true
		st.send(watchMsg{err: err})
		return
	}
	st.feed = f
	n.s.streams = append(n.s.streams, st)
	st.send(watchMsg{created: true})
}

// watchClient is one watch client and what the checker knows of it.
type watchClient struct {
	s      *Sim
	id     int
	prefix string // the key it watches, or with all every key it starts
	all    bool
	target uint64
	rpc    *client // for its fresh reads

	stream      *stream // nil while it has none
	established bool    // the node answered that the watch is created

	// The checker's: the first revision of the current span (from the
	// start, or from a fresh read after a compaction) and the last
	// revision received, from-1 before any.
	from, last int64
}

func (w *watchClient) name() string { return fmt.Sprintf("watch %d", w.id) }

func (w *watchClient) wants(key string) bool {
	if w.all {
		return strings.HasPrefix(key, w.prefix)
	}
	return key == w.prefix
}

func (w *watchClient) filter(e *statemachine.Event) bool { return w.wants(e.KV.Key) }

func (s *Sim) startWatches() {
	for i := range s.opts.Watchers {
		w := &watchClient{s: s, id: i, prefix: "k", all: true, target: uint64(1 + s.rng.IntN(len(s.nodes)))}
		if s.rng.IntN(3) == 0 {
			w.prefix, w.all = kvKeys[s.rng.IntN(len(kvKeys))], false
		}
		w.rpc = &client{s: s, id: 100 + i, target: w.target, lastVal: map[string]string{}, released: map[int64]bool{}}
		// From revision 1: the whole history, or a refusal once a node
		// has compacted it (a fresh store counts as compacted below the
		// revision its keys switched to their own clock).
		w.from, w.last = 1, 0
		s.watchers = append(s.watchers, w)
		s.after(s.randDur(200*time.Millisecond), func() { w.watch(1) })
		s.every(watchMove, func() {
			if w.stream != nil && w.established {
				s.stats.Faults["watch: client moves"]++
				w.moveOn("the client moves")
			}
		})
	}
	s.every(compactEvery, s.compact)
}

// watch asks the target node for a watch from start.
func (w *watchClient) watch(start int64) {
	st := &stream{w: w}
	w.stream, w.established = st, false
	n := w.s.nodes[w.target-1]
	w.s.tracef(0, "%s asks n%d for revisions from %d", w.name(), n.id, start)
	w.s.net.toNode(n, func() { n.openWatch(st, start, w.filter) })
	w.s.after(callTimeout, func() {
		if w.stream == st && !w.established {
			w.moveOn("no answer")
		}
	})
}

// moveOn leaves the current stream and resumes on another node from
// the revision after the last one received.
func (w *watchClient) moveOn(why string) {
	if st := w.stream; st != nil {
		st.cut = true
		st.close()
	}
	w.stream = nil
	w.s.stats.WatchResumes++
	w.target = uint64(1 + (int(w.target)+w.s.rng.IntN(len(w.s.nodes)-1))%len(w.s.nodes))
	start := w.last + 1
	switch {
	case w.s.opts.Bugs.WatchResumeAtLast:
		start = w.last
	case w.s.opts.Bugs.WatchResumePastNext:
		start = w.last + 2
	}
	w.s.tracef(0, "%s leaves its stream (%s): resumes on n%d from %d", w.name(), why, w.target, start)
	w.s.after(int64(20*time.Millisecond)+w.s.randDur(80*time.Millisecond), func() { w.watch(start) })
}

// receive is a stream's message reaching the client.
func (w *watchClient) receive(st *stream, m watchMsg) {
	if w.stream != st || st.cut {
		return // a stream it left
	}
	switch {
	case m.created:
		w.established = true
	case m.err != nil:
		w.stream = nil
		st.close()
		var ce *watch.CompactedError
		if errors.As(m.err, &ce) {
			w.s.stats.WatchCompacted++
			w.s.tracef(0, "%s: n%d refuses revision %d, compacted (oldest %d): reads afresh", w.name(), st.n.id, ce.Requested, ce.Oldest)
			w.restart()
			return
		}
		w.moveOn(m.err.Error())
	default:
		w.s.check.watchDelivered(w, st.n, m.events)
	}
}

// restart reads the current KV revision through the leader, as a
// client whose watch was compacted reads the state again, and watches
// from the revision after it.
func (w *watchClient) restart() {
	w.rpc.target = w.target
	w.rpc.call(&call{kind: opRead, read: func(m *statemachine.Machine) reply {
		rev := m.KVRevision()
		if rev == 0 {
			rev = m.Revision() // keys still take the global revision
		}
		return reply{read: rev}
	}}, 3, func(r reply, to bool) {
		if to || r.notLeader || r.unknown {
			w.target = w.rpc.target
			w.s.after(int64(50*time.Millisecond), w.restart)
			return
		}
		rev := r.read.(int64)
		w.from, w.last = rev+1, rev
		w.target = w.rpc.target
		w.watch(rev + 1)
	})
}

// cutWatch cuts a watch client off from its node for a while: a cut
// shorter than the keepalive only holds the stream's messages back; a
// longer one loses the stream, and the client resumes elsewhere once
// the keepalive gives up.
func (s *Sim) cutWatch() {
	var open []*watchClient
	for _, w := range s.watchers {
		if w.stream != nil && w.established {
			open = append(open, w)
		}
	}
	if len(open) == 0 {
		return
	}
	w := open[s.rng.IntN(len(open))]
	st := w.stream
	d := int64(300*time.Millisecond) + s.randDur(4*time.Second)
	s.stats.Faults["watch: stream cut"]++
	s.tracef(0, "%s is cut off from n%d for %s", w.name(), st.n.id, time.Duration(d))
	if d < keepalive {
		st.heldUntil = s.now + d
		return
	}
	st.cut = true
	st.close()
	s.after(keepalive, func() {
		if w.stream == st {
			w.moveOn("the keepalive gave up")
		}
	})
}

// compact is the leader compacting the key history up to a recent
// revision, as etcd's periodic auto-compaction does; not when there is
// no leader, or nothing new to compact.
func (s *Sim) compact() {
	for _, n := range s.nodes {
		if !n.up || n.failed != "" || n.role != etcdraft.StateLeader || n.m.KVRevision() == 0 {
			continue
		}
		rev := n.m.KVRevision() - s.rng.Int64N(40)
		if rev <= max(n.m.CompactRevision(), 0) {
			return
		}
		if n.propose(&call{kind: opWrite, cmd: statemachine.Compact{Revision: rev}, internal: func(statemachine.Result) {}}) {
			s.stats.Compactions++
			s.tracef(n.id, "compacts the key history at %d", rev)
		}
		return
	}
}
