package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// The order of a Ready's work, on its own: the engine's tests and the
// simulator show both drivers keep it; these pin each step's place.

// readyTrace records every effect a ReadyCore has, in order.
type readyTrace struct {
	events  []string
	failLog error // the Log's writes fail with it while set
}

func (r *readyTrace) add(format string, args ...any) {
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *readyTrace) fx() ReadyEffects {
	return ReadyEffects{
		Log: traceLog{r}, Raft: traceRaft{r}, Send: traceSend{r}, Apply: traceApply{r}, Host: traceHost{r},
		Advance: func(etcdraft.Ready) bool { r.add("advance"); return true },
	}
}

type traceLog struct{ r *readyTrace }

func (l traceLog) SaveSnapshot(s raftpb.Snapshot) error {
	l.r.add("log snapshot %d", s.Metadata.Index)
	return l.r.failLog
}

func (l traceLog) SaveHardState(hs raftpb.HardState) error {
	l.r.add("log hard state term %d", hs.Term)
	return l.r.failLog
}

func (l traceLog) Append(ents []raftpb.Entry) error {
	l.r.add("log %d entries", len(ents))
	return l.r.failLog
}

type traceRaft struct{ r *readyTrace }

func (m traceRaft) ApplySnapshot(s raftpb.Snapshot) error {
	m.r.add("raft snapshot %d", s.Metadata.Index)
	return nil
}

func (m traceRaft) Append(ents []raftpb.Entry) error {
	m.r.add("raft %d entries", len(ents))
	return nil
}

func (m traceRaft) SetHardState(hs raftpb.HardState) error {
	m.r.add("raft hard state term %d", hs.Term)
	return nil
}

type traceSend struct{ r *readyTrace }

func (s traceSend) Send(msgs []raftpb.Message) {
	for _, m := range msgs {
		s.r.add("send %s", m.Type)
	}
}

type traceApply struct{ r *readyTrace }

func (a traceApply) Apply(b ApplyBatch) bool {
	snap := uint64(0)
	if b.Snapshot != nil {
		snap = b.Snapshot.Metadata.Index
	}
	a.r.add("apply snapshot %d, %d entries, term %d, step down %v, durable %v", snap, len(b.Entries), b.Term, b.StepDown, b.Durable)
	return true
}

func (a traceApply) Persisted() { a.r.add("persisted") }

type traceHost struct{ r *readyTrace }

func (h traceHost) SetRole(role etcdraft.StateType, lead uint64) bool {
	h.r.add("role %s lead %d", role, lead)
	return role != etcdraft.StateLeader
}
func (h traceHost) HardState(hs raftpb.HardState)    { h.r.add("hard state term %d", hs.Term) }
func (h traceHost) ReadIndex(req, index uint64)      { h.r.add("read %d at %d", req, index) }
func (h traceHost) FailReads()                       { h.r.add("fail reads") }
func (h traceHost) FailProposals()                   { h.r.add("fail proposals") }
func (h traceHost) WriteFailed(_ error, attempt int) { h.r.add("write failed %d", attempt) }
func (h traceHost) Resumed()                         { h.r.add("resumed") }

func (r *readyTrace) expect(t *testing.T, want ...string) {
	t.Helper()
	if !slices.Equal(r.events, want) {
		t.Fatalf("got = %q, expected: %q", r.events, want)
	}
	r.events = nil
}

func TestAReadysWorkInOrder(t *testing.T) {
	r := &readyTrace{}
	c := NewReadyCore(r.fx(), 1)
	ctx := binary.BigEndian.AppendUint64(nil, 9)
	rd := etcdraft.Ready{
		SoftState:        &etcdraft.SoftState{RaftState: etcdraft.StateFollower, Lead: 2},
		HardState:        raftpb.HardState{Term: 2, Vote: 2, Commit: 3},
		Entries:          []raftpb.Entry{{Index: 4, Term: 2}},
		CommittedEntries: []raftpb.Entry{{Index: 3, Term: 1}},
		Messages:         []raftpb.Message{{Type: raftpb.MsgAppResp}, {Type: raftpb.MsgHeartbeat}},
		ReadStates:       []etcdraft.ReadState{{Index: 3, RequestCtx: ctx}},
	}
	if !c.Begin(rd) {
		t.Fatal("got = Begin stopping, expected: going on")
	}
	// Committed entries go to apply before the write; the acknowledgement
	// waits for it.
	r.expect(t,
		"role StateFollower lead 2", "hard state term 2", "send MsgHeartbeat",
		"apply snapshot 0, 1 entries, term 2, step down true, durable false")
	if err := c.Write(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "log hard state term 2", "log 1 entries")
	if err := c.Synced(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "raft 1 entries", "raft hard state term 2", "persisted", "send MsgAppResp")
	if !c.Advance() {
		t.Fatal("got = Advance stopping, expected: going on")
	}
	r.expect(t, "read 9 at 3", "fail reads", "advance")
}

