package cli

import (
	"context"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
)

// TestLockWaitSaysWhyItFailed: `lock --wait D` that fails for another
// reason than D running out says that reason, not "gave up waiting".
// Here the server refuses the acquire at once: the lock is held with
// another capacity, so --capacity is a bad argument (exit 2).
func TestLockWaitSaysWhyItFailed(t *testing.T) {
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Mutex("held").Lock(ctx); err != nil {
		t.Fatal(err)
	}

	_, stderr, code := runMain("--endpoints", addr, "lock", "--wait", "1m", "--capacity", "2", "held", "--", "true")
	want := "Error: capacity mismatch: default/held has capacity 1, the request asks for 2\n"
	if code != ExitUsage || stderr != want {
		t.Errorf("got = exit %d, stderr %q, expected: exit %d and the server's reason %q, not \"gave up waiting\"", code, stderr, ExitUsage, want)
	}
}
