package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// A release whose answer never came may still apply, and an Acquire is
// idempotent per session: sent before the release applies, it would be
// answered with the same grant, which the late release then ends under
// the caller. The next lock sends that release again first, and gets a
// grant of its own. (Found by internal/sim's test client.)
func TestALockAfterAReleaseInDoubtReleasesItAgainFirst(t *testing.T) {
	var mu sync.Mutex
	var seen []string // what the server was asked, in order
	note := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	f := startFake(t, func(n int, c *fakeConn) {
		if n > 0 {
			c.Hold()
			return
		}
		acquires, releases := 0, 0
		for {
			req := c.Next()
			if req == nil {
				return
			}
			switch {
			case req.GetAcquire() != nil:
				acquires++
				note("acquire")
				c.Send(&tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Acquire{
					Acquire: &tenurev1.AcquireResponse{Acquired: true, Token: int64(4 + acquires)},
				}})
			case req.GetRelease() != nil:
				releases++
				note("release " + map[bool]string{true: "5", false: "other"}[req.GetRelease().GetToken() == 5])
				if releases > 1 { // the first is left unanswered: in doubt
					c.Send(&tenurev1.PipelineResponse{Id: req.GetId(), Result: &tenurev1.PipelineResponse_Release{Release: &tenurev1.ReleaseResponse{}}})
				}
			}
			// Anything else (the grant's watch) is left open.
		}
	})
	f.mountSessions()
	cl := newFakeClient(t, []string{f.Addr()})
	ctx := testCtx(t)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	m := s.Mutex("m")
	if err := m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = m.Unlock(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got = %v from an unanswered release, expected: the deadline", err)
	}
	if err := m.TryLock(ctx); err != nil {
		t.Fatalf("lock after the release in doubt: %v", err)
	}
	if got, held := m.Token(); !held || got.Token != 6 {
		t.Errorf("got = token %v (held %v), expected: 6, a grant of its own", got, held)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"acquire", "release 5", "release 5", "acquire"}
	if len(seen) != len(want) {
		t.Fatalf("got = the server asked %q, expected: %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("got = the server asked %q, expected: %q", seen, want)
		}
	}
}
