package nativeapi

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
// watches' join, lag resync and compaction refusal (keyfeed's doc). A
// watch of one key or lease (spec.one) is keyed in the hub.
func (a *API) openWatch(ctx context.Context, spec watchSpec) (eventSource, error) {
	if !spec.keys {
		w, err := a.node.Watch(spec.start, spec.filter)
		if err != nil {
			return nil, err
		}
		if spec.one != nil {
			w.WantKey(*spec.one)
		}
		return w, nil
	}
	var (
		f   *keyfeed.Feed
		err error
	)
	if spec.one != nil {
		f, err = keyfeed.OpenKey(ctx, a.node, spec.start, spec.key, spec.filter)
	} else {
		f, err = keyfeed.Open(ctx, a.node, spec.start, spec.filter)
	}
	if err != nil {
		return nil, err
	}
	return &keyEvents{feed: f}, nil
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
