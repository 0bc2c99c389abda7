package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/tenurehq/tenure/statemachine"
)

// DefaultHistory is the number of events a Hub keeps when NewHub is given
// zero or less.
const DefaultHistory = 65536

// payloadPerEvent is the average size of the strings (keys, values, names)
// that each event of history may hold. A count alone does not bound memory:
// a put carries its value and the previous one, up to 64 KiB each, so 65536
// events of large puts would pin some 8 GiB. Past this budget the oldest
// events go first, exactly as when the count is reached, and watchers still
// reading them get ErrLagged.
const payloadPerEvent = 1 << 10

// scanChunk bounds the events one read lock hold looks at, so that a
// watcher whose filter rejects a long run of history lets Publish in
// between chunks instead of holding up the apply path.
const scanChunk = 256

var (
	// ErrLagged is returned by Watcher.Next when events the watcher had yet
	// to read were discarded: the history overwrote them, or a Reset
	// skipped or undid them. The error is a *LaggedError naming the
	// revision to resync from. The watcher is cancelled: every later Next
	// returns the same error.
	ErrLagged = errors.New("watcher fell behind")
	// ErrCompacted is returned by Hub.Watch when the start revision is older
	// than the oldest event kept. The error is a *CompactedError.
	ErrCompacted = errors.New("revision is compacted")
	// ErrClosed is returned by Watcher.Next once the watcher is closed,
	// including by a Next that was waiting when Close was called.
	ErrClosed = errors.New("watcher closed")
)

// LaggedError is the ErrLagged a watcher gets when it must resync.
type LaggedError struct {
	// Resync is the first revision the watcher did not get to read. Every
	// event it received is older; no event from Resync on will come. The
	// client should re-read the state and watch again from the revision of
	// that read plus one.
	Resync int64
}

func (e *LaggedError) Error() string {
	return fmt.Sprintf("watcher fell behind: events from revision %d were discarded before it read them; resync from revision %d", e.Resync, e.Resync)
}

func (e *LaggedError) Unwrap() error { return ErrLagged }

// CompactedError is the ErrCompacted a watch gets when it asks for a
// revision the history no longer holds.
type CompactedError struct {
	Requested int64 // the start revision asked for
	Oldest    int64 // the oldest revision a watch may start from now
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("revision %d is compacted; the oldest watchable revision is %d", e.Requested, e.Oldest)
}

func (e *CompactedError) Unwrap() error { return ErrCompacted }

// Hub keeps the recent history of events and lets watchers read it. One
// goroutine (the one applying the log) calls Publish and Reset; any number
// of goroutines call Watch, Revision and the Watchers' methods alongside.
type Hub struct {
	// mu guards the fields below, and the cursor and err of every Watcher
	// in watchers. Publish and Reset take it exclusively, Next shared, so
	// watchers read in parallel and Publish waits for at most one scan
	// chunk per reader, never for a reader that is blocked.
	mu       sync.RWMutex
	ring     []slot // revision r lives in ring[r mod len(ring)] while oldest <= r <= last
	history  int    // the events kept at most: len(ring) grows to it (grow)
	oldest   int64  // oldest revision kept; last+1 when the history is empty
	last     int64  // last revision published
	bytes    int64  // payload of the events kept
	maxBytes int64
	// notify is closed and replaced whenever events arrive or the history
	// is reset: one close wakes every waiting watcher, and a watcher that
	// took the channel under mu cannot miss a wake-up that follows.
	notify   chan struct{}
	watchers map[*Watcher]struct{} // open watchers, for Reset to judge
	// waiting are the watchers with a wake predicate (Watcher.Want) that
	// wait for events: Publish wakes each only for events it wants, on
	// its own channel. keyed are the waiting watchers of one key
	// (Watcher.WantKey), by that key, and timed those of them that also
	// wait for a revision (Watcher.WakeAt): Publish looks up its events'
	// keys and never visits the others (keyed.go). waitMu guards these,
	// the watchers' wake channels, indexed, keyPos and wakeAt, since
	// readers register under the shared lock.
	waitMu  sync.Mutex
	waiting map[*Watcher]struct{}
	keyed   map[Key][]*Watcher
	timed   map[*Watcher]struct{}
	// visits counts the waiting watchers Publish and Reset looked at,
	// for tests to tell that a publish does no work per idle watcher.
	visits int64
}

type slot struct {
	ev   statemachine.Event
	size int64 // payload(&ev), so that dropping it needs no recount
}

