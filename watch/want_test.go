package watch

import (
	"context"
	"testing"

	"github.com/tenurehq/tenure/statemachine"
)

// A watcher with a wake predicate waits through any number of events it
// does not want — more than the hub keeps — without being woken or
// lagging, and Looked says it is past them; the first event it wants
// wakes it and is the next it reads.
func TestAWatcherIsWokenOnlyForWhatItWants(t *testing.T) {
	h := NewHub(8)
	mine := func(e *statemachine.Event) bool { return e.KV != nil && e.KV.Key == "mine" }
	w, err := h.Watch(0, mine)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Want(mine)

	_, ok, wait, err := w.Poll()
	if ok || wait == nil || err != nil {
		t.Fatalf("poll of an empty hub: got = %v, %v, %v, expected: a channel to wait on", ok, wait, err)
	}
	puts(h, 1, 20, "other") // 20 events, the hub keeps 8
	select {
	case <-wait:
		t.Fatal("20 events the watcher does not want woke it")
	default:
	}
	if got := w.Looked(); got != 20 {
		t.Fatalf("Looked after 20 unwanted events: got = %d, expected: 20", got)
	}
	h.Publish([]statemachine.Event{put(21, "mine")})
	select {
	case <-wait:
	default:
		t.Fatal("an event the watcher wants did not wake it")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := w.Next(ctx)
	if err != nil || e.Revision != 21 {
		t.Fatalf("next after the wake: got = %+v, %v, expected: revision 21 with no lag", e, err)
	}
}

// A reset of the hub wakes a waiting watcher whatever it wants, so that
// it learns it lagged.
func TestAResetWakesAWatcherThatWantsNothing(t *testing.T) {
	h := NewHub(8)
	none := func(*statemachine.Event) bool { return false }
	w, err := h.Watch(0, none)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Want(none)
	puts(h, 1, 3, "k")
	_, _, wait, _ := w.Poll()
	if wait == nil {
		t.Fatal("poll: expected a channel to wait on")
	}
	h.Reset(100)
	select {
	case <-wait:
	default:
		t.Fatal("a reset did not wake the waiting watcher")
	}
}
