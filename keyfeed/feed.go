package keyfeed

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// Source is the node a feed reads. frontend.Node is one.
type Source interface {
	// Read runs fn on the state; a feed asks for this node's own state
	// (serializable), as it is when the read runs.
	Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error
	// Sync brings this node's state up to every write acknowledged
	// before the call, or gives up after a bound.
	Sync(ctx context.Context)
	// Watch follows the node's published events from global revision
	// start, those filter accepts, as watch.Hub.Watch does.
	Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error)
}

const (
	// MaxRevisions bounds the KV revisions in one Batch of history, as
	// etcd's watchBatchMaxRevs bounds a response of a watch catching up.
	MaxRevisions = 1000
	// MaxScan bounds the events of history one state read looks at, so
	// that a feed from long ago that matches few of them does not hold
	// up the node's applies while it reads; the next read goes on where
	// this one stopped.
	MaxScan = 10000
)

// Batch is what a feed hands over at once: the events of whole KV
// revisions, in revision order, each with its Revision set to its KV
// revision. A Batch from the history holds up to MaxRevisions of them; a
// live one holds one.
type Batch struct {
	Events []statemachine.Event
	// Revision is the KV revision the batch is as of: the state's when
	// it was read from the history, else its events'.
	Revision int64
	// Compact is the compact revision when the batch was read from the
	// history, else 0: the versions before it are gone, so an event
	// just above it has lost its previous value for etcd.
	Compact int64
	// Level, when not 0, is a global revision up to which the feed has
	// handed over every event it owes, this batch's included. A batch
	// with no events only says that.
	Level int64
}

// Feed is one key watch. One goroutine calls Next at a time, and Close
// once Next has returned; Mark may be called from any goroutine.
type Feed struct {
	src    Source
	filter func(*statemachine.Event) bool
	// key is the one key the feed is for (OpenKey), nil for any.
	key *string
	// from is the start: live events of a KV revision below it are
	// older. 0 until the first read pins "now".
	from int64
	// next is the first KV revision not handed over, where a history
	// read begins.
	next int64
	// rev is the KV revision of the state Open read.
	rev int64
	// pending is a batch read and not yet handed over.
	pending *Batch
	hub     *watch.Watcher
	// Set by the hub watcher's filter, which runs on Next's goroutine:
	// the global revision of the last event the hub watcher looked at.
	scanned int64
	// ahead is an event of the revision after the batch being gathered.
	ahead *statemachine.Event
	// reported is the highest Level handed over: atomic, as wants reads
	// it on the goroutine that publishes.
	reported atomic.Int64
	mark     atomic.Int64  // the Level asked for (Mark)
	marked   chan struct{} // one wake-up for a Next waiting on the hub
	// onWake is called when a feed TryNext parked should be asked
	// again (OnWake).
	onWake func()
}

