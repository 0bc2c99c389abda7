package bench

import (
	"testing"

	"github.com/tenurehq/tenure/internal/proccluster"
)

// TestMain builds the tenure binary at most once (proccluster.Binary),
// removes it afterwards, and fails the package if goroutines outlive the
// tests: every session, client and server the harness starts must be
// gone when Run returns.
func TestMain(m *testing.M) {
	proccluster.Main(m)
}
