package watch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/tenurehq/tenure/statemachine"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func put(rev int64, key string) statemachine.Event {
	return statemachine.Event{Revision: rev, Type: statemachine.EventKeyPut,
		KV: &statemachine.KeyValue{Key: key, ModRevision: rev}}
}

func del(rev int64, key string) statemachine.Event {
	return statemachine.Event{Revision: rev, Type: statemachine.EventKeyDeleted,
		PrevKV: &statemachine.KeyValue{Key: key}}
}

func acquired(rev int64, ns, name string) statemachine.Event {
	return statemachine.Event{Revision: rev, Type: statemachine.EventLeaseAcquired,
		Lease: statemachine.LeaseID{Namespace: ns, Name: name}, Token: rev}
}

// puts publishes one put of key per revision in [from, to].
func puts(h *Hub, from, to int64, key string) {
	for rev := from; rev <= to; rev++ {
		h.Publish([]statemachine.Event{put(rev, key)})
	}
}

// mustNext reads one event that is expected to be ready.
func mustNext(t *testing.T, w *Watcher) statemachine.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next: got error %v, expected an event", err)
	}
	return ev
}

// nextErr reads with a context that is cancelled as soon as Next would
// block, so that "nothing to read" shows up as context.Canceled at once.
func nextErr(w *Watcher) (statemachine.Event, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.onWait = cancel
	defer func() { w.onWait = nil }()
	return w.Next(ctx)
}

func revisions(evs []statemachine.Event) []int64 {
	out := make([]int64, len(evs))
	for i := range evs {
		out[i] = evs[i].Revision
	}
	return out
}

func TestConcurrentWatchersGetTheirFilteredEventsInOrder(t *testing.T) {
	const total = 3000
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a/1", "a/2", "b", "bb", "c"}
	namespaces := []string{"ns1", "ns2"}
	var all []statemachine.Event
	for rev := int64(1); rev <= total; rev++ {
		switch rng.IntN(3) {
		case 0:
			all = append(all, put(rev, keys[rng.IntN(len(keys))]))
		case 1:
			all = append(all, del(rev, keys[rng.IntN(len(keys))]))
		default:
			all = append(all, acquired(rev, namespaces[rng.IntN(len(namespaces))], "x"))
		}
	}
	filters := map[string]func(*statemachine.Event) bool{
		"everything":        nil,
		"prefix a/":         KeyFilter("a/", true),
		"key b exactly":     KeyFilter("b", false),
		"namespace ns1":     LeaseFilter("ns1"),
		"every lease":       LeaseFilter(""),
		"nothing (missing)": KeyFilter("zzz", false),
	}

	h := NewHub(total) // large enough that nobody lags
	type result struct {
		name string
		want []int64
		got  []int64
		err  error
	}
	results := make([]*result, 0, len(filters))
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, f := range filters {
		w, err := h.Watch(0, f)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		defer w.Close()
		r := &result{name: name}
		for i := range all {
			if f == nil || f(&all[i]) {
				r.want = append(r.want, all[i].Revision)
			}
		}
		results = append(results, r)
		wg.Go(func() {
			for len(r.got) < len(r.want) {
				ev, err := w.Next(ctx)
				if err != nil {
					r.err = err
					return
				}
				r.got = append(r.got, ev.Revision)
			}
		})
	}
	for i := 0; i < len(all); {
		n := min(1+rng.IntN(20), len(all)-i)
		h.Publish(all[i : i+n])
		i += n
	}
	wg.Wait()
	for _, r := range results {
		if r.err != nil {
			t.Errorf("%s: Next failed after %d events: %v", r.name, len(r.got), r.err)
			continue
		}
		if fmt.Sprint(r.got) != fmt.Sprint(r.want) {
			t.Errorf("%s: got revisions = %v, expected: %v", r.name, r.got, r.want)
		}
	}
}

