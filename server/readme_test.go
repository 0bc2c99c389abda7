package server

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestReadmeQuickstart runs the README's quickstart exactly as printed,
// against a fresh server, so the README cannot drift from the product.
func TestReadmeQuickstart(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "<!-- quickstart -->\n```sh\n")
	if !ok {
		t.Fatal("README.md has no <!-- quickstart --> sh block")
	}
	script, _, ok := strings.Cut(block, "```\n<!-- /quickstart -->")
	if !ok {
		t.Fatal("README.md quickstart block is not closed by <!-- /quickstart -->")
	}
	const defaultURL = "TENURE=http://127.0.0.1:7480\n"
	if !strings.HasPrefix(script, defaultURL) {
		t.Fatalf("quickstart starts with %q, expected: %q", strings.SplitN(script, "\n", 2)[0], defaultURL)
	}

	limits := testLimits()
	limits.MinTTL, limits.DefaultTTL = 2*time.Second, 10*time.Second
	ts := startServer(t, t.TempDir(), limits)
	script = "TENURE=" + ts.URL + "\n" + strings.TrimPrefix(script, defaultURL)
	out, err := exec.Command("bash", "-c", script).CombinedOutput()
	// curl --max-time ends the watch with exit code 28: expected.
	if err != nil && !strings.Contains(err.Error(), "exit status 28") {
		t.Fatalf("quickstart failed: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		`{"session":{"id":"1","identity":"alice","ttl":"30s"`,
		`{"acquired":true,"token":"2","lease":{"namespace":"default","name":"nightly-report","capacity":1,"holderIdentity":"alice"`,
		`{"sessionId":"1","ttl":"30s","expired":false}`,
		`{"valid":true,"holderIdentity":"alice","currentToken":"2","tokens":["2"],"revision":"2"}`,
		`{"code":"failed_precondition","message":"not holder: token 1 is not a current holder of default/nightly-report (current token 2)"}`,
		`{"revision":"3"}`,
		`{"valid":false,"currentToken":"0","revision":"3"}`,
		`{"revision":"2","type":"LEASE_EVENT_TYPE_ACQUIRED","namespace":"default","name":"nightly-report","sessionId":"1","holderIdentity":"alice","token":"2"`,
		`{"revision":"3","type":"LEASE_EVENT_TYPE_RELEASED","namespace":"default","name":"nightly-report","sessionId":"1","holderIdentity":"alice","token":"2","reason":"released"`,
	}
	if len(lines) != len(want) {
		t.Fatalf("quickstart printed %d lines, expected: %d\n%s", len(lines), len(want), out)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d got = %s\nexpected prefix: %s", i+1, lines[i], w)
		}
	}
}