// Open starts a feed of the key events filter accepts (nil: all) from
// KV revision start (0: from the next one). A start past the next
// revision is allowed: the feed waits for it. A feed from a revision
// first brings this node up to every write acknowledged before it
// (Source.Sync), so that a compaction acknowledged a moment ago through
// any node refuses it here too: then Open fails with a
// *watch.CompactedError. The caller closes the feed.
func Open(ctx context.Context, src Source, start int64, filter func(*statemachine.Event) bool) (*Feed, error) {
	if start < 0 {
		return nil, fmt.Errorf("keyfeed: start revision %d is negative", start)
	}
	if filter == nil {
		filter = func(*statemachine.Event) bool { return true }
	}
	f := &Feed{src: src, filter: filter, from: start, next: start, rev: -1, marked: make(chan struct{}, 1)}
	if err := f.begin(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// OpenKey is Open for the events of one key, those of key that filter
// (nil: all) accepts. The hub then wakes the feed only for that key's
// events (watch.Watcher.WantKey), and a publish of other keys does no
// work for it at all, where a feed of Open costs every publish a look
// at its filter: open a watch of one key with OpenKey.
func OpenKey(ctx context.Context, src Source, start int64, key string, filter func(*statemachine.Event) bool) (*Feed, error) {
	if start < 0 {
		return nil, fmt.Errorf("keyfeed: start revision %d is negative", start)
	}
	mine := func(e *statemachine.Event) bool {
		return e.KV != nil && e.KV.Key == key && (filter == nil || filter(e))
	}
	f := &Feed{src: src, filter: mine, key: &key, from: start, next: start, rev: -1, marked: make(chan struct{}, 1)}
	if err := f.begin(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// begin makes the first read of a feed Open or OpenKey built, and
// closes it on an error.
func (f *Feed) begin(ctx context.Context) error {
	if f.from > 0 {
		f.src.Sync(ctx)
	}
	if err := f.read(ctx); err != nil {
		f.Close()
		return err
	}
	return nil
}

// Revision is the KV revision of the state Open read (0 while keys take
// the global revision): a feed from now starts after it, and etcd's
// created response names it.
func (f *Feed) Revision() int64 { return f.rev }

// Next returns the next batch, waiting for it if need be, or a batch
// with no events and a Level when Mark asked for one and the feed has
// nothing else to hand over. It fails with ctx.Err() when ctx ends, with
// a *watch.CompactedError when the history the feed owes is compacted
// (after the hub dropped it), and with the node's errors.
func (f *Feed) Next(ctx context.Context) (Batch, error) { return f.nextBatch(ctx, true) }

// ErrWouldWait is TryNext's answer when the feed has nothing to hand
// over yet.
var ErrWouldWait = errors.New("keyfeed: nothing to hand over yet")

// TryNext is Next without the wait for live events: when it would wait,
// it returns ErrWouldWait, and the feed's OnWake function is called once
// something may have come (an event of its keys, a Level reached, a
// reset of the hub) — possibly before TryNext has returned, and then for
// nothing. A reader with many feeds parks each between calls instead of
// keeping a goroutine blocked in Next for every one. TryNext still reads
// the history owed, which may wait for the state (Source.Sync, Read).
// A Mark is not a wake: its caller calls TryNext again itself.
func (f *Feed) TryNext(ctx context.Context) (Batch, error) { return f.nextBatch(ctx, false) }

// OnWake has wake called when a feed that TryNext left parked should be
// asked again; see TryNext. wake runs on the goroutine that publishes,
// with the hub's locks held: it must return at once, calling nothing of
// the hub's or the feed's. Call it before the first TryNext, on the
// feed's goroutine.
func (f *Feed) OnWake(wake func()) {
	f.onWake = wake
	if f.hub != nil {
		f.hub.OnWake(wake)
	}
}

func (f *Feed) nextBatch(ctx context.Context, block bool) (Batch, error) {
	for {
		if b := f.pending; b != nil {
			f.pending = nil
			f.reported.Store(max(f.reported.Load(), b.Level))
			return *b, nil
		}
		if f.hub == nil { // history is owed: from the start, or after a lag
			if err := f.read(ctx); err != nil {
				return Batch{}, err
			}
			continue
		}
		b, err := f.live(ctx, block)
		if errors.Is(err, watch.ErrLagged) {
			// Whole revisions only were handed over: the history
			// has everything from next on.
			f.hub.Close()
			f.hub, f.ahead = nil, nil
			continue
		}
		if err != nil {
			return Batch{}, err
		}
		f.reported.Store(max(f.reported.Load(), b.Level))
		return b, nil
	}
}

// Replaying reports whether the feed has history to hand over, which
// Next reads without waiting on the hub: a watch's catch-up, which etcd
// sends before anything else. Only Next's goroutine calls it.
func (f *Feed) Replaying() bool { return f.pending != nil || f.hub == nil }

// Mark asks the feed for a Level of at least global revision g: a Next
// with nothing else to hand over returns a batch saying so once the feed
// is that far (at once, when it is).
func (f *Feed) Mark(g int64) {
	for {
		old := f.mark.Load()
		if g <= old || f.mark.CompareAndSwap(old, g) {
			break
		}
	}
	select {
	case f.marked <- struct{}{}:
	default:
	}
}

// Close ends the feed.
func (f *Feed) Close() {
	if f.hub != nil {
		f.hub.Close()
	}
}

// read reads, under one state read, the history owed from next on, up
// to MaxRevisions revisions that the filter takes and MaxScan events, into
// pending; and when it reached the state's end, follows the hub from
// there. Should the hub have lost that revision already (a restore reset
// it), it reads again.
func (f *Feed) read(ctx context.Context) error {
	for {
		var (
			b                    Batch
			follow, stop         int64
			global, kvRev        int64
			lastRev, prev, first = int64(0), int64(0), f.next
			revs, scanned        int
		)
		err := f.src.Read(ctx, true, func(m *statemachine.Machine) error {
			global, kvRev = m.Revision(), m.KVRevision()
			b.Revision, b.Compact = kvRev, m.CompactRevision()
			if f.rev < 0 {
				f.rev = kvRev
			}
			if f.next == 0 {
				now := kvRev
				if now == 0 {
					now = global // keys still take the global revision
				}
				f.from, f.next, first = now+1, now+1, now+1
			}
			if kvRev == 0 {
				// Keys take the global revision in this state: a key
				// event's KV revision is its global one, and the hub
				// holds the history owed, from next on (or from now,
				// when that is still to come). Events of one command
				// have revisions of their own here.
				follow = min(first, global+1)
				return nil
			}
			follow = global + 1
			if first > kvRev {
				return nil // nothing owed yet: a start at or past the next revision
			}
			return m.KeyEvents(first, func(e statemachine.Event) bool {
				rev := e.KV.ModRevision
				if scanned >= MaxScan && rev != prev {
					stop = rev
					return false
				}
				scanned++
				prev = rev
				if !f.filter(&e) {
					return true
				}
				if rev != lastRev {
					if revs == MaxRevisions {
						stop = rev
						return false
					}
					revs++
					lastRev = rev
				}
				e.Revision = rev
				b.Events = append(b.Events, e)
				return true
			})
		})
		if errors.Is(err, statemachine.ErrCompacted) {
			return &watch.CompactedError{Requested: first, Oldest: max(b.Compact, 1)}
		}
		if err != nil {
			return err
		}
		if stop != 0 {
			f.next = stop
			if len(b.Events) > 0 {
				f.pending = &b
			}
			return nil
		}
		hw, err := f.src.Watch(follow, f.see)
		if errors.Is(err, watch.ErrCompacted) && kvRev != 0 {
			continue
		}
		if err != nil {
			return err
		}
		if f.key != nil {
			hw.WantKey(watch.KVKey(*f.key))
		} else {
			hw.Want(f.wants)
		}
		if f.onWake != nil {
			hw.OnWake(f.onWake)
		}
		f.hub, f.scanned = hw, follow-1
		if kvRev != 0 {
			f.next = max(f.next, kvRev+1)
		}
		if len(b.Events) > 0 {
			b.Level = follow - 1
			f.pending = &b
		}
		return nil
	}
}

// see is the hub watcher's filter: it notes how far the watcher has
// looked, and takes the key events the feed is for.
func (f *Feed) see(e *statemachine.Event) bool {
	f.scanned = e.Revision
	return e.Type.IsKey() && e.KV != nil && e.KV.ModRevision >= f.from && f.filter(e)
}

// wants is the wake predicate (watch.Watcher.Want) of the hub watcher
// of a feed of more than one key: the events see takes. It runs on the
// goroutine that publishes, so it reads only what does not change once
// the watcher is open (from, filter): an etcd stream's watches are then
// woken only by their own keys' events, not each by every publish. A
// feed of one key has the hub index it by that key instead (OpenKey).
// A Level asked for wakes either kind through watch.Watcher.WakeAt.
func (f *Feed) wants(e *statemachine.Event) bool {
	return e.Type.IsKey() && e.KV != nil && e.KV.ModRevision >= f.from && f.filter(e)
}

// level is how far the feed has handed over every event it owes: what
// the hub watcher's filter looked at, or what the hub moved it past for
// want of a wanted event.
func (f *Feed) level() int64 { return max(f.scanned, f.hub.Looked()) }

// live gathers the hub's events of the next KV revision: once it has
// the first, it polls until it has looked at everything published, which
// holds the rest (or until an event of a later revision shows up).
func (f *Feed) live(ctx context.Context, block bool) (Batch, error) {
	var b Batch
	for {
		var (
			e    statemachine.Event
			ok   bool
			wait <-chan struct{}
			err  error
		)
		if f.ahead != nil {
			e, ok, f.ahead = *f.ahead, true, nil
		} else if e, ok, wait, err = f.hub.Poll(); err != nil {
			return Batch{}, err
		}
		switch {
		case ok && len(b.Events) > 0 && e.KV.ModRevision != b.Revision:
			f.ahead = &e
			b.Level = e.Revision - 1
			f.next = b.Revision + 1
			return b, nil
		case ok:
			b.Revision = e.KV.ModRevision
			e.Revision = b.Revision
			b.Events = append(b.Events, e)
			continue
		case wait == nil:
			continue // a chunk of the hub's history looked at; more to look at
		case len(b.Events) > 0:
			b.Level = f.level()
			f.next = b.Revision + 1
			return b, nil
		}
		if m := f.mark.Load(); m > f.reported.Load() {
			if f.level() >= m {
				return Batch{Level: f.level()}, nil
			}
			// A Mark after this is a wake-up (marked), and calls again.
			f.hub.WakeAt(m)
		}
		if !block {
			// What ended the wait before the reader parks, it reads
			// now; what ends it later calls onWake.
			select {
			case <-wait:
				continue
			case <-f.marked:
				continue
			default:
				return Batch{}, ErrWouldWait
			}
		}
		select {
		case <-wait:
		case <-f.marked:
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		}
	}
}
