package sim

// The simulated disk: one node's log journal, meta store and snapshot,
// with the page cache made explicit. A write lands in pending and is
// durable only once a sync succeeds; a crash throws pending away and may
// leave the first pending record half written (torn). Synced records can
// still be damaged afterwards (a flipped bit, a write the device lost),
// which only shows when the node next reads its log at start.
//
// The journal mirrors the shape raftnode's WAL has (raft-wal segments
// behind verifyingFiler, raftnode/walcheck.go): batches appended in
// order, each with a checksum and a sequence number, replayed at start,
// where a later batch that starts at or below the end of the log cuts
// the tail first (raft's log matching). The rule applied to what the
// replay finds is raftnode's, mirrored in (*disk).load.

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is one appended batch of entries. declLen is the length its
// header announces: a torn record has fewer bytes than that, which is
// how a torn write is told from damage (raftnode tells them apart by
// shape too: a torn batch stops short, damage has the length but not
// the checksum).
type record struct {
	seq         uint64
	first, last uint64 // the entries' index range, from the header
	data        []byte
	declLen     int
	sum         uint32
}

func (r record) intact() bool {
	return len(r.data) == r.declLen && r.sum == recordSum(r.seq, r.first, r.last, r.data)
}

func recordSum(seq, first, last uint64, data []byte) uint32 {
	var h [24]byte
	binary.BigEndian.PutUint64(h[:], seq)
	binary.BigEndian.PutUint64(h[8:], first)
	binary.BigEndian.PutUint64(h[16:], last)
	return crc32.Update(crc32.Checksum(h[:], castagnoli), castagnoli, data)
}

func encodeEntries(ents []raftpb.Entry) []byte {
	var b []byte
	for i := range ents {
		d, err := ents[i].Marshal()
		if err != nil {
			panic(err)
		}
		b = binary.AppendUvarint(b, uint64(len(d)))
		b = append(b, d...)
	}
	return b
}

func decodeEntries(b []byte) ([]raftpb.Entry, error) {
	var ents []raftpb.Entry
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, fmt.Errorf("short entry")
		}
		var e raftpb.Entry
		if err := e.Unmarshal(b[k : k+int(n)]); err != nil {
			return nil, err
		}
		ents = append(ents, e)
		b = b[k+int(n):]
	}
	return ents, nil
}

// disk is one node's storage. Nothing here is lost when the node
// crashes but pending and metaPending.
type disk struct {
	journal []record // durable, in order
	pending []record // written, not yet synced
	nextSeq uint64

	hardState        raftpb.HardState // durable
	pendingHardState *raftpb.HardState

	// meta holds what raftnode keeps in its meta store beside the hard
	// state and writes synchronously: the catch-up index and the member
	// count (raftnode/catchup.go catchUpKey, membersKey).
	catchUp uint64
	// catchUpTerm is the catch-up point's term: the durable hard state's
	// at the repair, raised by a heartbeat's term (raftnode/stores.go,
	// catchup.go catchUpTermKey).
	catchUpTerm uint64
	members     uint64

	snap    raftpb.Snapshot // durable; written whole and synced (raftnode/snapshot.go)
	snapSeq uint64          // the sequence number of the last record the snapshot replaced
}

// empty reports whether nothing was ever made durable: a node that was
// never started, or whose data was wiped.
func (d *disk) empty() bool {
	return len(d.journal) == 0 && etcdraft.IsEmptyHardState(d.hardState) && etcdraft.IsEmptySnap(d.snap)
}

func (d *disk) appendEntries(ents []raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	data := encodeEntries(ents)
	d.nextSeq++
	first, last := ents[0].Index, ents[len(ents)-1].Index
	d.pending = append(d.pending, record{seq: d.nextSeq, first: first, last: last, data: data, declLen: len(data), sum: recordSum(d.nextSeq, first, last, data)})
}

func (d *disk) setHardState(hs raftpb.HardState) { d.pendingHardState = &hs }

// sync makes pending writes durable.
func (d *disk) sync() {
	d.journal = append(d.journal, d.pending...)
	d.pending = nil
	if d.pendingHardState != nil {
		d.hardState = *d.pendingHardState
		d.pendingHardState = nil
	}
}

// dropPending is what a failed fsync may leave: the kernel dropped the
// dirty pages it could not write (the "fsyncgate" behaviour of Linux), so
// a retry must write everything again, as raftnode's persist does.
func (d *disk) dropPending() {
	d.pending = nil
	d.pendingHardState = nil
	d.nextSeq = d.lastSeq()
}

func (d *disk) lastSeq() uint64 {
	if n := len(d.journal); n > 0 {
		return d.journal[n-1].seq
	}
	return d.snapSeq
}

// crash loses every unsynced write; with tear, the first pending record
// reaches the disk half written.
func (d *disk) crash(tear bool, cut int) {
	if tear && len(d.pending) > 0 {
		r := d.pending[0]
		r.data = slices.Clone(r.data[:min(cut, len(r.data)-1)])
		d.journal = append(d.journal, r)
	}
	d.dropPending()
}

