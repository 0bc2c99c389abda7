package watch

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/tenurehq/tenure/statemachine"
)

// BenchmarkPublishWithIdleKeyedWatchers publishes one put of a key no
// watcher follows, with 0, 10^4 and 10^5 watchers each waiting on a key
// of its own: the shape of a lock's waiters or of an etcd stream's
// watches. A publish should cost the same at every size.
func BenchmarkPublishWithIdleKeyedWatchers(b *testing.B) {
	for _, n := range []int{0, 10_000, 100_000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			h := NewHub(1024)
			ws := make([]*Watcher, n)
			for i := range n {
				key := fmt.Sprintf("idle/%d", i)
				w, err := h.Watch(0, KeyFilter(key, false))
				if err != nil {
					b.Fatal(err)
				}
				ws[i] = w
				w.WantKey(KVKey(key))
				if _, _, wait, err := w.Poll(); wait == nil || err != nil {
					b.Fatalf("poll of watcher %d: got = %v, %v, expected: a channel to wait on", i, wait, err)
				}
			}
			events := make([]statemachine.Event, b.N)
			for i := range events {
				events[i] = put(int64(i+1), "busy")
			}
			runtime.GC() // the setup's garbage is not the publishes' cost
			b.ReportAllocs()
			b.ResetTimer()
			for i := range events {
				h.Publish(events[i : i+1])
			}
			b.StopTimer() // closing the watchers is not a publish either
			for _, w := range ws {
				w.Close()
			}
		})
	}
}
