package etcdapi

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/statemachine"
)

// BenchmarkWatchFanOut is the cost of one key event to a stream of many
// watches, of which one matches: what a kube-apiserver's stream, with a
// watch per resource, pays for every write. One op is a put applied and
// delivered to the one watch that covers it.
func BenchmarkWatchFanOut(b *testing.B) {
	benchFanOut(b, []int{1, 100, 1000}, func(i int) string { return fmt.Sprintf("r%04d/", i) },
		func(i int) statemachine.Put { return statemachine.Put{Key: fmt.Sprintf("r0000/%d", i), Value: "v"} },
		clientv3.WithPrefix())
}

// BenchmarkWatchFanOutOfKeys is BenchmarkWatchFanOut with watches of one
// key each, the shape of a lock's or a lease record's watchers: a put
// should cost the same however many other keys are watched.
func BenchmarkWatchFanOutOfKeys(b *testing.B) {
	benchFanOut(b, []int{1, 1000, 10000}, func(i int) string { return fmt.Sprintf("k%05d", i) },
		func(i int) statemachine.Put { return statemachine.Put{Key: "k00000", Value: fmt.Sprint(i)} })
}

// benchFanOut opens watches of key(0..n-1) on one stream for each n in
// counts, then times puts, each of which the first watch must deliver.
func benchFanOut(b *testing.B, counts []int, key func(int) string, put func(int) statemachine.Put, opts ...clientv3.OpOption) {
	for _, watches := range counts {
		b.Run(fmt.Sprintf("watches=%d", watches), func(b *testing.B) {
			f := newFakeBackend(b)
			c := serve(b, f)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			chans := make([]clientv3.WatchChan, watches)
			for i := range chans {
				chans[i] = c.Watch(ctx, key(i), append(opts, clientv3.WithCreatedNotify())...)
				if r := <-chans[i]; !r.Created {
					b.Fatalf("watch %d: %+v", i, r)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				f.apply(put(i))
				if r := <-chans[0]; len(r.Events) != 1 {
					b.Fatalf("put %d: %+v", i, r)
				}
			}
		})
	}
}