// NewHub returns a Hub that keeps the last history events (DefaultHistory
// if history <= 0), and at most history × 1 KiB of their keys, values and
// names, whichever limit is reached first. The ring of history events
// (about 170 bytes an event) starts at firstRing events and doubles as
// events arrive until it holds history: a node that publishes little
// does not hold, nor have the garbage collector budget for, the full
// ring. Its first expected revision is 1; call Reset to start elsewhere.
func NewHub(history int) *Hub { return NewHubBytes(history, 0) }

// NewHubBytes is NewHub with a budget of maxBytes for the keys, values
// and names of the events kept instead of history × 1 KiB, when maxBytes
// is above 0 and below that: the server gives the hub a share of its
// storage quota, so that the watch history cannot hold what the quota
// refuses the store.
func NewHubBytes(history int, maxBytes int64) *Hub {
	if history <= 0 {
		history = DefaultHistory
	}
	budget := int64(history) * payloadPerEvent
	if maxBytes > 0 {
		budget = min(budget, maxBytes)
	}
	return &Hub{
		ring:     make([]slot, min(history, firstRing)),
		history:  history,
		oldest:   1,
		maxBytes: budget,
		notify:   make(chan struct{}),
		watchers: make(map[*Watcher]struct{}),
		waiting:  make(map[*Watcher]struct{}),
		keyed:    make(map[Key][]*Watcher),
		timed:    make(map[*Watcher]struct{}),
	}
}

// firstRing is the ring's length before it first grows.
const firstRing = 1024

// MaxBytes is the budget for the payload of the events kept.
func (h *Hub) MaxBytes() int64 { return h.maxBytes }

// Bytes is what the history holds: its ring, counted at the full length
// it grows to (for the storage quota, what the ring may take whenever
// events come, not what it has taken so far), and the payload of the
// events kept (keys, values and names, estimated as the budget counts
// them). Values an event shares with the state are counted here too: the
// history may keep them after the state let them go.
func (h *Hub) Bytes() int64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return int64(h.history)*int64(unsafe.Sizeof(slot{})) + h.bytes
}

// Revision returns the revision of the last event published, or the
// revision given to the last Reset if nothing was published since.
func (h *Hub) Revision() int64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.last
}

// Reset discards the history and makes rev+1 the next expected revision.
// The FSM goroutine calls it at startup with the restored revision, and
// after every snapshot restore: the events between the old history and rev
// were folded into the snapshot and will never be published.
//
// A watcher whose cursor is now out of range gets ErrLagged on its next
// read, after any event it was already given:
//   - a cursor at or before rev missed the events up to rev: it resyncs
//     from its cursor;
//   - a cursor after rev+1 but not past the old last revision + 1 already
//     read events that the new history replaces (a restore to an older
//     revision): it resyncs from rev+1.
//
// A watcher at exactly rev+1, or waiting for a revision past both the old
// and the new last revision, has missed nothing and carries on. A keyed
// watcher waiting for its key (WantKey) is judged as at the old last
// revision + 1: it wanted none of the events before.
func (h *Hub) Reset(rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waitMu.Lock()
	defer h.waitMu.Unlock()
	h.reset(rev)
}

// Publish appends the events of applied commands, oldest first, and wakes
// the watchers waiting for them. Only the FSM goroutine calls it. It never
// waits for a watcher. It costs O(len(events)) for the watchers that wait
// on the hub's broadcast and those of one key (WantKey) that the events
// are not for, however many; plus a look at each waiting watcher with a
// wake predicate (Want) or a revision to wake at (WakeAt), and a wake-up
// for each watcher woken. The hub keeps the events as given (a shallow copy): neither the
// caller nor any watcher may modify them afterwards.
//
// Each event's revision must be the one after the last. If it is not, the
// hub treats the event as following a Reset to the revision before it, so
// no watcher silently misses the difference. This cannot happen in
// practice: the state machine gives every event its own revision, one
// after the other, Publish is called for every applied command in apply
// order, and a restore calls Reset first. So the hub logs nothing; it only
// makes sure that a bug upstream shows up as ErrLagged rather than as a
// gap.
func (h *Hub) Publish(events []statemachine.Event) {
	if len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waitMu.Lock()
	defer h.waitMu.Unlock()
	for i := range events {
		ev := &events[i]
		if ev.Revision != h.last+1 {
			h.reset(ev.Revision - 1) // wakes every waiting watcher
		}
		if h.last-h.oldest+1 == int64(len(h.ring)) {
			if len(h.ring) < h.history {
				h.grow()
			} else {
				h.dropOldest()
			}
		}
		s := &h.ring[h.slot(ev.Revision)]
		s.ev = *ev
		s.size = payload(ev)
		h.bytes += s.size
		h.last = ev.Revision
		// The newest event stays even if it alone exceeds the budget, so
		// that a watcher that is keeping up never lags.
		for h.bytes > h.maxBytes && h.oldest < h.last {
			h.dropOldest()
		}
		// Before the next event, so that a gap's reset judges the keyed
		// watchers left as wanting nothing published so far.
		h.wakeKeyed(ev)
	}
	h.wake()
	h.wakeWaiting(func(w *Watcher) bool { return w.wantsAny() })
	h.wakeTimed()
}

