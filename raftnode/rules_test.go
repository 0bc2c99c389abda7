package raftnode

import (
	"bytes"
	"slices"
	"testing"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// The decisions the engine and internal/sim share, on their own: the
// cluster tests show the engine keeps them; these pin each rule's edges.

func TestAProposalReadsBackAsFramed(t *testing.T) {
	data := FrameProposal(7, 42, []byte("cmd"))
	from, req, cmd, ok := ParseProposal(data)
	if !ok || from != 7 || req != 42 || !bytes.Equal(cmd, []byte("cmd")) {
		t.Fatalf("got = (%d, %d, %q, %v), expected: (7, 42, \"cmd\", true)", from, req, cmd, ok)
	}
	if _, _, cmd, ok := ParseProposal(FrameProposal(7, 43, nil)); !ok || len(cmd) != 0 {
		t.Fatalf("got = a barrier read as (%q, %v), expected: no command, framed", cmd, ok)
	}
	if _, _, _, ok := ParseProposal(nil); ok {
		t.Fatal("got = raft's empty entry read as a proposal, expected: not one")
	}
}

func TestOnlyWhatPromisesAWriteWaitsForIt(t *testing.T) {
	msgs := []raftpb.Message{
		{Type: raftpb.MsgApp, To: 2}, {Type: raftpb.MsgAppResp, To: 1}, {Type: raftpb.MsgVoteResp, To: 3},
		{Type: raftpb.MsgHeartbeat, To: 3}, {Type: raftpb.MsgPreVoteResp, To: 2}, {Type: raftpb.MsgVote, To: 2},
	}
	now, later := SplitMessages(msgs)
	types := func(ms []raftpb.Message) (ts []raftpb.MessageType) {
		for _, m := range ms {
			ts = append(ts, m.Type)
		}
		return ts
	}
	wantNow := []raftpb.MessageType{raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgVote}
	wantLater := []raftpb.MessageType{raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp}
	if got := types(now); !slices.Equal(got, wantNow) {
		t.Fatalf("got = %v sent at once, expected: %v", got, wantNow)
	}
	if got := types(later); !slices.Equal(got, wantLater) {
		t.Fatalf("got = %v held for the sync, expected: %v", got, wantLater)
	}
}

func TestTheCatchUpRule(t *testing.T) {
	point := CatchUp{Index: 20, Term: 3}
	const last = 12 // where the cut log ends
	cases := []struct {
		name     string
		c        CatchUp
		m        raftpb.Message
		drop     bool
		commit   uint64 // the stepped message's
		handOver bool
		next     CatchUp
	}{
		{"a vote for a log short of the point is refused", point, raftpb.Message{Type: raftpb.MsgVote, LogTerm: 3, Index: 19}, true, 0, false, point},
		{"a pre-vote from an older term's log is refused", point, raftpb.Message{Type: raftpb.MsgPreVote, LogTerm: 2, Index: 99}, true, 0, false, point},
		{"a vote for a log reaching the point is stepped", point, raftpb.Message{Type: raftpb.MsgVote, LogTerm: 3, Index: 20}, false, 0, false, point},
		{"without a term every vote is refused", CatchUp{Index: 20}, raftpb.Message{Type: raftpb.MsgVote, LogTerm: 9, Index: 99}, true, 0, false, CatchUp{Index: 20}},
		{"a transfer to the member is dropped", point, raftpb.Message{Type: raftpb.MsgTimeoutNow}, true, 0, false, point},
		{"a heartbeat past the log is stepped cut, and asks for a hand-over", point, raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 4, Commit: 15}, false, last, true, point},
		{"a heartbeat past the point raises it", point, raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 5, Commit: 25}, false, last, true, CatchUp{Index: 25, Term: 5}},
		{"a heartbeat within the log, short of the point, changes nothing", point, raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 4, Commit: 10}, false, 10, false, point},
		{"a heartbeat at the log's end, short of the point, asks for a hand-over", point, raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 3, Commit: last}, false, last, true, point},
		{"a member that owes nothing steps everything", CatchUp{}, raftpb.Message{Type: raftpb.MsgTimeoutNow}, false, 0, false, CatchUp{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.c.Receive(tc.m, last, 0)
			if s.Drop != tc.drop || s.Msg.Commit != tc.commit || s.HandOver != tc.handOver || s.Next != tc.next {
				t.Fatalf("got = drop %v, commit %d, hand-over %v, next %+v; expected: %v, %d, %v, %+v",
					s.Drop, s.Msg.Commit, s.HandOver, s.Next, tc.drop, tc.commit, tc.handOver, tc.next)
			}
		})
	}
	// Caught up: the log reaches the point and the leader's commit is within it.
	if s := point.Receive(raftpb.Message{Type: raftpb.MsgHeartbeat, Commit: 20}, 20, 0); s.Next.Owes() || s.Drop {
		t.Fatalf("got = %+v once the log reaches the point, expected: stepped, nothing owed", s)
	}
	// Caught up short of the point: the log ends in a later term's entry,
	// a leader's log, with every entry committed in the point's term and
	// before (a repair that owes a bound, not a count, ends this way).
	if s := point.Receive(raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 4, Commit: 15}, 15, 4); s.Next.Owes() || s.Drop {
		t.Fatalf("got = %+v with the log ending in a term-4 entry, expected: stepped, nothing owed", s)
	}
	// Not by the point's own term, nor without a term, nor past the log.
	for _, tc := range []struct {
		c              CatchUp
		commit, lastTm uint64
	}{{point, 15, 3}, {CatchUp{Index: 20}, 15, 9}, {point, 16, 4}} {
		if s := tc.c.Receive(raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 4, Commit: tc.commit}, 15, tc.lastTm); !s.Next.Owes() {
			t.Fatalf("got = caught up at %+v, commit %d, last term %d, expected: still owing", tc.c, tc.commit, tc.lastTm)
		}
	}
}

