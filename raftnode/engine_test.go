package raftnode

import (
	"context"
	"testing"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// Helpers that reach below Node's API.

// snapshotNow makes n snapshot its state at once.
func snapshotNow(t testing.TB, n *Node) {
	t.Helper()
	if err := n.engine.snapshotNow(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
}

// proposeRaw appends data as an entry's command, unchecked, and returns
// the state machine's result.
func proposeRaw(t testing.TB, n *Node, data []byte) statemachine.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := n.engine.propose(ctx, "propose", data)
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	return res
}
