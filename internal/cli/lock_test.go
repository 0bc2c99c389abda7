package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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

// TestLockAndElectKeepTheTokenFromTheCommand: the bearer token in
// TENURE_TOKEN is tenure's credential, not the command's: the command
// does not see it unless --pass-token asks.
func TestLockAndElectKeepTheTokenFromTheCommand(t *testing.T) {
	addr := testserver.Start(t, testserver.Limits())
	t.Setenv("TENURE_TOKEN", "s3cret")
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"lock", []string{"lock", "a"}, "unset"},
		{"lock --pass-token", []string{"lock", "--pass-token", "a"}, "s3cret"},
		{"elect", []string{"elect", "e"}, "unset"},
		{"elect --pass-token", []string{"elect", "--pass-token", "e"}, "s3cret"},
	} {
		out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		args := append([]string{"--endpoints", addr}, tc.args...)
		args = append(args, "--", "sh", "-c", `echo "${TENURE_TOKEN-unset} $TENURE_FENCING_TOKEN" > `+out)
		if _, stderr, code := runMain(args...); code != 0 {
			t.Fatalf("%s: exit %d, %s", tc.name, code, stderr)
		}
		b, _ := os.ReadFile(out)
		got := strings.Fields(string(b))
		if len(got) != 2 || got[0] != tc.want || got[1] == "" {
			t.Errorf("%s: the command saw TENURE_TOKEN and TENURE_FENCING_TOKEN %q, expected: %s and a fencing token", tc.name, b, tc.want)
		}
	}
}
