package raftnode

// What the raft engine keeps across restarts, in the files the hashicorp
// engine used under DataDir/raft: the WAL in raft-wal segments (walStore,
// with its checksums, torn-tail and repair rules and the full-disk
// reserve), the hard state in the WAL's meta store, and the snapshot
// files of hashicorp/raft's file snapshot store, which carry a CRC64 and
// are renamed into place whole. Reusing them rather than etcd's wal
// package keeps every recovery rule the WAL already has and its tests,
// and makes an old data dir's snapshots readable as they are. What tells
// the two formats apart is the ENGINE file (convert.go).
//
// A WAL record's Data is the whole marshalled raftpb.Entry (its type
// included); its hashicorp Type is always LogCommand.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
	"go.etcd.io/raft/v3/raftpb"
)

// hardStateKey holds term and vote, which must be durable before a vote
// or an append is acknowledged. The commit index is not written on every
// change (that would be a second sync per commit); it is stored with term
// and vote and at snapshots, and a restarted node learns the rest from
// the leader, or, alone, commits its log again when it is elected.
var hardStateKey = []byte("etcdraft_hardstate")

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// raftID is the raft engine's uint64 ID for a Tenure node ID. It is a
// hash, so every node computes the same one without a registry; AddVoter
// and AddNonvoter refuse an ID whose hash another member already has.
func raftID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	if v := h.Sum64(); v != 0 {
		return v
	}
	return 1
}

// memberInfo is what the raft engine knows of a member beyond its raft
// ID: the Tenure node ID it hashes and its peer address.
type memberInfo struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// Held marks a learner that votes only once promoted (AddLearner):
	// it does not ask for its vote itself. Builds from before it ignore
	// it, and promote such a learner as any other.
	Held bool `json:"held,omitempty"`
}

// confContext is the Context of every configuration change the engine
// proposes (and of the bootstrap entries): the member it is about and
// the waiter of the proposal, 0 for none.
type confContext struct {
	memberInfo
	Req  uint64 `json:"req,omitempty"`
	From uint64 `json:"from,omitempty"` // the proposer's raft ID
}

// configuration is a configuration as the snapshot files record it: the
// hashicorp Configuration type, so that a snapshot of either engine reads
// the same way.
func configuration(cs raftpb.ConfState, members map[uint64]memberInfo) raft.Configuration {
	var c raft.Configuration
	add := func(ids []uint64, s raft.ServerSuffrage) {
		for _, id := range ids {
			m := members[id]
			suffrage := s
			if s == raft.Nonvoter && m.Held {
				// hashicorp's Staging "acts like a Nonvoter", which is
				// how builds from before Held read it.
				suffrage = raft.Staging
			}
			c.Servers = append(c.Servers, raft.Server{Suffrage: suffrage, ID: raft.ServerID(m.ID), Address: raft.ServerAddress(m.Addr)})
		}
	}
	add(cs.Voters, raft.Voter)
	add(cs.Learners, raft.Nonvoter)
	return c
}

// confState is the inverse of configuration.
func confState(c raft.Configuration) (raftpb.ConfState, map[uint64]memberInfo) {
	var cs raftpb.ConfState
	members := map[uint64]memberInfo{}
	for _, s := range c.Servers {
		id := raftID(string(s.ID))
		members[id] = memberInfo{ID: string(s.ID), Addr: string(s.Address), Held: s.Suffrage == raft.Staging}
		if s.Suffrage == raft.Voter {
			cs.Voters = append(cs.Voters, id)
		} else {
			cs.Learners = append(cs.Learners, id)
		}
	}
	return cs, members
}

// A snapshot travelling in a MsgSnap carries the members with the state:
// a 4-byte length, the members as JSON, then the state machine's
// snapshot (the applier's format). In the snapshot files the members are the
// Configuration instead.
func encodeSnapshotData(members map[uint64]memberInfo, state []byte) []byte {
	list := make([]memberInfo, 0, len(members))
	for _, m := range members {
		list = append(list, m)
	}
	slices.SortFunc(list, func(a, b memberInfo) int { return strings.Compare(a.ID, b.ID) })
	js, _ := json.Marshal(list) // strings only: cannot fail
	out := make([]byte, 4, 4+len(js)+len(state))
	binary.BigEndian.PutUint32(out, uint32(len(js)))
	out = append(out, js...)
	return append(out, state...)
}