// wakeWaiting wakes the waiting watchers with a wake predicate that
// should (every one when should is nil); the caller holds mu exclusively,
// and waitMu.
func (h *Hub) wakeWaiting(should func(*Watcher) bool) {
	for w := range h.waiting {
		h.visits++
		if should != nil && !should(w) {
			continue
		}
		w.wakeAt = 0
		close(w.wake)
		w.wake = nil
		delete(h.waiting, w)
		w.woken()
	}
}

// Watch starts a watcher that reads the events filter accepts (every event
// if filter is nil), in revision order, beginning at revision start, or at
// the next event published if start is 0. A start older than the oldest
// event kept fails with a *CompactedError; a start past the next revision
// is allowed, and the watcher waits for it.
//
// filter runs under the hub's read lock, on the goroutine calling Next: it
// must be quick, must not modify or keep the event, and must not call the
// Hub or the Watcher. The caller must Close the watcher when done.
func (h *Hub) Watch(start int64, filter func(*statemachine.Event) bool) (*Watcher, error) {
	if start < 0 {
		return nil, fmt.Errorf("watch: start revision %d is negative", start)
	}
	if filter == nil {
		filter = func(*statemachine.Event) bool { return true }
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	cursor := start
	if start == 0 {
		cursor = h.last + 1
	} else if start < h.oldest {
		return nil, &CompactedError{Requested: start, Oldest: h.oldest}
	}
	w := &Watcher{hub: h, filter: filter, done: make(chan struct{}), cursor: cursor}
	h.watchers[w] = struct{}{}
	return w, nil
}

// wantsAny reports whether w, waiting, wants one of the events published
// since it looked, or the revision it is to wake at (WakeAt), or must be
// told it lagged; else it moves w past them, as its scan would have, so
// that events it does not want neither wake nor lag it. The caller holds
// mu exclusively, and waitMu.
func (w *Watcher) wantsAny() bool {
	h := w.hub
	if w.err != nil || w.cursor < h.oldest || w.wakeAt != 0 && w.wakeAt <= h.last {
		return true
	}
	for rev := w.cursor; rev <= h.last; rev++ {
		if w.wants(&h.ring[h.slot(rev)].ev) {
			return true
		}
	}
	w.cursor = h.last + 1
	return false
}

// reset empties the history and wakes every waiting watcher, for it to
// learn whether it lagged; the caller holds mu exclusively, and waitMu.
func (h *Hub) reset(rev int64) {
	// A keyed watcher still waiting wanted none of the events published
	// since it began to: releasing it moves its cursor past them, to
	// be judged like any other.
	h.wake()
	h.wakeWaiting(nil)
	for _, ws := range h.keyed {
		h.releaseAll(ws, h.last+1)
	}
	clear(h.keyed)
	for w := range h.watchers {
		if w.err != nil {
			continue
		}
		switch {
		case w.cursor <= rev:
			w.err = &LaggedError{Resync: w.cursor}
		case w.cursor > rev+1 && w.cursor <= h.last+1:
			w.err = &LaggedError{Resync: rev + 1}
		}
	}
	// Clear the slots so that the discarded events can be collected now
	// rather than when the ring comes round to them.
	for h.oldest <= h.last {
		h.dropOldest()
	}
	h.oldest, h.last, h.bytes = rev+1, rev, 0
}

// grow doubles the ring, up to history, keeping every event; the
// caller holds mu exclusively.
func (h *Hub) grow() {
	ring := make([]slot, min(2*len(h.ring), h.history))
	for rev := h.oldest; rev <= h.last; rev++ {
		ring[uint64(rev)%uint64(len(ring))] = h.ring[h.slot(rev)]
	}
	h.ring = ring
}

// dropOldest discards the oldest event kept; the caller holds mu
// exclusively and the history is not empty.
func (h *Hub) dropOldest() {
	s := &h.ring[h.slot(h.oldest)]
	h.bytes -= s.size
	*s = slot{}
	h.oldest++
}

func (h *Hub) wake() {
	close(h.notify)
	h.notify = make(chan struct{})
}

func (h *Hub) slot(rev int64) int {
	// Unsigned, so that a nonsensical negative revision cannot index out
	// of range.
	return int(uint64(rev) % uint64(len(h.ring)))
}

// payload estimates the bytes an event pins beyond its slot: its strings
// and what its pointers reach. It is for the history budget, not exact.
func payload(ev *statemachine.Event) int64 {
	const ptr = 64 // a pointed-to struct's own size, roughly
	n := len(ev.Lease.Namespace) + len(ev.Lease.Name) + len(ev.Holder) + len(ev.Value) + len(ev.Reason)
	for _, kv := range [...]*statemachine.KeyValue{ev.KV, ev.PrevKV} {
		if kv != nil {
			n += ptr + len(kv.Key) + len(kv.Value)
		}
	}
	if s := ev.Session; s != nil {
		n += ptr + len(s.Identity)
		for k, v := range s.Labels {
			n += len(k) + len(v)
		}
	}
	return int64(n)
}

// Watcher reads one filtered stream of events from a Hub. One goroutine
// calls Next at a time; Close may be called from any goroutine.
type Watcher struct {
	hub       *Hub
	filter    func(*statemachine.Event) bool
	done      chan struct{} // closed by Close
	closeOnce sync.Once

	// Guarded by hub.mu: written by Next under the read lock (only Next's
	// goroutine writes them then) and by Reset under the write lock.
	cursor int64 // next revision to read
	err    error // set once the watcher lagged; returned from then on
	// wants is the wake predicate (Want), key the one key (WantKey);
	// fixed before the first Next.
	wants func(*statemachine.Event) bool
	key   *Key
	// Guarded by hub.waitMu. wake is the channel Publish closes for w
	// while it waits, when it has wants or key. indexed says w waits in
	// hub.keyed, at keyPos in its key's list: its cursor is then stale,
	// and hub.last+1 in effect (keyed.go). wakeAt is the revision that
	// is to wake it too (WakeAt), 0 for none.
	wake    chan struct{}
	indexed bool
	keyPos  int
	wakeAt  int64
	// onWake is called each time a wait on wake ends (OnWake).
	onWake func()

	onWait func() // tests: called when Next is about to block
}

// Next returns the next event the filter accepts, waiting for it to be
// published if need be. It returns ctx.Err() when ctx is done first,
// ErrClosed once the watcher is closed, and an error wrapping ErrLagged
// (a *LaggedError) when events it had yet to read were discarded. A
// watcher lags when it falls a whole history behind even if its filter
// would have rejected every discarded event: the hub cannot know that
// without the events.
func (w *Watcher) Next(ctx context.Context) (statemachine.Event, error) {
	for {
		select {
		case <-w.done:
			return statemachine.Event{}, ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return statemachine.Event{}, err
		}
		ev, found, wait, err := w.scan()
		switch {
		case err != nil:
			return statemachine.Event{}, err
		case found:
			return ev, nil
		case wait == nil:
			continue // a chunk done; the lock was let go between chunks
		}
		if w.onWait != nil {
			w.onWait()
		}
		select {
		case <-wait:
		case <-w.done:
			return statemachine.Event{}, ErrClosed
		case <-ctx.Done():
			return statemachine.Event{}, ctx.Err()
		}
	}
}

// Poll is Next without the wait, for a reader that waits on more than
// the hub: it returns the next event the filter accepts if one has been
// published; else, when the watcher has looked at every event published,
// the channel that is closed when more are (or the history is reset);
// else neither, when it stopped at a chunk of the history and should be
// called again. Its errors are Next's, but for the context. Since Publish
// hands over a command's events in one call, a reader that has seen one
// of them and polls until it gets the channel has seen them all.
func (w *Watcher) Poll() (ev statemachine.Event, ok bool, wait <-chan struct{}, err error) {
	select {
	case <-w.done:
		return ev, false, nil, ErrClosed
	default:
	}
	return w.scan()
}

// scan looks at up to scanChunk events from the cursor. It returns the
// first one the filter accepts, or the channel to wait on when the cursor
// has caught up with the last revision, or neither when the chunk ran out.
// The cursor moves past every event looked at, so a filter that rejects
// everything costs one look per event, not a rescan per wake-up.
func (w *Watcher) scan() (ev statemachine.Event, found bool, wait <-chan struct{}, err error) {
	h := w.hub
	h.mu.RLock()
	defer h.mu.RUnlock()
	if w.err != nil {
		return ev, false, nil, w.err
	}
	// Still waiting for its key, w wanted none of the events since it
	// began to; indexed changes only under the exclusive lock or on this
	// goroutine.
	if w.indexed {
		w.cursor = h.last + 1
	}
	// The slot of every revision in [oldest, last] holds that revision;
	// below oldest it has been cleared or reused by a newer one.
	if w.cursor < h.oldest {
		w.err = &LaggedError{Resync: w.cursor}
		return ev, false, nil, w.err
	}
	for range scanChunk {
		if w.cursor > h.last {
			return ev, false, w.waitChannel(), nil
		}
		s := &h.ring[h.slot(w.cursor)]
		w.cursor++
		if w.filter(&s.ev) {
			return s.ev, true, nil, nil
		}
	}
	return ev, false, nil, nil
}

// waitChannel is what w, having looked at every event published, waits
// on: the hub's broadcast, or with a wake predicate or a key a channel of
// its own that Publish closes only for events it wants. The caller holds
// mu, shared, on Next's goroutine.
func (w *Watcher) waitChannel() <-chan struct{} {
	if w.wants == nil && w.key == nil {
		return w.hub.notify
	}
	h := w.hub
	h.waitMu.Lock()
	defer h.waitMu.Unlock()
	if w.wake != nil {
		return w.wake
	}
	wake := make(chan struct{})
	w.wake = wake
	if w.key != nil {
		h.index(w)
	} else {
		h.waiting[w] = struct{}{}
	}
	if w.wakeAt != 0 && w.wakeAt <= h.last {
		h.release(w, h.last+1)
	}
	return wake
}

// Want makes Publish wake w only for events wants accepts, and move w
// past the events it rejects, while w waits. It replaces a WantKey. One watcher among many, of
// a few keys each (an etcd stream's watches, each a key feed), is then
// neither woken nor lagged by the events of the others: without it every
// publish wakes every waiting watcher to look, one goroutine each.
//
// wants must accept every event the filter accepts (an event it rejects
// is never shown to the filter), be quick, and be safe to call from the
// goroutine that publishes, under the hub's lock: it must read nothing
// that Next's goroutine writes but through atomics. Call it before the
// first Next.
func (w *Watcher) Want(wants func(*statemachine.Event) bool) {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	w.wants, w.key = wants, nil
}

// OnWake has f called each time the hub ends a wait of w on its own
// channel (a watcher with Want or WantKey): the events it wants, a
// Reset, or its WakeAt revision were published. A reader that does not
// keep a goroutine blocked on w — one that polls (Poll) and parks when
// it gets a channel, as an etcd watch stream's idle watches do — is told
// by f to poll again. f runs with the hub's locks held, on the
// publishing goroutine: it must return at once and call nothing of the
// hub's. A wake may come while the reader is still polling; the reader
// then polls once more for nothing.
func (w *Watcher) OnWake(f func()) {
	h := w.hub
	h.waitMu.Lock()
	defer h.waitMu.Unlock()
	w.onWake = f
}

// woken tells w's reader, if it asked (OnWake), that its wait ended; the
// caller holds waitMu.
func (w *Watcher) woken() {
	if w.onWake != nil {
		w.onWake()
	}
}

// Looked is the revision of the last event w has looked at, or that
// Publish moved it past: every event up to it that the filter accepts has
// been returned.
func (w *Watcher) Looked() int64 {
	h := w.hub
	h.mu.RLock()
	defer h.mu.RUnlock()
	h.waitMu.Lock()
	defer h.waitMu.Unlock()
	if w.indexed {
		return h.last
	}
	return w.cursor - 1
}

// Close stops the watcher: a Next in progress and every later one return
// ErrClosed. Close may be called more than once, from any goroutine.
func (w *Watcher) Close() {
	w.closeOnce.Do(func() {
		close(w.done)
		h := w.hub
		h.mu.Lock()
		delete(h.watchers, w)
		h.waitMu.Lock()
		delete(h.waiting, w)
		delete(h.timed, w)
		if w.indexed {
			h.unindex(w)
		}
		h.waitMu.Unlock()
		h.mu.Unlock()
	})
}