func TestLaggingUnderLoadNeverSkipsSilently(t *testing.T) {
	const total = 20000
	h := NewHub(64) // small, so that readers do lag
	type result struct {
		got []int64
		err error
	}
	results := make([]*result, 8)
	var wg sync.WaitGroup
	for i := range results {
		w, _ := h.Watch(1, nil)
		defer w.Close()
		r := &result{}
		results[i] = r
		wg.Go(func() {
			for len(r.got) == 0 || r.got[len(r.got)-1] < total {
				ev, err := w.Next(context.Background())
				if err != nil {
					r.err = err
					return
				}
				r.got = append(r.got, ev.Revision)
			}
		})
	}
	for rev := int64(1); rev <= total; rev += 4 {
		h.Publish([]statemachine.Event{put(rev, "k"), put(rev+1, "k"), put(rev+2, "k"), put(rev+3, "k")})
		runtime.Gosched() // let readers keep up, some of the time
	}
	wg.Wait()
	for i, r := range results {
		for j, rev := range r.got {
			if rev != int64(j)+1 {
				t.Fatalf("reader %d: got revision %d at position %d, expected: %d", i, rev, j, j+1)
			}
		}
		if r.err == nil {
			continue
		}
		var le *LaggedError
		if !errors.As(r.err, &le) || le.Resync != int64(len(r.got))+1 {
			t.Errorf("reader %d after %d events: got %v, expected a LaggedError resyncing from %d",
				i, len(r.got), r.err, len(r.got)+1)
		}
	}
}

func TestWatchReplaysFromAPastRevision(t *testing.T) {
	h := NewHub(16)
	puts(h, 1, 10, "k")
	w, err := h.Watch(4, nil)
	if err != nil {
		t.Fatalf("Watch(4): %v", err)
	}
	defer w.Close()
	var got []statemachine.Event
	for range 7 {
		got = append(got, mustNext(t, w))
	}
	puts(h, 11, 11, "k")
	got = append(got, mustNext(t, w))
	if want := "[4 5 6 7 8 9 10 11]"; fmt.Sprint(revisions(got)) != want {
		t.Errorf("got revisions = %v, expected: %s", revisions(got), want)
	}
	if _, err := nextErr(w); !errors.Is(err, context.Canceled) {
		t.Errorf("Next when caught up: got %v, expected it to block", err)
	}
}

func TestWatchFromFutureRevisionWaitsForIt(t *testing.T) {
	h := NewHub(16)
	puts(h, 1, 3, "k")
	w, err := h.Watch(6, nil)
	if err != nil {
		t.Fatalf("Watch(6): %v", err)
	}
	defer w.Close()
	puts(h, 4, 5, "k")
	if _, err := nextErr(w); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next before revision 6: got %v, expected it to block", err)
	}
	puts(h, 6, 6, "k")
	if ev := mustNext(t, w); ev.Revision != 6 {
		t.Errorf("got revision = %d, expected: 6", ev.Revision)
	}
}

func TestWatchTooOldIsCompacted(t *testing.T) {
	h := NewHub(8)
	puts(h, 1, 20, "k") // keeps 13..20
	_, err := h.Watch(5, nil)
	if !errors.Is(err, ErrCompacted) {
		t.Fatalf("Watch(5): got %v, expected ErrCompacted", err)
	}
	var ce *CompactedError
	if !errors.As(err, &ce) || ce.Requested != 5 || ce.Oldest != 13 {
		t.Errorf("got %#v, expected: Requested 5, Oldest 13", ce)
	}
	if want := "revision 5 is compacted; the oldest watchable revision is 13"; err.Error() != want {
		t.Errorf("got message %q, expected: %q", err, want)
	}
	if _, err := h.Watch(12, nil); !errors.Is(err, ErrCompacted) {
		t.Errorf("Watch(12): got %v, expected ErrCompacted", err)
	}
	w, err := h.Watch(13, nil)
	if err != nil {
		t.Fatalf("Watch(13), the oldest kept: %v", err)
	}
	defer w.Close()
	if ev := mustNext(t, w); ev.Revision != 13 {
		t.Errorf("got revision = %d, expected: 13", ev.Revision)
	}
	if _, err := h.Watch(-1, nil); err == nil {
		t.Errorf("Watch(-1): got no error, expected one")
	}
}

