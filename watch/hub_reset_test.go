package watch

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tenurehq/tenure/statemachine"
)

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
			requireResyncOrNext(t, w, tt.resync, tt.nextRev)
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

// requireResyncOrNext checks w's next read after a reset: a LaggedError
// resyncing from resync when that is not 0, else the event at nextRev.
func requireResyncOrNext(t *testing.T, w *Watcher, resync, nextRev int64) {
	t.Helper()
	ev, err := nextErr(w)
	if resync != 0 {
		var le *LaggedError
		if !errors.As(err, &le) || le.Resync != resync {
			t.Errorf("got %v, expected a LaggedError resyncing from %d", err, resync)
		}
		return
	}
	if err != nil || ev.Revision != nextRev {
		t.Errorf("got revision = %d, err = %v, expected: revision %d", ev.Revision, err, nextRev)
	}
}
