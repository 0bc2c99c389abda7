package server

import (
	"context"
	"errors"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// eventSource is what a watch reads its events from: the hub for lease
// watches, a keyWatcher for key watches.
type eventSource interface {
	Next(ctx context.Context) (statemachine.Event, error)
	Close()
}

// openWatch starts the events spec asks for. A key watch from a
// revision first brings this node up to every write acknowledged before
// it (syncLocal), so that a compaction acknowledged a moment ago through
// any node refuses it here too.
func (s *Server) openWatch(ctx context.Context, spec watchSpec) (eventSource, error) {
	if !spec.keys {
		return s.hub.Watch(spec.start, spec.filter)
	}
	if spec.start > 0 {
		s.syncLocal(ctx)
	}
	return s.watchKeys(spec.start, spec.filter)
}

// syncWait bounds how long syncLocal waits for the leader to say how far
// the log is committed: about an election, as a forwarded call waits.
const syncWait = leaderWait

// syncLocal brings this node's own state up to every write acknowledged
// before the call, for a read that is served here but must not miss one
// (a watch from a revision, whose history the leader may have compacted
// a moment ago). A promoted leader has applied all of them already; a
// follower asks the leader (raftnode.Node.Sync). When no leader answers
// within syncWait the state stays as it is, and the caller serves from
// it, as an etcd member cut off from its leader serves watches.
func (s *Server) syncLocal(ctx context.Context) {
	if s.leading.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, syncWait)
	defer cancel()
	if err := s.node.Sync(ctx); err != nil {
		s.log.Debug("serving from this node's state, not brought up to the leader's", "err", err)
	}
}

// keyWatcher follows key events on the keys' own clock, the KV revision
// (statemachine/mvcc.go), which is what a key watch's start revision and
// its events' revisions are: the history the state machine keeps first,
// from the start revision, then the node's live events from the global
// revision the history was read at, so that nothing is missed or sent
// twice. The events of one command share a KV revision; the watcher
// counts those it has sent at the last one, so that a resync after the
// hub dropped it (ErrLagged) resumes exactly where it stopped.
//
// A key event's KV revision is its key's mod revision, on either clock:
// before cluster version 5 keys take the global revision, and the KV
// revision starts above it when the version is raised. So the watcher
// reads every event's revision from its key, never from the hub, and a
// node whose state is from before version 5 — the cluster's, or only
// this node's, restarted or catching up and not yet past the entry that
// raised it — serves a watch from the hub's history by the same rule,
// and goes on serving it right once that entry applies.
type keyWatcher struct {
	s      *Server
	filter func(*statemachine.Event) bool
	from   int64 // live events below it are older than the start; 0 until replay pins "now"
	queue  []statemachine.Event
	hub    *watch.Watcher
	// last is the KV revision of the last event returned, and sent how
	// many were returned at it.
	last int64
	sent int
}

// watchKeys starts a keyWatcher at KV revision start (0: from now).
func (s *Server) watchKeys(start int64, filter func(*statemachine.Event) bool) (eventSource, error) {
	w := &keyWatcher{s: s, filter: filter, from: start, last: start - 1}
	if err := w.replay(); err != nil {
		return nil, err
	}
	return w, nil
}

// replay reads the history owed since the last event returned, and
// follows the hub from where that read stopped.
func (w *keyWatcher) replay() error {
	if w.hub != nil {
		w.hub.Close()
		w.hub = nil
	}
	var follow int64 // the global revision the hub is followed from
	skip := w.sent
	err := w.s.node.ReadLocal(func(m *statemachine.Machine) error {
		global, kvRev := m.Revision(), m.KVRevision()
		follow = global + 1
		if w.from == 0 {
			now := kvRev
			if now == 0 {
				now = global // keys still take the global revision
			}
			w.from, w.last = now+1, now
		}
		if kvRev == 0 {
			// Keys take the global revision in this state: a key
			// event's KV revision is its global one, and the hub holds
			// the history owed, from the next revision on (or from
			// now, when that is still to come). Events of one command
			// have revisions of their own here.
			follow = min(w.last+1, global+1)
			return nil
		}
		if w.last+1 > kvRev && w.sent == 0 {
			return nil // nothing owed yet: a start at or past the next revision
		}
		from := max(w.last, 1)
		if w.sent == 0 {
			from = w.last + 1
		}
		return m.KeyEvents(from, func(e statemachine.Event) bool {
			if !w.filter(&e) {
				return true
			}
			if e.KV.ModRevision == w.last && skip > 0 {
				skip--
				return true
			}
			e.Revision = e.KV.ModRevision
			w.queue = append(w.queue, e)
			return true
		})
	})
	if errors.Is(err, statemachine.ErrCompacted) {
		var oldest int64
		_ = w.s.node.ReadLocal(func(m *statemachine.Machine) error {
			oldest = max(m.CompactRevision(), 1)
			return nil
		})
		return &watch.CompactedError{Requested: w.last + 1, Oldest: oldest}
	}
	if err != nil {
		return err
	}
	w.hub, err = w.s.hub.Watch(follow, w.filter)
	return err
}

func (w *keyWatcher) Next(ctx context.Context) (statemachine.Event, error) {
	for {
		var e statemachine.Event
		if len(w.queue) > 0 {
			e, w.queue = w.queue[0], w.queue[1:]
		} else {
			var err error
			e, err = w.hub.Next(ctx)
			if errors.Is(err, watch.ErrLagged) {
				if err := w.replay(); err != nil {
					return statemachine.Event{}, err
				}
				continue
			}
			if err != nil {
				return e, err
			}
			if e.KV == nil || e.KV.ModRevision < w.from {
				continue
			}
			e.Revision = e.KV.ModRevision
		}
		if e.Revision == w.last {
			w.sent++
		} else {
			w.last, w.sent = e.Revision, 1
		}
		return e, nil
	}
}

func (w *keyWatcher) Close() {
	if w.hub != nil {
		w.hub.Close()
	}
}
