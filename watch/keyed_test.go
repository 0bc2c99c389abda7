package watch

import (
	"fmt"
	"testing"

	"github.com/tenurehq/tenure/statemachine"
)

// keyedWaiting opens a watcher of key alone, keyed, and has it wait (as
// Next would) without a goroutine: Poll registers the wait.
func keyedWaiting(t testing.TB, h *Hub, key string) (*Watcher, <-chan struct{}) {
	t.Helper()
	w, err := h.Watch(0, KeyFilter(key, false))
	if err != nil {
		t.Fatal(err)
	}
	w.WantKey(KVKey(key))
	_, ok, wait, err := w.Poll()
	if ok || wait == nil || err != nil {
		t.Fatalf("poll of %q: got = %v, %v, %v, expected: a channel to wait on", key, ok, wait, err)
	}
	return w, wait
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Publishing events of other keys costs the idle keyed watchers nothing:
// 20,000 of them wait through 1,000 events, many more than the hub keeps,
// without being woken, looked at or lagged, and each still gets the first
// event of its own key.
func TestIdleKeyedWatchersCostAPublishNothing(t *testing.T) {
	const n, others = 20_000, 1_000
	h := NewHub(64)
	ws := make([]*Watcher, n)
	waits := make([]<-chan struct{}, n)
	for i := range n {
		ws[i], waits[i] = keyedWaiting(t, h, fmt.Sprintf("idle/%d", i))
		defer ws[i].Close()
	}

	puts(h, 1, others, "busy")
	if h.visits != 0 {
		t.Fatalf("watchers visited by %d publishes of another key: got = %d, expected: 0", others, h.visits)
	}
	for i, wait := range waits {
		if closed(wait) {
			t.Fatalf("watcher %d was woken by events of another key", i)
		}
		if got := ws[i].Looked(); got != others {
			t.Fatalf("Looked of watcher %d: got = %d, expected: %d", i, got, others)
		}
		// A look without a wake, as after a cancelled Next, finds
		// nothing and no lag, and goes on waiting.
		if _, ok, wait, err := ws[i].Poll(); ok || wait == nil || err != nil {
			t.Fatalf("poll of watcher %d: got = %v, %v, %v, expected: a channel to wait on", i, ok, wait, err)
		}
	}

	for i, w := range ws {
		rev := int64(others + 1 + i)
		h.Publish([]statemachine.Event{put(rev, fmt.Sprintf("idle/%d", i))})
		if !closed(waits[i]) {
			t.Fatalf("watcher %d was not woken by its key's event", i)
		}
		if e, err := nextErr(w); err != nil || e.Revision != rev {
			t.Fatalf("watcher %d after its key's event: got = revision %d, %v, expected: revision %d", i, e.Revision, err, rev)
		}
	}
	if h.visits != n {
		t.Fatalf("watchers visited by %d publishes, one for each: got = %d, expected: %d", n, h.visits, n)
	}
}

// A keyed watcher is woken by the deletion of its key, which carries
// only the previous value, and by its lease's events when it follows a
// lease; watchers of one key are all woken, and one that closed is not
// among them.
func TestKeyedWatchersAreWokenByTheirKeysEvents(t *testing.T) {
	h := NewHub(8)
	a, waitA := keyedWaiting(t, h, "k")
	b, waitB := keyedWaiting(t, h, "k")
	c, waitC := keyedWaiting(t, h, "k")
	defer a.Close()
	defer c.Close()
	b.Close()
	h.Publish([]statemachine.Event{del(1, "k")})
	if !closed(waitA) || !closed(waitC) {
		t.Fatal("a deletion of the key did not wake its watchers")
	}
	if closed(waitB) {
		t.Fatal("a closed watcher was woken")
	}
	if len(h.keyed) != 0 {
		t.Fatalf("keys indexed once every watcher is woken or closed: got = %d, expected: 0", len(h.keyed))
	}

	id := statemachine.LeaseID{Namespace: "ns", Name: "l"}
	l, err := h.Watch(0, func(e *statemachine.Event) bool { return e.Type.IsLease() && e.Lease == id })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.WantKey(LeaseKey(id))
	_, _, wait, _ := l.Poll()
	h.Publish([]statemachine.Event{acquired(2, "ns", "other"), put(3, "l")})
	if closed(wait) {
		t.Fatal("another lease's event, or a key named as the lease, woke a lease's watcher")
	}
	h.Publish([]statemachine.Event{acquired(4, "ns", "l")})
	if !closed(wait) {
		t.Fatal("the lease's event did not wake its watcher")
	}
	if e := mustNext(t, l); e.Revision != 4 {
		t.Fatalf("got = revision %d, expected: 4", e.Revision)
	}
}

// A reset judges a keyed watcher that waits as one at the revision after
// the last published, whatever it last looked at, and one that does not
// wait by its cursor, as every other watcher.
func TestResetJudgesAWaitingKeyedWatcherAsUpToDate(t *testing.T) {
	tests := []struct {
		name    string
		wait    bool  // the watcher waits for its key when the reset comes
		reset   int64 // the history holds 1..10 of other keys, 8 of them kept
		resync  int64 // 0: the watcher carries on
		nextRev int64 // when it carries on, the first revision it reads
	}{
		{name: "a waiting keyed watcher carries on after a reset to the current revision",
			wait: true, reset: 10, nextRev: 11},
		{name: "a waiting keyed watcher lags from the revision after the last when a restore jumps ahead",
			wait: true, reset: 50, resync: 11},
		{name: "a waiting keyed watcher lags from the revision after an older restored one",
			wait: true, reset: 5, resync: 6},
		{name: "a keyed watcher that never waited is behind, and lags from its cursor",
			wait: false, reset: 10, resync: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHub(8)
			w, err := h.Watch(1, KeyFilter("mine", false))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			w.WantKey(KVKey("mine"))
			var wait <-chan struct{}
			if tt.wait {
				_, _, wait, _ = w.Poll()
			}
			puts(h, 1, 10, "other")
			h.Reset(tt.reset)
			if tt.wait && !closed(wait) {
				t.Fatal("a reset did not wake the waiting watcher")
			}
			h.Publish([]statemachine.Event{put(tt.reset+1, "mine")})
			requireResyncOrNext(t, w, tt.resync, tt.nextRev)
		})
	}
}