func decodeSnapshotData(b []byte) (map[uint64]memberInfo, []byte, error) {
	if len(b) < 4 || int(binary.BigEndian.Uint32(b)) > len(b)-4 {
		return nil, nil, errors.New("raftnode: snapshot data too short for its members header")
	}
	n := binary.BigEndian.Uint32(b)
	var list []memberInfo
	if err := json.Unmarshal(b[4:4+n], &list); err != nil {
		return nil, nil, fmt.Errorf("raftnode: snapshot members: %w", err)
	}
	members := map[uint64]memberInfo{}
	for _, m := range list {
		members[raftID(m.ID)] = m
	}
	return members, b[4+n:], nil
}

// diskStorage writes what the raft engine must keep across restarts:
// the WAL, its meta store (the hard state) and the snapshot files.
// Only the Ready loop writes; snapshots are also written by the snapshot
// goroutine, and the stores are safe for that.
type diskStorage struct {
	wal       raft.LogStore
	meta      raft.StableStore
	snapshots raft.SnapshotStore
	log       *slog.Logger // may be nil
	// hs is the hard state last written, to skip writes that change
	// nothing durable.
	hs raftpb.HardState
}

// bootState is what a node restarts from.
type bootState struct {
	snap    raftpb.Snapshot // Data: encodeSnapshotData
	state   []byte          // the state machine snapshot, nil without one
	members map[uint64]memberInfo
	hs      raftpb.HardState
	ents    []raftpb.Entry
}

func (d *diskStorage) load() (bootState, error) {
	b := bootState{members: map[uint64]memberInfo{}}
	metas, err := d.snapshots.List()
	if err != nil {
		return b, fmt.Errorf("raftnode: list snapshots: %w", err)
	}
	for i, m := range metas { // newest first
		meta, state, err := d.readSnapshot(m.ID)
		if err != nil {
			if i+1 < len(metas) {
				// The file store keeps the one before; the log may still
				// reach back to it (checked below).
				if d.log != nil {
					d.log.Warn("raft: a snapshot is damaged; starting from the one before it", "snapshot", m.ID, "error", err, "previous", metas[i+1].ID)
				}
				continue
			}
			return b, err
		}
		cs, members := confState(meta.Configuration)
		b.state, b.members = state, members
		// No Data: raft's storage keeps a snapshot's metadata only.
		b.snap = raftpb.Snapshot{
			Metadata: raftpb.SnapshotMetadata{Index: meta.Index, Term: meta.Term, ConfState: cs},
		}
		break
	}
	if v, err := d.meta.Get(hardStateKey); err == nil && len(v) > 0 {
		if err := b.hs.Unmarshal(v); err != nil {
			return b, fmt.Errorf("raftnode: hard state: %w", err)
		}
	}
	first, err := d.wal.FirstIndex()
	if err != nil {
		return b, fmt.Errorf("raftnode: log: %w", err)
	}
	last, err := d.wal.LastIndex()
	if err != nil {
		return b, fmt.Errorf("raftnode: log: %w", err)
	}
	if after := b.snap.Metadata.Index + 1; first > after && len(metas) > 0 {
		return b, fmt.Errorf("raftnode: the newest snapshot is damaged and the one before it, at index %d, does not reach the log, which starts at %d: "+
			"the entries between are on no disk of this node; start it on a copy of a healthy member's data dir, or remove it and join it again", b.snap.Metadata.Index, first)
	}
	from := max(first, b.snap.Metadata.Index+1)
	for i := from; first > 0 && i <= last; i++ {
		var l raft.Log
		if err := d.wal.GetLog(i, &l); err != nil {
			return b, fmt.Errorf("raftnode: log entry %d: %w", i, err)
		}
		var e raftpb.Entry
		if err := e.Unmarshal(l.Data); err != nil {
			return b, fmt.Errorf("raftnode: log entry %d: %w", i, err)
		}
		b.ents = append(b.ents, e)
	}
	// A commit index from before a snapshot or beyond the log (which a
	// repair may have cut) would make raft apply what it cannot have.
	b.hs.Commit = max(b.hs.Commit, b.snap.Metadata.Index)
	if n := len(b.ents); n > 0 {
		b.hs.Commit = min(b.hs.Commit, b.ents[n-1].Index)
	} else {
		b.hs.Commit = min(b.hs.Commit, b.snap.Metadata.Index)
	}
	d.hs = b.hs
	return b, nil
}

// readSnapshot reads one snapshot whole; the store checks its CRC.
func (d *diskStorage) readSnapshot(id string) (*raft.SnapshotMeta, []byte, error) {
	meta, rc, err := d.snapshots.Open(id)
	if err != nil {
		return nil, nil, fmt.Errorf("raftnode: open snapshot %s: %w", id, err)
	}
	state, err := io.ReadAll(rc)
	if err = errors.Join(err, rc.Close()); err != nil {
		return nil, nil, fmt.Errorf("raftnode: read snapshot %s: %w", id, err)
	}
	return meta, state, nil
}

