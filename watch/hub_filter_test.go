package watch

import (
	"context"
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/tenurehq/tenure/statemachine"
)

func TestKeyFilter(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		prefix bool
		ev     statemachine.Event
		want   bool
	}{
		{"a put of the key matches", "a", false, put(1, "a"), true},
		{"a put of a longer key does not match an exact filter", "a", false, put(1, "ab"), false},
		{"a put under the prefix matches", "a", true, put(1, "ab"), true},
		{"a delete carrying only PrevKV matches", "a", false, del(1, "a"), true},
		{"an expiry carrying only PrevKV matches", "a/", true,
			statemachine.Event{Type: statemachine.EventKeyExpired, PrevKV: &statemachine.KeyValue{Key: "a/x"}}, true},
		{"an empty prefix matches every key", "", true, put(1, "zz"), true},
		{"a lease event never matches", "", true, acquired(1, "a", "a"), false},
		{"a key event without a key does not match", "", true,
			statemachine.Event{Type: statemachine.EventKeyPut}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := KeyFilter(tt.key, tt.prefix)(&tt.ev); got != tt.want {
				t.Errorf("got %v, expected: %v", got, tt.want)
			}
		})
	}
}

func TestLeaseFilter(t *testing.T) {
	tests := []struct {
		name string
		ns   string
		ev   statemachine.Event
		want bool
	}{
		{"a lease event in the namespace matches", "ns", acquired(1, "ns", "x"), true},
		{"a lease event in another namespace does not", "ns", acquired(1, "other", "x"), false},
		{"an empty namespace matches every lease event", "", acquired(1, "other", "x"), true},
		{"a key event never matches", "", put(1, "k"), false},
		{"a session event never matches", "",
			statemachine.Event{Type: statemachine.EventSessionOpened, SessionID: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := LeaseFilter(tt.ns)(&tt.ev); got != tt.want {
				t.Errorf("got %v, expected: %v", got, tt.want)
			}
		})
	}
}