// WakeAt ends a keyed watcher's wait once its revision is published, and
// at once when it already is; the watcher has then looked at everything
// published, without lagging.
func TestWakeAtWakesAKeyedWatcherAtItsRevision(t *testing.T) {
	h := NewHub(4)
	w, wait := keyedWaiting(t, h, "mine")
	defer w.Close()
	w.WakeAt(10)
	puts(h, 1, 9, "other")
	if closed(wait) {
		t.Fatal("revisions before the one to wake at woke the watcher")
	}
	puts(h, 10, 10, "other")
	if !closed(wait) {
		t.Fatal("the revision to wake at did not wake the watcher")
	}
	if got := w.Looked(); got != 10 {
		t.Fatalf("Looked after the wake: got = %d, expected: 10", got)
	}
	_, _, wait, err := w.Poll()
	if wait == nil || err != nil {
		t.Fatalf("poll after the wake: got = %v, %v, expected: a channel to wait on and no lag", wait, err)
	}
	puts(h, 11, 20, "other")
	if closed(wait) {
		t.Fatal("a WakeAt woke the watcher's next wait too")
	}
	w.WakeAt(15)
	if !closed(wait) {
		t.Fatal("a WakeAt of a revision published did not wake the watcher at once")
	}
	if len(h.timed) != 0 {
		t.Fatalf("watchers waiting for a revision after the wakes: got = %d, expected: 0", len(h.timed))
	}
}
