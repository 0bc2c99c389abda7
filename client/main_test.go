package client_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind:
// heartbeat loops, grant monitors, watches and proxy pipes must all end
// once their owners are closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