// TestWatchersSeeExactlyTheirFilteredSubsequence drives a hub with random
// publishes (some with gaps), resets, watch starts, reads and closes, and
// checks every read against a model that keeps only the spec: a watcher
// gets the next event its filter accepts after the last one it got, or
// ErrLagged naming exactly the first revision it missed, or waits.
//
// A keyed watcher (WantKey) that waits is, to the model, at the revision
// after the last one published until an event of its key is: then it is
// at that event. A keyed watcher never lags for events it did not want
// while it waited.
func TestWatchersSeeExactlyTheirFilteredSubsequence(t *testing.T) {
	ab, xl := KVKey("ab"), LeaseKey(statemachine.LeaseID{Namespace: "x", Name: "l"})
	filters := []struct {
		name string
		f    func(*statemachine.Event) bool
		key  *Key
	}{
		{"everything", nil, nil},
		{"nothing", func(*statemachine.Event) bool { return false }, nil},
		{"prefix a", KeyFilter("a", true), nil},
		{"key ab", KeyFilter("ab", false), nil},
		{"namespace x", LeaseFilter("x"), nil},
		{"every lease", LeaseFilter(""), nil},
		{"keyed ab", KeyFilter("ab", false), &ab},
		{"keyed lease x/l", func(e *statemachine.Event) bool {
			return e.Type.IsLease() && e.Lease == statemachine.LeaseID{Namespace: "x", Name: "l"}
		}, &xl},
	}
	type watcher struct {
		w      *Watcher
		filter int
		// cursor is the next revision this watcher may be given: its start,
		// one past the last event it got, or one past the last revision when
		// it last found nothing to read.
		cursor int64
		err    error // the LaggedError it got, returned from then on
		closed bool
		// waiting is set for a keyed watcher whose last read found
		// nothing, until an event of its key or a reset.
		waiting bool
	}

	rapid.Check(t, func(rt *rapid.T) {
		history := rapid.IntRange(1, 12).Draw(rt, "history")
		h := NewHub(history)
		// The model: the events kept, by revision, and their range.
		kept := map[int64]statemachine.Event{}
		oldest, last := int64(1), int64(0)
		var watchers []*watcher
		defer func() {
			for _, w := range watchers {
				w.w.Close()
			}
		}()

		accepts := func(f int, ev statemachine.Event) bool {
			return filters[f].f == nil || filters[f].f(&ev)
		}
		reset := func(rev int64) {
			for _, w := range watchers {
				if w.waiting {
					w.cursor, w.waiting = last+1, false
				}
				switch {
				case w.err != nil || w.closed:
				case w.cursor <= rev:
					w.err = &LaggedError{Resync: w.cursor}
				case w.cursor > rev+1 && w.cursor <= last+1:
					w.err = &LaggedError{Resync: rev + 1}
				}
			}
			clear(kept)
			oldest, last = rev+1, rev
		}
		genEvent := func(rev int64) statemachine.Event {
			switch rapid.IntRange(0, 3).Draw(rt, "type") {
			case 0:
				return put(rev, rapid.SampledFrom([]string{"a", "ab", "b"}).Draw(rt, "key"))
			case 1:
				return del(rev, rapid.SampledFrom([]string{"a", "ab", "b"}).Draw(rt, "key"))
			case 2:
				return acquired(rev, rapid.SampledFrom([]string{"x", "y"}).Draw(rt, "ns"), "l")
			default:
				return statemachine.Event{Revision: rev, Type: statemachine.EventSessionOpened}
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"publish": func(rt *rapid.T) {
				n := rapid.IntRange(1, 6).Draw(rt, "count")
				rev := last + 1
				if rapid.IntRange(0, 9).Draw(rt, "gap?") == 0 {
					rev += rapid.Int64Range(1, 3).Draw(rt, "gap")
				}
				var evs []statemachine.Event
				for i := range int64(n) {
					evs = append(evs, genEvent(rev+i))
				}
				h.Publish(evs)
				for _, ev := range evs {
					if ev.Revision != last+1 {
						reset(ev.Revision - 1)
					}
					kept[ev.Revision] = ev
					last = ev.Revision
					for last-oldest+1 > int64(history) {
						delete(kept, oldest)
						oldest++
					}
					for _, w := range watchers {
						if w.waiting && accepts(w.filter, ev) {
							w.cursor, w.waiting = ev.Revision, false
						}
					}
				}
			},
			"reset": func(rt *rapid.T) {
				rev := rapid.Int64Range(max(0, last-4), last+6).Draw(rt, "rev")
				h.Reset(rev)
				reset(rev)
			},
			"watch": func(rt *rapid.T) {
				start := rapid.Int64Range(0, last+4).Draw(rt, "start")
				f := rapid.IntRange(0, len(filters)-1).Draw(rt, "filter")
				w, err := h.Watch(start, filters[f].f)
				if start != 0 && start < oldest {
					var ce *CompactedError
					if !errors.As(err, &ce) || *ce != (CompactedError{Requested: start, Oldest: oldest}) {
						rt.Fatalf("Watch(%d): got %v, expected: CompactedError{%d, %d}", start, err, start, oldest)
					}
					return
				}
				if err != nil {
					rt.Fatalf("Watch(%d): got %v, expected a watcher", start, err)
				}
				if k := filters[f].key; k != nil {
					w.WantKey(*k)
				}
				cursor := start
				if start == 0 {
					cursor = last + 1
				}
				watchers = append(watchers, &watcher{w: w, filter: f, cursor: cursor})
			},
			"read": func(rt *rapid.T) {
				if len(watchers) == 0 {
					rt.Skip("no watchers")
				}
				w := watchers[rapid.IntRange(0, len(watchers)-1).Draw(rt, "watcher")]
				if w.waiting {
					w.cursor = last + 1
				}
				ev, err := nextErr(w.w)
				switch {
				case w.closed:
					if !errors.Is(err, ErrClosed) {
						rt.Fatalf("closed watcher: got %v, expected ErrClosed", err)
					}
					return
				case w.err == nil && w.cursor < oldest:
					w.err = &LaggedError{Resync: w.cursor}
				}
				if w.err != nil {
					var le *LaggedError
					if !errors.As(err, &le) || *le != *w.err.(*LaggedError) {
						rt.Fatalf("%s watcher: got %v (event %d), expected: %v",
							filters[w.filter].name, err, ev.Revision, w.err)
					}
					return
				}
				for rev := w.cursor; rev <= last; rev++ {
					if want := kept[rev]; accepts(w.filter, want) {
						if err != nil || ev.Revision != want.Revision || ev.Type != want.Type {
							rt.Fatalf("%s watcher from %d: got event %d (%v), err %v, expected: event %d (%v)",
								filters[w.filter].name, w.cursor, ev.Revision, ev.Type, err, want.Revision, want.Type)
						}
						w.cursor = rev + 1
						return
					}
				}
				if !errors.Is(err, context.Canceled) {
					rt.Fatalf("%s watcher from %d, last %d: got event %d, err %v, expected it to wait",
						filters[w.filter].name, w.cursor, last, ev.Revision, err)
				}
				w.cursor = max(w.cursor, last+1)
				w.waiting = filters[w.filter].key != nil
			},
			"close": func(rt *rapid.T) {
				if len(watchers) == 0 {
					rt.Skip("no watchers")
				}
				w := watchers[rapid.IntRange(0, len(watchers)-1).Draw(rt, "watcher")]
				w.w.Close()
				w.closed = true
			},
			"": func(rt *rapid.T) {
				if got := h.Revision(); got != last {
					rt.Fatalf("got Revision() = %d, expected: %d", got, last)
				}
			},
		})
	})
}
