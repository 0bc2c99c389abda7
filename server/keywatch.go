package server

import (
	"context"

	"github.com/tenurehq/tenure/keyfeed"
	"github.com/tenurehq/tenure/statemachine"
)

// eventSource is what a watch reads its events from: the hub for lease
// watches, a keyEvents for key watches.
type eventSource interface {
	Next(ctx context.Context) (statemachine.Event, error)
	Close()
}

// openWatch starts the events spec asks for. A key watch is a
// keyfeed.Feed over the node as every API sees it, the etcd API's
// watches' join, lag resync and compaction refusal (keyfeed's doc).
func (s *Server) openWatch(ctx context.Context, spec watchSpec) (eventSource, error) {
	if !spec.keys {
		return s.hub.Watch(spec.start, spec.filter)
	}
	f, err := keyfeed.Open(ctx, frontNode{s}, spec.start, spec.filter)
	if err != nil {
		return nil, err
	}
	return &keyEvents{feed: f}, nil
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

// keyEvents hands a feed's batches over one event at a time, as the
// native API sends them.
type keyEvents struct {
	feed  *keyfeed.Feed
	queue []statemachine.Event
}

func (k *keyEvents) Next(ctx context.Context) (statemachine.Event, error) {
	for len(k.queue) == 0 {
		b, err := k.feed.Next(ctx)
		if err != nil {
			return statemachine.Event{}, err
		}
		k.queue = b.Events
	}
	e := k.queue[0]
	k.queue = k.queue[1:]
	return e, nil
}

func (k *keyEvents) Close() { k.feed.Close() }
