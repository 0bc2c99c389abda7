package raftnode

import "context"

// Sync returns once this node has applied every entry committed before
// Sync was called: the leader confirms its commit index with a quorum
// (raft's ReadIndex, which a follower's raft asks of the leader), and
// this node waits until it has applied that far. After it, this node's
// own state (ReadLocal) includes every write acknowledged to anyone
// before the call — a compaction, say — though it is not otherwise a
// linearizable read: the state may have moved on again when the caller
// reads it. It costs a heartbeat round trip and the wait to apply.
//
// It fails at once with a *NotLeaderError when no leader is known, and
// otherwise as Read does when the round fails; ctx bounds the wait. A
// caller that can do with its own state then still may.
func (n *Node) Sync(ctx context.Context) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	if _, id := n.engine.leaderInfo(); id == "" {
		return n.notLeader()
	}
	idx, err := n.engine.readIndex(ctx)
	if err != nil {
		return err
	}
	return n.waitApplied(ctx, idx)
}
