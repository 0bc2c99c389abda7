package watch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

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

// TestTheRingGrowsAsEventsArriveAndKeepsEveryOne checks that a hub
// whose ring starts short keeps every event across its growth, for a
// watcher that began before it and for one that starts in the past,
// and once full holds history events and drops the oldest.
func TestTheRingGrowsAsEventsArriveAndKeepsEveryOne(t *testing.T) {
	const history = 3*firstRing + 100 // the last growth stops short of a doubling
	h := NewHub(history)
	if got := len(h.ring); got != firstRing {
		t.Fatalf("ring of a new hub: got = %d slots, expected: %d", got, firstRing)
	}
	early, err := h.Watch(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	puts(h, 1, history, "k")
	if got := len(h.ring); got != history {
		t.Fatalf("ring after %d events: got = %d slots, expected: %d", history, got, history)
	}
	late, err := h.Watch(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	for rev := int64(1); rev <= history; rev++ {
		for _, w := range []*Watcher{early, late} {
			if got := mustNext(t, w).Revision; got != rev {
				t.Fatalf("event read: got = revision %d, expected: %d", got, rev)
			}
		}
	}
	puts(h, history+1, history+10, "k")
	if got := len(h.ring); got != history {
		t.Fatalf("ring past history: got = %d slots, expected: %d", got, history)
	}
	if _, err := h.Watch(10, nil); !errors.Is(err, ErrCompacted) {
		t.Fatalf("Watch(10) once 10 events were dropped: got = %v, expected: %v", err, ErrCompacted)
	}
	w, err := h.Watch(11, nil)
	if err != nil {
		t.Fatalf("Watch(11), the oldest kept: %v", err)
	}
	defer w.Close()
	expect := int64(11)
	if got := mustNext(t, w).Revision; got != expect {
		t.Fatalf("oldest event kept: got = revision %d, expected: %d", got, expect)
	}
}
