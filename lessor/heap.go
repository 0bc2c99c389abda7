package lessor

import (
	"time"
)

// instant is a time as the lessor keeps it: nanoseconds since Lessor.base
// by l.now, monotonic when l.now's readings are. Eight bytes where a
// time.Time takes twenty-four: a leader times one deadline per session,
// and 10^6 idle sessions must fit in a gigabyte.
type instant int64

func (l *Lessor) instant(t time.Time) instant { return instant(t.Sub(l.base)) }

func (l *Lessor) time(i instant) time.Time { return l.base.Add(time.Duration(i)) }

func (i instant) add(d time.Duration) instant { return i + instant(d) }

// item is one deadline on the heap. Its entry's type (*session,
// *keyEntry, *delayEntry, *idleEntry) is its kind, and the pointer its
// identity: an item whose entry was forgotten or replaced is stale and
// dropped when popped. 16 bytes for the entry and 8 for at: the heap
// holds one item per session.
type item struct {
	at instant
	e  entry
}

// entry is what an item times.
type entry interface {
	// gone reports whether the entry was forgotten or replaced; the
	// caller holds Lessor.mu.
	gone() bool
}

func (s *session) gone() bool    { return s.removed }
func (k *keyEntry) gone() bool   { return k.removed }
func (d *delayEntry) gone() bool { return d.removed }
func (g *idleEntry) gone() bool  { return g.removed }

// stale must be called with Lessor.mu held.
func (it item) stale() bool { return it.e.gone() }

// pushLocked adds an item and wakes the loop (or the driver) if the item
// is now the earliest: it may be asleep until a later deadline.
func (l *Lessor) pushLocked(it item) {
	earliest := len(l.heap) == 0 || it.at < l.heap[0].at
	l.heap.push(it)
	if earliest {
		l.kick()
	}
}

// needsCompactLocked reports whether most of the heap is stale items of
// forgotten entries. Items are dropped lazily when they come due, but
// with long TTLs and many short-lived sessions they would pile up for a
// whole TTL.
func (l *Lessor) needsCompactLocked() bool {
	live := l.sessions + len(l.keys) + len(l.delays) + len(l.idle)
	return len(l.heap) > compactMin && len(l.heap) > 2*live
}

func (l *Lessor) compactLocked() {
	h := l.heap[:0]
	for _, it := range l.heap {
		if !it.stale() {
			h = append(h, it)
		}
	}
	clear(l.heap[len(h):])
	l.heap = h
	l.heap.init()
}

// deadlineHeap is a min-heap by at. It is written out rather than built on
// container/heap, whose any-typed Push and Pop allocate for every item.
type deadlineHeap []item

func (h deadlineHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *deadlineHeap) push(it item) {
	*h = append(*h, it)
	h.up(len(*h) - 1)
}

func (h *deadlineHeap) pop() item {
	old := *h
	n := len(old) - 1
	top := old[0]
	old[0] = old[n]
	old[n] = item{}
	*h = old[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

func (h deadlineHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if h[i].at >= h[parent].at {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (h deadlineHeap) down(i int) {
	n := len(h)
	for {
		least := i
		if l := 2*i + 1; l < n && h[l].at < h[least].at {
			least = l
		}
		if r := 2*i + 2; r < n && h[r].at < h[least].at {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
