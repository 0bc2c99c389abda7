package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// A waiting Acquire sent the moment a restarted node's port answers must
// never be answered with a grant replayed from the log: the lease is
// held by T, so every waiter is either refused (not leader yet) or
// parked. Before the fix, a call parked while the node replayed its log
// was woken by its own old, released grant and told "acquired" with that
// stale token.
func TestWaitingAcquireAfterRestartIsNeverAnsweredFromHistory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	limits := testLimits()
	ts := startServer(t, dir, limits)
	const lease = "L"

	// S1..S3 each take and release L, so the log holds a grant of each;
	// T then takes L and keeps it.
	var waiters []int64
	for i := range 3 {
		s := openSession(t, ts, fmt.Sprintf("s%d", i), time.Minute).Id
		got := acquire(t, ts, s, lease, false)
		if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: lease, Token: got.Token})); err != nil {
			t.Fatalf("release: %v", err)
		}
		waiters = append(waiters, s)
	}
	tSession := openSession(t, ts, "t", time.Minute).Id
	held := acquire(t, ts, tSession, lease, false).Token

	// Pad the log so that replaying it takes a moment.
	padLog(t, ts, 3000)
	if err := ts.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	ts = openServer(t, dir, limits)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wrong []string
	parked := 0
	var wg sync.WaitGroup
	for _, s := range waiters {
		wg.Go(func() {
			for ctx.Err() == nil {
				callCtx, callCancel := context.WithTimeout(ctx, 2*time.Second)
				resp, err := ts.Leases.Acquire(callCtx, connect.NewRequest(&tenurev1.AcquireRequest{
					SessionId: s, Name: lease, Wait: true, WaitTimeout: durationpb.New(500 * time.Millisecond),
				}))
				callCancel()
				if err != nil {
					if connect.CodeOf(err) == connect.CodeUnavailable || errors.Is(err, context.DeadlineExceeded) || connect.CodeOf(err) == connect.CodeDeadlineExceeded {
						time.Sleep(time.Millisecond) // not ready yet: ask again at once
						continue
					}
					mu.Lock()
					wrong = append(wrong, fmt.Sprintf("session %d: %v", s, err))
					mu.Unlock()
					return
				}
				mu.Lock()
				if resp.Msg.GetAcquired() {
					wrong = append(wrong, fmt.Sprintf("session %d acquired %s with token %d while T holds token %d", s, lease, resp.Msg.GetToken(), held))
				} else {
					parked++
				}
				mu.Unlock()
				return
			}
		})
	}
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("waiters after restart:\n%v", wrong)
	}
	if parked != len(waiters) {
		t.Fatalf("got = %d waiters answered not-acquired, expected: %d", parked, len(waiters))
	}
	v, err := ts.Leases.Validate(ctxT(t), connect.NewRequest(&tenurev1.ValidateRequest{Name: lease, Token: held}))
	if err != nil {
		t.Fatalf("validate: %v", err)
	}
	if !v.Msg.GetValid() {
		t.Fatalf("got = T's token %d not valid after restart (current %d), expected: valid", held, v.Msg.GetCurrentToken())
	}
}

// padLog writes n keys from a few goroutines.
func padLog(t *testing.T, ts *testServer, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if _, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: fmt.Sprintf("pad/%05d", i), Value: "x"})); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("pad: %v", err)
	}
}
