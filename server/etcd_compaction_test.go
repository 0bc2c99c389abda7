package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// The leader compacts the keys' history as --auto-compaction-mode says,
// on every node, and never past what the retention keeps.
func TestAutoCompactionKeepsTheRetainedRevisions(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Compaction
		// kept is how many of the last revisions must stay readable.
		kept int64
	}{
		{"revision mode keeps the last N revisions", Compaction{Mode: "revision", Revisions: 5, Interval: 20 * time.Millisecond}, 5},
		{"periodic mode keeps the revisions of the period", Compaction{Mode: "periodic", Period: 200 * time.Millisecond, Interval: 20 * time.Millisecond}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, t.TempDir(), testLimits(), func(*raftnode.Config) {})
			// A second node object is not needed: compaction is a logged
			// command, applied alike everywhere; what is tested is that
			// the leader proposes it, and how far.
			ts.cfg.Etcd = EtcdConfig{Listener: testnet.Listen(t), Compaction: tc.c}
			if err := ts.startEtcd(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := range 30 {
				if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: fmt.Sprintf("k%d", i%3), Value: "v"})); err != nil {
					t.Fatal(err)
				}
			}
			var kvRev, compacted int64
			readState(t, ts.Server, func(m *statemachine.Machine) { kvRev = m.KVRevision() })
			for ctx.Err() == nil {
				readState(t, ts.Server, func(m *statemachine.Machine) { compacted = m.CompactRevision() })
				if compacted >= kvRev-tc.kept-2 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if compacted < kvRev-tc.kept-2 || compacted > kvRev-tc.kept+1 {
				t.Fatalf("compact revision got = %d, expected: about %d (KV revision %d keeping %d)", compacted, kvRev-tc.kept, kvRev, tc.kept)
			}
		})
	}
}

func readState(t *testing.T, s *Server, fn func(m *statemachine.Machine)) {
	t.Helper()
	if err := s.node.ReadLocal(func(m *statemachine.Machine) error { fn(m); return nil }); err != nil {
		t.Fatal(err)
	}
}