// saveSnapshot stores a snapshot durably and drops the journal's prefix
// of records it covers whole, as raftnode compacts its WAL after a
// snapshot. Only a prefix: a later record may have cut an earlier one's
// tail, and dropping it would bring that tail back. snapSeq remembers
// the last dropped sequence number, so that the check at load still sees
// a gapless journal.
func (d *disk) saveSnapshot(s raftpb.Snapshot) {
	d.snap = s
	n := 0
	for n < len(d.journal) && d.journal[n].last <= s.Metadata.Index && d.journal[n].intact() {
		n++
	}
	if n > 0 {
		d.snapSeq = d.journal[n-1].seq
		d.journal = slices.Clone(d.journal[n:])
	}
}

// loaded is what a node restarts from.
type loaded struct {
	snap    raftpb.Snapshot
	hs      raftpb.HardState
	ents    []raftpb.Entry
	damaged bool   // damage was found (and cut off, unless refused)
	owed    uint64 // the highest index the cut removed
	refused string // non-empty: the node must not start, and why
}

// load replays the disk as raftnode's open does (stores.go openDiskWAL,
// storage.go load): a torn last record is dropped silently, since
// nothing in it was acknowledged; any other record that fails its
// checksum, or a gap in the sequence numbers, is damage to synced data.
// A node with fewer than two members refuses to start on damage; a
// member cuts the journal at the damage and owes the entries it cut
// (catch-up index, raftnode/catchup.go). skipRepair is the test-only
// knob that cuts without recording what is owed.
func (d *disk) load(skipRepair bool) loaded {
	l := loaded{snap: d.snap, hs: d.hardState}
	var ents []raftpb.Entry
	expect := d.snapSeq + 1
	cutAt := -1
	for i, r := range d.journal {
		if len(r.data) != r.declLen && i == len(d.journal)-1 {
			// A torn write: cleared, as if never written.
			d.journal = d.journal[:i]
			break
		}
		if !r.intact() || r.seq != expect {
			cutAt = i
			break
		}
		expect++
		batch, err := decodeEntries(r.data)
		if err != nil {
			cutAt = i
			break
		}
		ents = appendReplay(ents, r.first, batch)
	}
	if cutAt >= 0 {
		l.damaged = true
		if d.members < 2 {
			l.refused = fmt.Sprintf("log damaged at record %d and the node has %d member(s): refusing to start", cutAt, d.members)
			return l
		}
		// What the cut records did to the log's tail stands: raft-wal
		// keeps a truncation in its meta store, apart from the segment
		// that holds the new entries, so cutting those entries must not
		// bring back the ones they replaced. Record headers (index range)
		// stand for that meta: damage hits the data only.
		owed := uint64(0)
		if n := len(ents); n > 0 {
			owed = ents[n-1].Index
		}
		for _, r := range d.journal[cutAt:] {
			owed = max(owed, r.last)
			for len(ents) > 0 && ents[len(ents)-1].Index >= r.first {
				ents = ents[:len(ents)-1]
			}
		}
		d.journal = d.journal[:cutAt]
		d.nextSeq = d.lastSeq()
		// The repair's own truncation is durable too (raftnode's
		// repairWAL deletes the range through the WAL): a marker record
		// that cuts the replayed log back to where the repair left it.
		end := d.snap.Metadata.Index
		if n := len(ents); n > 0 {
			end = ents[n-1].Index
		}
		d.nextSeq++
		d.journal = append(d.journal, record{seq: d.nextSeq, first: end + 1, last: end, sum: recordSum(d.nextSeq, end+1, end, nil)})
		l.owed = owed
		if !skipRepair && owed > d.catchUp {
			d.catchUp = owed
			d.catchUpTerm = max(d.catchUpTerm, d.hardState.Term)
		}
	}
	d.nextSeq = d.lastSeq()
	si := l.snap.Metadata.Index
	for len(ents) > 0 && ents[0].Index <= si {
		ents = ents[1:]
	}
	l.ents = ents
	// raftnode/storage.go: a commit index from before a snapshot or
	// beyond the log (which a repair may have cut) is clamped.
	l.hs.Commit = max(l.hs.Commit, si)
	if n := len(ents); n > 0 {
		l.hs.Commit = min(l.hs.Commit, ents[n-1].Index)
	} else {
		l.hs.Commit = min(l.hs.Commit, si)
	}
	return l
}

// appendReplay applies one record to the replayed log as a WAL replay
// does: the log is first cut back to before the record's first index
// (raft's log matching, or a repair's marker), then the batch appended.
func appendReplay(ents []raftpb.Entry, first uint64, batch []raftpb.Entry) []raftpb.Entry {
	for len(ents) > 0 && ents[len(ents)-1].Index >= first {
		ents = ents[:len(ents)-1]
	}
	return append(ents, batch...)
}