// snapshotData is the data of the snapshot file at index, as a MsgSnap
// carries it (encodeSnapshotData).
func (d *diskStorage) snapshotData(index uint64) ([]byte, error) {
	metas, err := d.snapshots.List()
	if err != nil {
		return nil, fmt.Errorf("raftnode: list snapshots: %w", err)
	}
	for _, m := range metas {
		if m.Index != index {
			continue
		}
		meta, state, err := d.readSnapshot(m.ID)
		if err != nil {
			return nil, err
		}
		_, members := confState(meta.Configuration)
		return encodeSnapshotData(members, state), nil
	}
	return nil, fmt.Errorf("raftnode: no snapshot file at index %d (yet)", index)
}

// saveHardState writes hs when term or vote changed; the commit index
// rides along. It is synced before the caller sends a vote.
func (d *diskStorage) saveHardState(hs raftpb.HardState) error {
	if hs.Term == d.hs.Term && hs.Vote == d.hs.Vote {
		return nil
	}
	b, err := hs.Marshal()
	if err != nil {
		return err
	}
	if err := d.meta.Set(hardStateKey, b); err != nil {
		return fmt.Errorf("raftnode: save hard state: %w", err)
	}
	afterLogSync()
	d.hs = hs
	return nil
}

// append writes ents after cutting any entries they replace: a follower
// whose tail conflicts with the leader's log.
func (d *diskStorage) append(ents []raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	last, err := d.wal.LastIndex()
	if err != nil {
		return err
	}
	if first := ents[0].Index; first <= last {
		if err := d.wal.DeleteRange(first, last); err != nil {
			return fmt.Errorf("raftnode: truncate log from %d: %w", first, err)
		}
	}
	logs := make([]*raft.Log, len(ents))
	for i := range ents {
		data, err := ents[i].Marshal()
		if err != nil {
			return err
		}
		logs[i] = &raft.Log{Index: ents[i].Index, Term: ents[i].Term, Type: raft.LogCommand, Data: data}
	}
	return d.wal.StoreLogs(logs)
}

// saveSnapshot writes a snapshot the node was sent and drops the log it
// replaces: all of it, since raft starts the log again after it.
func (d *diskStorage) saveSnapshot(snap raftpb.Snapshot) error {
	members, state, err := decodeSnapshotData(snap.Data)
	if err != nil {
		return err
	}
	return d.replaceLog(snap.Metadata, members, state)
}

// replaceLog writes a snapshot and drops the whole log.
func (d *diskStorage) replaceLog(meta raftpb.SnapshotMetadata, members map[uint64]memberInfo, state []byte) error {
	if err := d.writeSnapshot(meta, members, state); err != nil {
		return err
	}
	first, err := d.wal.FirstIndex()
	if err != nil {
		return err
	}
	last, err := d.wal.LastIndex()
	if err != nil {
		return err
	}
	if first > 0 {
		if err := d.wal.DeleteRange(first, last); err != nil {
			return fmt.Errorf("raftnode: drop the log a snapshot replaces: %w", err)
		}
	}
	return nil
}

func (d *diskStorage) writeSnapshot(meta raftpb.SnapshotMetadata, members map[uint64]memberInfo, state ...[]byte) error {
	sink, err := d.snapshots.Create(raft.SnapshotVersionMax, meta.Index, meta.Term, configuration(meta.ConfState, members), meta.Index, peerEncoder{})
	if err != nil {
		return fmt.Errorf("raftnode: create snapshot: %w", err)
	}
	for _, b := range state {
		if _, err := sink.Write(b); err != nil {
			sink.Cancel()
			return fmt.Errorf("raftnode: write snapshot: %w", err)
		}
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("raftnode: write snapshot: %w", err)
	}
	return nil
}

// compact drops log entries up to index, which a snapshot covers.
func (d *diskStorage) compact(index uint64) error {
	first, err := d.wal.FirstIndex()
	if err != nil || first == 0 || first > index {
		return err
	}
	return d.wal.DeleteRange(first, index)
}

// peerEncoder satisfies the one Transport method the snapshot files' store
// calls, to fill a legacy peers field nobody reads; the rest of
// raft.Transport is never used and stays nil.
type peerEncoder struct{ raft.Transport }

func (peerEncoder) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte { return []byte(addr) }
