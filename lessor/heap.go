package lessor

import (
	"time"
)

// item is one deadline on the heap. Exactly one of s, k, d and g is set;
// which one is its kind, and the pointer is its identity: an item whose
// entry was forgotten or replaced is stale and dropped when popped.
type item struct {
	at time.Time
	s  *session
	k  *keyEntry
	d  *delayEntry
	g  *idleEntry
}

// stale must be called with Lessor.mu held.
func (it item) stale() bool {
	switch {
	case it.s != nil:
		return it.s.removed
	case it.k != nil:
		return it.k.removed
	case it.d != nil:
		return it.d.removed
	default:
		return it.g.removed
	}
}

// pushLocked adds an item and wakes the loop (or the driver) if the item
// is now the earliest: it may be asleep until a later deadline.
func (l *Lessor) pushLocked(it item) {
	earliest := len(l.heap) == 0 || it.at.Before(l.heap[0].at)
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
		if !h[i].at.Before(h[parent].at) {
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
		if l := 2*i + 1; l < n && h[l].at.Before(h[least].at) {
			least = l
		}
		if r := 2*i + 2; r < n && h[r].at.Before(h[least].at) {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
