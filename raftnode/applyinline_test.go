package raftnode

import (
	"fmt"
	"sync"
	"testing"
)

// A sole voter's commits arrive in a Ready that writes nothing, and are
// applied on the Ready loop itself; under concurrent writes, batches go
// to apply as well. Either way every write is applied once, in log
// order, and answered with its own revision.
func TestCommitsAppliedOnTheReadyLoopKeepTheirOrder(t *testing.T) {
	t.Parallel()
	n := openFake(t, testConfig(t.TempDir(), "wal"), nil)
	waitLeader(t, n)
	var last int64
	for i := range 50 {
		res := put(t, n, fmt.Sprintf("seq%d", i), "v")
		if res.Revision <= last {
			t.Fatalf("got = revision %d after %d, expected: each sequential write's revision above the last", res.Revision, last)
		}
		last = res.Revision
	}
	if got := n.engine.inlineApplies.Load(); got == 0 {
		t.Fatalf("got = no batch applied on the Ready loop after 50 sequential writes on a sole voter, expected: most of them")
	}
	var wg sync.WaitGroup
	revs := make([][]int64, 16)
	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				revs[g] = append(revs[g], put(t, n, fmt.Sprintf("g%d-%d", g, i), fmt.Sprint(i)).Revision)
			}
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	for g, rs := range revs {
		for i, r := range rs {
			if seen[r] {
				t.Fatalf("got = revision %d answered twice, expected: one write each", r)
			}
			seen[r] = true
			if i > 0 && r <= rs[i-1] {
				t.Fatalf("goroutine %d: got = revision %d after %d, expected: its writes in order", g, r, rs[i-1])
			}
		}
	}
	kv, rev := readKV(t, n)
	if want := last + 16*20; rev != want {
		t.Fatalf("got = revision %d, expected: %d (every write applied once)", rev, want)
	}
	for g := range 16 {
		if kv[fmt.Sprintf("g%d-19", g)] != "19" {
			t.Fatalf("got = %q for g%d-19, expected: its last write", kv[fmt.Sprintf("g%d-19", g)], g)
		}
	}
}