func TestSlowWatcherLagsAndFastOneDoesNot(t *testing.T) {
	h := NewHub(8)
	fast, _ := h.Watch(0, nil)
	defer fast.Close()
	slow, _ := h.Watch(0, nil)
	defer slow.Close()

	puts(h, 1, 3, "k")
	for want := int64(1); want <= 3; want++ {
		if ev := mustNext(t, slow); ev.Revision != want {
			t.Fatalf("slow: got revision = %d, expected: %d", ev.Revision, want)
		}
	}
	// slow's cursor is 4. After 11, the history is 4..11: nothing lost yet.
	for rev := int64(1); rev <= 20; rev++ {
		if rev > 3 {
			puts(h, rev, rev, "k")
		}
		if ev := mustNext(t, fast); ev.Revision != rev {
			t.Fatalf("fast: got revision = %d, expected: %d", ev.Revision, rev)
		}
		if rev == 11 {
			if ev := mustNext(t, slow); ev.Revision != 4 {
				t.Fatalf("slow at the edge of history: got revision = %d, expected: 4", ev.Revision)
			}
		}
	}
	// slow's cursor is 5 and the history is 13..20.
	_, err := slow.Next(context.Background())
	var le *LaggedError
	if !errors.Is(err, ErrLagged) || !errors.As(err, &le) {
		t.Fatalf("slow: got %v, expected ErrLagged", err)
	}
	if le.Resync != 5 {
		t.Errorf("got Resync = %d, expected: 5", le.Resync)
	}
	want := "watcher fell behind: events from revision 5 were discarded before it read them; resync from revision 5"
	if err.Error() != want {
		t.Errorf("got message %q, expected: %q", err, want)
	}
	// Cancelled for good, even once newer events arrive.
	puts(h, 21, 21, "k")
	if _, again := slow.Next(context.Background()); !errors.Is(again, ErrLagged) {
		t.Errorf("slow again: got %v, expected ErrLagged", again)
	}
	if ev := mustNext(t, fast); ev.Revision != 21 {
		t.Errorf("fast: got revision = %d, expected: 21", ev.Revision)
	}
}

func TestLagIsExactAtTheEdgeOfHistory(t *testing.T) {
	for _, history := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprint("history ", history), func(t *testing.T) {
			h := NewHub(history)
			n := int64(history)
			puts(h, 1, n+1, "k") // keeps 2..n+1
			reader, err := h.Watch(2, nil)
			if err != nil {
				t.Fatalf("Watch(2), the oldest kept: %v", err)
			}
			defer reader.Close()
			idle, _ := h.Watch(2, nil)
			defer idle.Close()
			if ev := mustNext(t, reader); ev.Revision != 2 {
				t.Fatalf("reading the oldest kept: got revision = %d, expected: 2", ev.Revision)
			}
			puts(h, n+2, n+2, "k") // keeps 3..n+2
			if ev := mustNext(t, reader); ev.Revision != 3 {
				t.Fatalf("reading the new oldest: got revision = %d, expected: 3", ev.Revision)
			}
			_, err = idle.Next(context.Background())
			var le *LaggedError
			if !errors.As(err, &le) || le.Resync != 2 {
				t.Fatalf("idle watcher: got %v, expected a LaggedError resyncing from 2", err)
			}
		})
	}
}

