// Package e2etest holds what the end-to-end test packages (e2e and
// e2e/web) share: headless Chromium for the web page's tests, and a
// polling wait. They are separate packages so that go test -p runs the
// browser tests beside the process tests rather than after them.
package e2etest

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium finds Debian's Chromium, which .ci/run installs, and skips the
// test where there is none.
func Chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("no Chromium on this machine (.ci/run installs Debian's chromium)")
	return ""
}

// NewTab starts headless Chromium and returns a tab in it, closed when
// the test ends.
func NewTab(t *testing.T, ctx context.Context, browser string) context.Context {
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(browser),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	tab, tabCancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		tabCancel()
		allocCancel()
	})
	return tab
}

// Within polls cond until it holds, failing the test after limit.
func Within(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
