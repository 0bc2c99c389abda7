package raftnode

import (
	"context"
	"testing"
	"time"

	"github.com/tenurehq/tenure/statemachine"
)

// Helpers that reach below Node's API, for either engine.

// snapshotNow makes n snapshot its state at once.
func snapshotNow(t testing.TB, n *Node) {
	t.Helper()
	var err error
	if n.etcd != nil {
		err = n.etcd.snapshotNow()
	} else {
		err = n.raft.Snapshot().Error()
	}
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
}

// proposeRaw appends data as an entry's command, unchecked, and returns
// the state machine's result.
func proposeRaw(t testing.TB, n *Node, data []byte) statemachine.Result {
	t.Helper()
	if n.etcd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := n.etcd.propose(ctx, "propose", data)
		if err != nil {
			t.Fatalf("propose: %v", err)
		}
		return res
	}
	f := n.raft.Apply(data, 5*time.Second)
	if err := f.Error(); err != nil {
		t.Fatalf("apply: %v", err)
	}
	res, ok := f.Response().(statemachine.Result)
	if !ok {
		t.Fatalf("response = %#v, expected a statemachine.Result", f.Response())
	}
	return res
}