func TestFilterThatRejectsEverythingLooksAtEachEventOnce(t *testing.T) {
	h := NewHub(4096)
	var calls int // only Next's goroutine runs the filter
	w, _ := h.Watch(0, func(*statemachine.Event) bool { calls++; return false })
	defer w.Close()
	puts(h, 1, 1000, "k")
	if _, err := nextErr(w); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, expected Next to block", err)
	}
	puts(h, 1001, 1500, "k")
	if _, err := nextErr(w); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, expected Next to block", err)
	}
	if calls != 1500 {
		t.Errorf("got %d filter calls, expected: 1500", calls)
	}
}

// Poll hands over what is published without waiting, every event of a
// Publish call by the time it says it has looked at them all, then the
// channel that the next Publish closes; and ErrLagged and ErrClosed as
// Next does.
func TestPollNeverWaits(t *testing.T) {
	h := NewHub(4)
	w, _ := h.Watch(0, KeyFilter("a", true))
	defer w.Close()
	poll := func() (got []int64, wait <-chan struct{}, err error) {
		for {
			ev, ok, wait, err := w.Poll()
			switch {
			case err != nil || wait != nil:
				return got, wait, err
			case ok:
				got = append(got, ev.Revision)
			}
		}
	}
	h.Publish([]statemachine.Event{put(1, "a1"), put(2, "b"), put(3, "a2")})
	got, wait, err := poll()
	if err != nil || fmt.Sprint(got) != "[1 3]" {
		t.Fatalf("got = %v, %v, expected: [1 3]", got, err)
	}
	select {
	case <-wait:
		t.Fatal("the wait channel is closed before anything more is published")
	default:
	}
	puts(h, 4, 4, "a")
	<-wait
	if got, _, err := poll(); err != nil || fmt.Sprint(got) != "[4]" {
		t.Fatalf("got = %v, %v, expected: [4]", got, err)
	}
	puts(h, 5, 10, "a") // more than the 4 kept
	if _, _, err := poll(); !errors.Is(err, ErrLagged) {
		t.Fatalf("got = %v, expected: ErrLagged", err)
	}
	w.Close()
	if _, _, _, err := w.Poll(); !errors.Is(err, ErrClosed) {
		t.Fatalf("got = %v, expected: ErrClosed", err)
	}
}

// blockedNext starts Next on its own goroutine and returns once it is
// blocked, with a channel that yields its error.
func blockedNext(ctx context.Context, w *Watcher) <-chan error {
	blocked := make(chan struct{})
	w.onWait = func() { close(blocked) }
	errc := make(chan error, 1)
	go func() {
		_, err := w.Next(ctx)
		errc <- err
	}()
	<-blocked
	return errc
}

func TestCloseUnblocksNext(t *testing.T) {
	h := NewHub(8)
	w, _ := h.Watch(0, nil)
	errc := blockedNext(context.Background(), w)
	w.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("blocked Next: got %v, expected ErrClosed", err)
	}
	w.Close() // idempotent
	puts(h, 1, 1, "k")
	if _, err := w.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Close: got %v, expected ErrClosed", err)
	}
	if n := len(h.watchers); n != 0 {
		t.Errorf("got %d registered watchers after Close, expected: 0", n)
	}
}

func TestContextCancelUnblocksNext(t *testing.T) {
	h := NewHub(8)
	w, _ := h.Watch(0, nil)
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := blockedNext(ctx, w)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("blocked Next: got %v, expected context.Canceled", err)
	}
	w.onWait = nil
	// The watcher is still good for another read.
	puts(h, 1, 1, "k")
	if ev := mustNext(t, w); ev.Revision != 1 {
		t.Errorf("got revision = %d, expected: 1", ev.Revision)
	}
}

