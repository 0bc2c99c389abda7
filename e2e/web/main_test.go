// Package web drives the web page in headless Chromium against
// in-process servers. It is e2e's browser half, a package of its own so
// that go test -p runs it beside e2e's process tests; the members table,
// which needs e2e's cluster of processes, stays in e2e
// (web_members_test.go).
package web

import (
	"testing"

	"github.com/tenurehq/tenure/internal/proccluster"
)

// TestMain fails the run when goroutines outlive the tests.
func TestMain(m *testing.M) { proccluster.Main(m) }
