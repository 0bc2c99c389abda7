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
	for _, watches := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("watches=%d", watches), func(b *testing.B) {
			f := newFakeBackend(b)
			c := serve(b, f)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			chans := make([]clientv3.WatchChan, watches)
			for i := range chans {
				chans[i] = c.Watch(ctx, fmt.Sprintf("r%04d/", i), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
				if r := <-chans[i]; !r.Created {
					b.Fatalf("watch %d: %+v", i, r)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				f.apply(statemachine.Put{Key: fmt.Sprintf("r0000/%d", i), Value: "v"})
				if r := <-chans[0]; len(r.Events) != 1 {
					b.Fatalf("put %d: %+v", i, r)
				}
			}
		})
	}
}
