package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// --- 8: memory ---

// runMemory reads the server's resident memory when it has started,
// after opening idle sessions (10,000, heartbeating, TTL 1 minute), and after those
// sessions' first 1,000 take 100,000 locks between them; the deltas are
// scaled to per 10,000 sessions and per 100,000 locks. RSS is what the
// OS charges: it includes garbage not yet collected, so it is the
// operator's figure, not the live heap's.
func runMemory(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	sz := e.sz
	conns := make([]conn, 8)
	defer closeConns(conns)
	for i := range conns {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			return nil, err
		}
		conns[i] = c
	}
	settle := func() (int64, error) { return e.settledRSS(ctx, time.Second) }
	rss0, err := settle()
	if err != nil {
		return nil, err
	}
	sessions, err := openSessions(ctx, conns, sz.idleSessions, memoryTTL, time.Now().Add(5*time.Minute))
	if err != nil {
		return nil, fmt.Errorf("open %d sessions: %w", sz.idleSessions, err)
	}
	rss1, err := settle()
	if err != nil {
		return nil, err
	}
	holders := sessions[:min(sz.heldSessions, len(sessions))]
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= sz.heldLeases || ctx.Err() != nil {
					return
				}
				if err := holders[i%len(holders)].grant(ctx, "held-"+strconv.Itoa(i)); err != nil {
					errs <- fmt.Errorf("take lock %d: %w", i, err)
					next.Store(int64(sz.heldLeases))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	rss2, err := settle()
	if err != nil {
		return nil, err
	}
	r.add("server RSS at start", mib(rss0), "MiB", Lower)
	r.add("RSS per 10,000 idle sessions", mib(rss1-rss0)*10000/float64(sz.idleSessions), "MiB", Lower)
	r.add("RSS per 100,000 held locks", mib(rss2-rss1)*100000/float64(sz.heldLeases), "MiB", Lower)
	return []Result{r}, nil
}

// memoryTTL is the TTL of workload 8's sessions: a minute, not the
// default 10s, because the workload measures memory, not liveness. In the
// first full run, on a machine loaded by other work, a 10s session
// expired on both systems while its locks were being taken; at a minute
// the heartbeats (every 20s) are a sixth as many and far from their
// deadline, and what the server keeps per session is the same.
const memoryTTL = time.Minute

// settledRSS waits d for the server to settle (a collection, memory
// given back) and reads its resident memory.
func (e *env) settledRSS(ctx context.Context, d time.Duration) (int64, error) {
	if !sleepUntil(ctx, time.Now().Add(d)) {
		return 0, ctx.Err()
	}
	u, err := e.srv.Usage()
	return u.RSS, err
}
