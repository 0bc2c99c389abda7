package raftnode

import (
	"testing"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

func TestMemNetwork(t *testing.T) {
	noLeaks(t)
	mn := NewMemNetwork()
	a, b := mn.Transport("a"), mn.Transport("b")
	defer a.Close()
	defer b.Close()
	ra, rb := newRecorder(), newRecorder()
	a.SetPeer(2, "b")
	b.SetPeer(1, "a")
	// Sent before Start: they wait in the inbox.
	a.Send(appMsgs(1, 2, 0, 100))
	a.Start(ra)
	b.Start(rb)
	b.Send(appMsgs(2, 1, 0, 100))
	waitFor(t, "delivery both ways", func() bool { return len(ra.received()) == 100 && len(rb.received()) == 100 })
	checkInOrder(t, rb.received(), 1, 0, 100)
	checkInOrder(t, ra.received(), 2, 0, 100)

	mn.Disconnect("a", "b")
	a.Send(appMsgs(1, 2, 100, 1))
	b.Send(appMsgs(2, 1, 100, 1))
	if ra.unreachableCount(2) != 1 || rb.unreachableCount(1) != 1 {
		t.Errorf("unreachable reports while disconnected: got = %d and %d, expected: 1 and 1", ra.unreachableCount(2), rb.unreachableCount(1))
	}
	snap := raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Snapshot: &raftpb.Snapshot{Data: []byte("s")}}
	a.Send([]raftpb.Message{snap})
	if got := ra.snapshotReports(); len(got) != 1 || got[0] != (snapshotReport{2, etcdraft.SnapshotFailure}) {
		t.Errorf("snapshot reports while disconnected: got = %v, expected: [{2 SnapshotFailure}]", got)
	}

	mn.Connect("a", "b")
	a.Send(appMsgs(1, 2, 100, 10))
	a.Send([]raftpb.Message{snap})
	waitFor(t, "the snapshot to be reported finished", func() bool { return len(ra.snapshotReports()) == 2 })
	if got := ra.snapshotReports()[1]; got != (snapshotReport{2, etcdraft.SnapshotFinish}) {
		t.Errorf("snapshot report after Connect: got = %v, expected: {2 SnapshotFinish}", got)
	}
	got := rb.received()
	checkInOrder(t, got[100:110], 1, 100, 10)
	if len(got) != 111 || got[110].Type != raftpb.MsgSnap {
		t.Errorf("received %d messages after Connect, expected: 111, the snapshot last", len(got))
	}

	before := ra.unreachableCount(2)
	mn.Isolate("b")
	a.Send(appMsgs(1, 2, 110, 1))
	if got := ra.unreachableCount(2); got != before+1 {
		t.Errorf("unreachable reports after Isolate: got = %d, expected: %d", got, before+1)
	}
}

func TestMemNetworkAnswersANodeAtItsAddress(t *testing.T) {
	noLeaks(t)
	mn := NewMemNetwork()
	a, b := mn.Transport("a"), mn.Transport("b")
	defer a.Close()
	defer b.Close()
	ra, rb := newRecorder(), newRecorder()
	a.Start(ra)
	b.Start(rb)
	a.SetPeer(2, "b")
	a.Send(appMsgs(1, 2, 0, 1))
	waitFor(t, "the message to the node that knows nobody", func() bool { return len(rb.received()) == 1 })
	b.Send(appMsgs(2, 1, 0, 1))
	waitFor(t, "its answer", func() bool { return len(ra.received()) == 1 })
	b.RemovePeer(1)
	a.Send(appMsgs(1, 2, 1, 1))
	waitFor(t, "a message after RemovePeer", func() bool { return len(rb.received()) == 2 })
	b.Send(appMsgs(2, 1, 1, 1))
	if got := rb.unreachableCount(1); got != 1 {
		t.Errorf("unreachable reports after RemovePeer: got = %d, expected: 1, the address is not learned again", got)
	}
}

func TestMemNetworkKeepsCutsAcrossARestart(t *testing.T) {
	noLeaks(t)
	mn := NewMemNetwork()
	a := mn.Transport("a")
	defer a.Close()
	ra := newRecorder()
	a.Start(ra)
	a.SetPeer(2, "b")
	b := mn.Transport("b")
	mn.Disconnect("a", "b")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = mn.Transport("b")
	defer b.Close()
	rb := newRecorder()
	b.Start(rb)
	a.Send(appMsgs(1, 2, 0, 1))
	if got := ra.unreachableCount(2); got != 1 {
		t.Errorf("unreachable reports: got = %d, expected: 1, the link is still cut", got)
	}
	mn.Connect("a", "b")
	a.Send(appMsgs(1, 2, 0, 1))
	waitFor(t, "delivery after Connect", func() bool { return len(rb.received()) == 1 })
}
