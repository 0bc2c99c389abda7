package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
)

// TestValidateKeyExitsByTheHoldersFate: `validate-key` exits 0 while the
// key is the one its holder made, 1 once it is gone, and 2 for bad
// arguments, before anything is sent.
func TestValidateKeyExitsByTheHoldersFate(t *testing.T) {
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const key = "mylock/1a"
	if _, err := c.KV().Put(ctx, key, ""); err != nil {
		t.Fatal(err)
	}
	kv, err := c.KV().Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	rev := fmt.Sprint(kv.CreateRevision)

	stdout, stderr, code := runMain("--endpoints", addr, "validate-key", key, "--revision", rev)
	if want := "valid: mylock/1a is held as created at revision " + rev; code != 0 || !strings.HasPrefix(stdout, want) {
		t.Errorf("held: got = exit %d, %q %q, expected: exit 0, %q", code, stdout, stderr, want)
	}
	if _, err := c.KV().Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = runMain("--endpoints", addr, "validate-key", key, "--revision", rev)
	if want := "not valid: mylock/1a does not exist (the lock was released or its lease ended)\n"; code != ExitUnmet || stdout != want {
		t.Errorf("deleted: got = exit %d, %q, expected: exit %d, %q", code, stdout, ExitUnmet, want)
	}
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"validate-key", key}, `required flag(s) "revision" not set`},
		{[]string{"validate-key", key, "--revision", "0"}, "--revision must be a positive KV revision"},
		{[]string{"validate-key", "", "--revision", "3"}, "KEY must not be empty"},
	} {
		_, stderr, code := runMain(append([]string{"--endpoints", addr}, tc.args...)...)
		if code != ExitUsage || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("tenure %s: got = exit %d, %q, expected: exit %d saying %q", strings.Join(tc.args, " "), code, stderr, ExitUsage, tc.stderr)
		}
	}
}
