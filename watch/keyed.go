package watch

import "github.com/tenurehq/tenure/statemachine"

// Keyed watchers.
//
// Most watchers follow one key: a lock's waiters its key, a grant's
// holder its lease, an etcd client its Watch of a key. With a wake
// predicate (Want) each waiting one still costs every publish a visit,
// and a scan of the events since its cursor; on the broadcast, a
// wake-up. With 10^5 of them a write waits for 10^5 visits. A watcher
// that names its one key (WantKey) instead waits in an index by that
// key, and Publish looks up the keys of its events only: a publish
// costs the watchers its events are for, not all of them.
//
// The invariant that makes this exact: a keyed watcher that is waiting
// (indexed) wanted none of the events published since it began to wait
// — it was not in the index under their keys, or Publish would have
// released it. So its cursor, which Publish no longer moves, is
// hub.last+1 in effect, and whoever looks at it while it is indexed
// reads it so: its scan, Looked, and a Reset, which judges it as a
// watcher at the old last revision + 1 (up to date: it lags only if the
// reset skips or undoes events, as any such watcher would). When
// Publish releases it for an event at revision r, the events before r
// were unwanted too, so its cursor becomes r: it reads that event next,
// and does not lag because the ring dropped the unwanted ones in
// between, as it would if its cursor had stayed where it began to wait.
//
// A keyed watcher may also wait for a revision (WakeAt), as a key feed
// does for a Level asked for (keyfeed's Mark): those few are in timed,
// which Publish visits whole.

// Key is the one thing a keyed watcher follows (Watcher.WantKey): a key
// of the KV store, or a lease.
type Key struct {
	lease           bool
	namespace, name string // the key in name when not lease
}

// KVKey is the Key of the key events of key: those whose KV or PrevKV
// is key's.
func KVKey(key string) Key { return Key{name: key} }

// LeaseKey is the Key of the lease events of lease id.
func LeaseKey(id statemachine.LeaseID) Key {
	return Key{lease: true, namespace: id.Namespace, name: id.Name}
}

// WantKey makes w a watcher of k alone: while w waits, Publish wakes it
// only for an event of k (KVKey, LeaseKey), a Reset, or the revision of
// a WakeAt, and never looks at it for the other events, which neither
// wake nor lag it. It replaces a Want.
//
// w's filter must reject every event not of k: those are never shown
// to the filter of a waiting watcher. Call WantKey before the first
// Next.
func (w *Watcher) WantKey(k Key) {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	w.key, w.wants = &k, nil
}

// WakeAt makes w's current wait, or its next one when it is not
// waiting, end once revision rev is published (at once if it is), even
// if no event of that wait's would wake it: a reader that waits for a
// revision as well as for events, as a key feed waiting to report a
// Level does. A watcher on the hub's broadcast, with neither Want nor
// WantKey, needs no WakeAt: every publish wakes it. Only Next's
// goroutine calls WakeAt.
func (w *Watcher) WakeAt(rev int64) {
	h := w.hub
	h.mu.RLock()
	defer h.mu.RUnlock()
	h.waitMu.Lock()
	defer h.waitMu.Unlock()
	w.wakeAt = rev
	switch {
	case w.wake == nil:
		// Not waiting on a channel of its own: waitChannel looks at
		// wakeAt when it registers.
	case rev <= h.last:
		h.release(w, h.last+1)
	case w.indexed:
		h.timed[w] = struct{}{}
	}
}

// index adds w, about to wait, to the keyed watchers of its key. The
// caller holds waitMu and, at least shared, mu; w's cursor is
// hub.last+1.
func (h *Hub) index(w *Watcher) {
	ws := h.keyed[*w.key]
	w.keyPos = len(ws)
	h.keyed[*w.key] = append(ws, w)
	w.indexed = true
	if w.wakeAt != 0 {
		h.timed[w] = struct{}{}
	}
}

// unindex takes w out of the keyed watchers; the caller holds waitMu.
func (h *Hub) unindex(w *Watcher) {
	ws := h.keyed[*w.key]
	last := len(ws) - 1
	ws[w.keyPos] = ws[last]
	ws[w.keyPos].keyPos = w.keyPos
	ws[last] = nil
	if last == 0 {
		delete(h.keyed, *w.key)
	} else {
		h.keyed[*w.key] = ws[:last]
	}
	w.indexed = false
}

// release ends w's wait on its own channel. An indexed w leaves the
// index with its cursor at cursor: the caller knows that w wanted none
// of the events before it. The caller holds waitMu and either mu
// exclusively, or mu shared on w's Next goroutine.
func (h *Hub) release(w *Watcher, cursor int64) {
	if w.indexed {
		h.unindex(w)
		w.cursor = cursor
	}
	close(w.wake)
	w.wake = nil
	w.wakeAt = 0
	delete(h.waiting, w)
	delete(h.timed, w)
	w.woken()
}

// releaseAll releases the watchers of one key, ws, which the caller has
// taken out of the index whole, with their cursors at cursor. The
// caller holds mu exclusively, and waitMu.
func (h *Hub) releaseAll(ws []*Watcher, cursor int64) {
	for _, w := range ws {
		h.visits++
		w.indexed = false
		w.cursor = cursor
		h.release(w, cursor)
	}
}

// wakeKeyed releases the keyed watchers of ev's keys, just published:
// ev is the first event each of them wants. The caller holds mu
// exclusively, and waitMu.
func (h *Hub) wakeKeyed(ev *statemachine.Event) {
	if len(h.keyed) == 0 {
		return
	}
	switch {
	case ev.Type.IsKey():
		if ev.KV != nil {
			h.wakeKey(KVKey(ev.KV.Key), ev.Revision)
		}
		if ev.PrevKV != nil && (ev.KV == nil || ev.PrevKV.Key != ev.KV.Key) {
			h.wakeKey(KVKey(ev.PrevKV.Key), ev.Revision)
		}
	case ev.Type.IsLease():
		h.wakeKey(LeaseKey(ev.Lease), ev.Revision)
	}
}

func (h *Hub) wakeKey(k Key, rev int64) {
	if ws, ok := h.keyed[k]; ok {
		delete(h.keyed, k)
		h.releaseAll(ws, rev)
	}
}

// wakeTimed releases the keyed watchers whose WakeAt revision has been
// published. The caller holds mu exclusively, and waitMu.
func (h *Hub) wakeTimed() {
	for w := range h.timed {
		h.visits++
		if w.wakeAt <= h.last {
			h.release(w, h.last+1)
		}
	}
}
