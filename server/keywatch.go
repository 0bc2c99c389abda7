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

// openWatch starts the events spec asks for.
func (s *Server) openWatch(spec watchSpec) (eventSource, error) {
	if !spec.keys {
		return s.hub.Watch(spec.start, spec.filter)
	}
	return s.watchKeys(spec.start, spec.filter)
}

// keyWatcher follows key events on the keys' own clock, the KV revision
// (statemachine/mvcc.go), which is what a key watch's start revision and
// its events' revisions are: the history the state machine keeps first,
// from the start revision, then the node's live events from the global
// revision the history was read at, so that nothing is missed or sent
// twice. The events of one command share a KV revision; the watcher
// counts those it has sent at the last one, so that a resync after the
// hub dropped it (ErrLagged) resumes exactly where it stopped.
type keyWatcher struct {
	s      *Server
	filter func(*statemachine.Event) bool
	from   int64 // live events below it are older than the start
	queue  []statemachine.Event
	hub    *watch.Watcher
	// last is the KV revision of the last event returned, and sent how
	// many were returned at it.
	last int64
	sent int
}

// watchKeys starts a keyWatcher at KV revision start (0: from now).
// Before cluster version 5 keys took the global revision, so the hub's
// cursor is theirs and the hub serves the watch as it is.
func (s *Server) watchKeys(start int64, filter func(*statemachine.Event) bool) (eventSource, error) {
	var kvRev int64
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		kvRev = m.KVRevision()
		return nil
	})
	if kvRev == 0 {
		return s.hub.Watch(start, filter)
	}
	if start == 0 {
		start = kvRev + 1
	}
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
	var global int64
	skip := w.sent
	err := w.s.node.ReadLocal(func(m *statemachine.Machine) error {
		global = m.Revision()
		if w.last+1 > m.KVRevision() && w.sent == 0 {
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
	w.hub, err = w.s.hub.Watch(global+1, w.filter)
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