func TestAFailedWriteIsRetriedWholeAndAcknowledgesNothing(t *testing.T) {
	r := &readyTrace{failLog: errors.New("disk full")}
	c := NewReadyCore(r.fx(), 2)
	rd := etcdraft.Ready{
		HardState: raftpb.HardState{Term: 2, Vote: 3},
		Entries:   []raftpb.Entry{{Index: 1, Term: 2}},
		Messages:  []raftpb.Message{{Type: raftpb.MsgVoteResp}},
	}
	c.Begin(rd)
	r.expect(t, "hard state term 2")
	for attempt := range 2 {
		if err := c.Write(); err == nil {
			t.Fatal("got = the write done, expected: it fails")
		} else {
			c.Failed(err)
		}
		if attempt == 0 {
			// The first failure: no one leads here, what is in flight fails.
			r.expect(t, "log hard state term 2", "role StateFollower lead 0", "fail proposals", "fail reads", "write failed 0")
		} else {
			r.expect(t, "log hard state term 2", "write failed 1")
		}
	}
	r.failLog = nil
	if err := c.Write(); err != nil {
		t.Fatal(err)
	}
	if err := c.Synced(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "log hard state term 2", "log 1 entries", "raft 1 entries", "raft hard state term 2", "resumed", "persisted", "send MsgVoteResp")
}

func TestASnapshotIsAppliedOnlyOnceWritten(t *testing.T) {
	r := &readyTrace{}
	c := NewReadyCore(r.fx(), 3)
	snap := raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 50, Term: 3}}
	c.Begin(etcdraft.Ready{Snapshot: snap, CommittedEntries: []raftpb.Entry{{Index: 51, Term: 3}}})
	r.expect(t) // nothing to send, and apply waits for the write
	if err := c.Write(); err != nil {
		t.Fatal(err)
	}
	if err := c.Synced(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "log snapshot 50", "log 0 entries", "raft snapshot 50", "raft 0 entries", "persisted",
		"apply snapshot 50, 1 entries, term 0, step down false, durable true")
	c.Advance()
	r.expect(t, "advance")
}

// An applier that refuses a snapshot stops the node: Synced says so.
func TestStoppingWhileASnapshotWaits(t *testing.T) {
	r := &readyTrace{}
	fx := r.fx()
	fx.Apply = refusingApply{}
	c := NewReadyCore(fx, 3)
	c.Begin(etcdraft.Ready{Snapshot: raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 50, Term: 3}}})
	if err := c.Write(); err != nil {
		t.Fatal(err)
	}
	if err := c.Synced(); !IsStopping(err) {
		t.Fatalf("got = %v, expected: stopping", err)
	}
}

type refusingApply struct{}

func (refusingApply) Apply(ApplyBatch) bool { return false }
func (refusingApply) Persisted()            {}

// ApplyEntries skips what the state reflects, answers only this node's
// proposals and barriers, and leaves raft's empty entry alone.
func TestApplyEntriesAnswersOnlyItsOwn(t *testing.T) {
	a := &traceEntries{}
	ents := []raftpb.Entry{
		{Index: 4, Data: FrameProposal(1, 10, []byte("covered"))},
		{Index: 5},
		{Index: 6, Data: FrameProposal(1, 11, []byte("mine"))},
		{Index: 7, Data: FrameProposal(2, 12, []byte("theirs"))},
		{Index: 8, Data: FrameProposal(1, 13, nil)},
		{Index: 9, Type: raftpb.EntryConfChangeV2},
	}
	ApplyEntries(ents, 4, 1, a)
	want := []string{
		"applied 5",
		"command 6 mine", "answer 11 at 6", "applied 6",
		"command 7 theirs", "applied 7",
		"answer 13 at 8", "applied 8",
		"conf 9", "applied 9",
	}
	if !slices.Equal(a.events, want) {
		t.Fatalf("got = %q, expected: %q", a.events, want)
	}
}

type traceEntries struct{ events []string }

func (a *traceEntries) Command(ent raftpb.Entry, cmd []byte) statemachine.Result {
	a.events = append(a.events, fmt.Sprintf("command %d %s", ent.Index, cmd))
	return statemachine.Result{}
}

func (a *traceEntries) Answer(req uint64, ent raftpb.Entry, _ statemachine.Result) {
	a.events = append(a.events, fmt.Sprintf("answer %d at %d", req, ent.Index))
}

func (a *traceEntries) ConfChange(ent raftpb.Entry) {
	a.events = append(a.events, fmt.Sprintf("conf %d", ent.Index))
}

func (a *traceEntries) Applied(ent raftpb.Entry, _ statemachine.Result) {
	a.events = append(a.events, fmt.Sprintf("applied %d", ent.Index))
}