func TestARepairOwesWhatItCutOnlyWithOthersToCatchUpFrom(t *testing.T) {
	if CutDamage(1, false) || !CutDamage(2, false) || !CutDamage(1, true) {
		t.Fatal("got = the wrong choice between refusing and cutting, expected: refuse alone without RepairLog, cut otherwise")
	}
	had := CatchUp{Index: 10, Term: 4}
	for _, tc := range []struct {
		owed, members, hsTerm uint64
		want                  CatchUp
		record                bool
	}{
		{owed: 15, members: 3, hsTerm: 3, want: CatchUp{Index: 15, Term: 4}, record: true},
		{owed: 15, members: 3, hsTerm: 6, want: CatchUp{Index: 15, Term: 6}, record: true},
		{owed: 8, members: 3, hsTerm: 6, want: had},
		{owed: 15, members: 1, hsTerm: 6, want: had},
		{owed: 0, members: 3, hsTerm: 6, want: had},
	} {
		if got, record := CatchUpAfterCut(had, tc.owed, tc.members, tc.hsTerm); got != tc.want || record != tc.record {
			t.Fatalf("owed %d, members %d, hard state term %d: got = (%+v, %v), expected: (%+v, %v)", tc.owed, tc.members, tc.hsTerm, got, record, tc.want, tc.record)
		}
	}
	if !had.EndsAlone(12, 12, 1) || had.EndsAlone(11, 12, 1) || had.EndsAlone(12, 12, 2) || (CatchUp{}).EndsAlone(12, 12, 1) {
		t.Fatal("got = the wrong end of the wait alone, expected: only owing, alone, and with the whole log applied")
	}
}

func TestTheHandOverGoesToTheMostUpToDateOtherVoter(t *testing.T) {
	st := etcdraft.Status{BasicStatus: etcdraft.BasicStatus{ID: 1}, Progress: map[uint64]tracker.Progress{
		1: {Match: 50}, 2: {Match: 30}, 3: {Match: 40}, 4: {Match: 40}, 5: {Match: 49, IsLearner: true}, 6: {Match: 45},
	}}
	if got := HandOverTarget(st, 6); got != 3 {
		t.Fatalf("got = %d, expected: 3 (40 like 4, and a lower ID; not the leader, the asker or the learner)", got)
	}
	st.Progress = map[uint64]tracker.Progress{1: {Match: 50}, 2: {Match: 50}}
	if got := HandOverTarget(st, 2); got != 0 {
		t.Fatalf("got = %d with no other voter, expected: 0", got)
	}
	h := NewHandOvers(time.Second)
	t0 := time.Unix(100, 0)
	if !h.Admit(t0) || h.Admit(t0.Add(1999*time.Millisecond)) || !h.Admit(t0.Add(2*time.Second)) {
		t.Fatal("got = hand-overs admitted at the wrong times, expected: one per twice the election timeout")
	}
}