func TestReset(t *testing.T) {
	tests := []struct {
		name    string
		cursor  int64 // the watcher's next revision; history holds 1..10
		reset   int64
		resync  int64 // 0: the watcher carries on
		nextRev int64 // when it carries on, the first revision it reads
	}{
		{name: "a caught-up watcher carries on after a reset to the current revision",
			cursor: 11, reset: 10, nextRev: 11},
		{name: "a watcher behind a reset to the current revision lags from its cursor",
			cursor: 7, reset: 10, resync: 7},
		{name: "a caught-up watcher lags from its cursor when a restore jumps ahead",
			cursor: 11, reset: 50, resync: 11},
		{name: "a watcher waiting for a revision past the restored one keeps waiting",
			cursor: 60, reset: 50, nextRev: 60},
		{name: "a watcher waiting for exactly the next revision after a restore carries on",
			cursor: 51, reset: 50, nextRev: 51},
		{name: "a watcher that read past an older restored revision lags from the revision after it",
			cursor: 9, reset: 5, resync: 6},
		{name: "a caught-up watcher lags from the revision after an older restored one",
			cursor: 11, reset: 5, resync: 6},
		{name: "a watcher waiting past the old history is not disturbed by a rewind",
			cursor: 15, reset: 5, nextRev: 15},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHub(16)
			puts(h, 1, 10, "k")
			w, err := h.Watch(tt.cursor, nil)
			if err != nil {
				t.Fatalf("Watch(%d): %v", tt.cursor, err)
			}
			defer w.Close()
			h.Reset(tt.reset)
			if got := h.Revision(); got != tt.reset {
				t.Errorf("got Revision() = %d, expected: %d", got, tt.reset)
			}
			puts(h, tt.reset+1, max(tt.reset+1, tt.nextRev), "k")
			ev, err := nextErr(w)
			if tt.resync != 0 {
				var le *LaggedError
				if !errors.As(err, &le) || le.Resync != tt.resync {
					t.Errorf("got %v, expected a LaggedError resyncing from %d", err, tt.resync)
				}
				return
			}
			if err != nil || ev.Revision != tt.nextRev {
				t.Errorf("got revision = %d, err = %v, expected: revision %d", ev.Revision, err, tt.nextRev)
			}
		})
	}
}

func TestResetWakesBlockedWatcher(t *testing.T) {
	h := NewHub(8)
	puts(h, 1, 3, "k")
	w, _ := h.Watch(0, nil)
	defer w.Close()
	errc := blockedNext(context.Background(), w)
	h.Reset(100)
	if err := <-errc; !errors.Is(err, ErrLagged) {
		t.Errorf("got %v, expected ErrLagged", err)
	}
}

func TestResetCompactsEverythingBeforeIt(t *testing.T) {
	h := NewHub(8)
	puts(h, 1, 3, "k")
	h.Reset(100)
	var ce *CompactedError
	if _, err := h.Watch(100, nil); !errors.As(err, &ce) || ce.Oldest != 101 {
		t.Errorf("Watch(100): got %v, expected a CompactedError with Oldest 101", err)
	}
	w, err := h.Watch(101, nil)
	if err != nil {
		t.Fatalf("Watch(101): %v", err)
	}
	defer w.Close()
	puts(h, 101, 101, "k")
	if ev := mustNext(t, w); ev.Revision != 101 {
		t.Errorf("got revision = %d, expected: 101", ev.Revision)
	}
}

func TestPublishGapActsAsReset(t *testing.T) {
	h := NewHub(8)
	puts(h, 1, 3, "k")
	w, _ := h.Watch(0, nil)
	defer w.Close()
	puts(h, 7, 7, "k") // 4..6 never published
	_, err := w.Next(context.Background())
	var le *LaggedError
	if !errors.As(err, &le) || le.Resync != 4 {
		t.Errorf("got %v, expected a LaggedError resyncing from 4", err)
	}
	if got := h.Revision(); got != 7 {
		t.Errorf("got Revision() = %d, expected: 7", got)
	}
}

