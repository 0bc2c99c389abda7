package watch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/tenurehq/tenure/statemachine"
)

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