func TestLargeValuesShortenTheHistory(t *testing.T) {
	h := NewHub(64) // 64 KiB budget
	w, _ := h.Watch(1, nil)
	defer w.Close()
	big := strings.Repeat("v", 16<<10)
	for rev := int64(1); rev <= 10; rev++ {
		ev := put(rev, "k")
		ev.KV.Value = big
		h.Publish([]statemachine.Event{ev})
	}
	h.mu.RLock()
	oldest, bytes := h.oldest, h.bytes
	h.mu.RUnlock()
	if oldest != 8 || bytes > h.maxBytes {
		t.Errorf("got oldest = %d, bytes = %d, expected: oldest 8 and bytes <= %d", oldest, bytes, h.maxBytes)
	}
	var le *LaggedError
	if _, err := w.Next(context.Background()); !errors.As(err, &le) || le.Resync != 1 {
		t.Errorf("got %v, expected a LaggedError resyncing from 1", err)
	}
	// One event larger than the whole budget is still kept.
	huge := put(11, "k")
	huge.KV.Value = strings.Repeat("v", 100<<10)
	h.Publish([]statemachine.Event{huge})
	w2, err := h.Watch(11, nil)
	if err != nil {
		t.Fatalf("Watch(11): %v", err)
	}
	defer w2.Close()
	if ev := mustNext(t, w2); ev.Revision != 11 {
		t.Errorf("got revision = %d, expected: 11", ev.Revision)
	}
}

func TestAByteBudgetBelowTheCountsShortensTheHistory(t *testing.T) {
	h := NewHubBytes(1000, 40<<10) // 1000 × 1 KiB, but 40 KiB given
	expect := func(what string, got, want int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got = %d, expected: %d", what, got, want)
		}
	}
	expect("budget", h.MaxBytes(), 40<<10)
	ring := h.Bytes()
	if ring <= 0 {
		t.Fatalf("Bytes of an empty hub: got = %d, expected: its ring, above 0", ring)
	}
	big := strings.Repeat("v", 10<<10)
	for rev := int64(1); rev <= 20; rev++ {
		ev := put(rev, "k")
		ev.KV.Value = big
		h.Publish([]statemachine.Event{ev})
	}
	if got := h.Bytes() - ring; got > 40<<10 || got < 30<<10 {
		t.Errorf("payload kept: got = %d bytes, expected: between 30 KiB and the 40 KiB budget", got)
	}
	if _, err := h.Watch(1, nil); !errors.Is(err, ErrCompacted) {
		t.Errorf("Watch(1) after the budget dropped it: got = %v, expected: %v", err, ErrCompacted)
	}
	// A budget above the count's changes nothing: the count's wins.
	expect("budget above history × 1 KiB", NewHubBytes(10, 1<<30).MaxBytes(), 10<<10)
	expect("no budget", NewHubBytes(10, 0).MaxBytes(), 10<<10)
}

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
func TestWatchersSeeExactlyTheirFilteredSubsequence(t *testing.T) {
	filters := []struct {
		name string
		f    func(*statemachine.Event) bool
	}{
		{"everything", nil},
		{"nothing", func(*statemachine.Event) bool { return false }},
		{"prefix a", KeyFilter("a", true)},
		{"key ab", KeyFilter("ab", false)},
		{"namespace x", LeaseFilter("x")},
		{"every lease", LeaseFilter("")},
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

// BenchmarkPublish publishes one event per op. Idle watchers (open, not
// reading) must not change the cost: Publish does no work per watcher.
func BenchmarkPublish(b *testing.B) {
	for _, watchers := range []int{0, 100} {
		b.Run(fmt.Sprintf("idle watchers=%d", watchers), func(b *testing.B) {
			h := NewHub(DefaultHistory)
			for range watchers {
				w, _ := h.Watch(0, KeyFilter("other", false))
				defer w.Close()
			}
			evs := []statemachine.Event{put(0, "k")}
			kv := *evs[0].KV
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				evs[0].Revision = int64(i) + 1
				evs[0].KV = &kv
				h.Publish(evs)
			}
		})
	}
}
