package sim

// The simulated disk: the files raftnode's own disk storage keeps its
// state in (raftnode.DiskFiles), in the simulator's memory. raft-wal's
// segments live in diskFS, its meta store (segment list, hard state,
// raftnode's catch-up point and member count) in diskMeta, and the
// snapshots in hashicorp/raft's in-memory store, written whole and at
// once as raftnode writes and syncs its snapshot files. What runs over
// them is the product: raft-wal, walcheck.go's verifying reader, the
// repair and the catch-up rule's records (raftnode.OpenDisk).
//
// The page cache is explicit. Every file has what the medium holds and
// what reads see; a write changes the second at once and is queued as
// in flight. Outside a Ready's write (the open, its repair, a snapshot's
// compaction) a Sync makes what is in flight durable at once, as a
// meta store write does. Within one, nothing is durable until the
// simulator's sync event (synced): a Sync only marks where the write's
// syncs fall, and a meta store write is queued too. A crash before the
// event keeps a prefix of the write's synced steps, in order (raft-wal
// syncs a batch before it records the segment it sealed), tears the
// step it stopped in at 512-byte sectors landing in any order, and
// loses the rest. A failed fsync drops the pages it was to write and
// fails the Sync, as Linux does: raft-wal then rolls its writer back
// and raftnode writes the whole Ready again later.

import (
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/raftnode"
)

// segmentSize is raft-wal's segment size in the simulation: small, so
// that a 30 s run seals, rotates and deletes segments as a long-lived
// node does, and the damage faults, kept off the newest segment by
// default, have sealed ones to hit (with 64 KiB a run's log seldom
// left its first segment: a tenth of the bit flips and misdirected
// writes).
const segmentSize = 8 << 10

// sectorSize is the unit a crash writes whole or not at all.
const sectorSize = 512

// disk is one node's storage. Only what a crash keeps is here when the
// node restarts; the raftnode.Disk over it is opened again.
type disk struct {
	fs    *diskFS
	meta  *diskMeta
	snaps *raft.InmemSnapshotStore

	// inReady: a Ready's write is being made; its syncs and meta
	// writes wait for the sync event.
	inReady bool
	// flight is what was written and is not durable yet, in order.
	flight []step
	// failSync makes the next Sync in a Ready's write fail.
	failSync bool
}

// step is one thing in flight: a write to a file, a Sync, or a meta
// store transaction (which the meta store makes durable whole, alone).
type step struct {
	path string // a write
	off  int64
	data []byte
	sync bool
	meta func(*metaState)
}

func newDisk() *disk {
	d := &disk{snaps: raft.NewInmemSnapshotStore()}
	d.fs = &diskFS{d: d, files: map[string]*file{}}
	d.meta = &diskMeta{d: d, durable: newMetaState(), view: newMetaState()}
	return d
}

// files are the files raftnode opens its disk storage over.
func (d *disk) files() raftnode.DiskFiles {
	return raftnode.DiskFiles{WAL: d.fs, Meta: func() types.MetaStore { return d.meta }, Snapshots: d.snaps}
}

// empty reports whether nothing was ever made durable: a node never
// started, or whose data was wiped.
func (d *disk) empty() bool {
	metas, _ := d.snaps.List()
	return len(d.fs.files) == 0 && len(d.meta.durable.stable) == 0 && len(metas) == 0
}

// sync is the sync event: everything in flight is durable.
func (d *disk) sync() {
	for _, s := range d.flight {
		d.land(s, nil)
	}
	d.flight = nil
}

// land makes one step durable, or with keep only the sectors keep
// picks.
func (d *disk) land(s step, keep func() bool) {
	switch {
	case s.meta != nil:
		s.meta(&d.meta.durable)
	case s.path != "":
		f := d.fs.files[s.path]
		if f == nil {
			return // deleted since
		}
		if keep == nil {
			f.durable = writeAt(f.durable, s.data, s.off)
			f.extents = append(f.extents, extent{s.off, s.off + int64(len(s.data))})
			return
		}
		for lo := s.off; lo < s.off+int64(len(s.data)); {
			hi := min((lo/sectorSize+1)*sectorSize, s.off+int64(len(s.data)))
			if keep() {
				f.durable = writeAt(f.durable, s.data[lo-s.off:hi-s.off], lo)
			}
			lo = hi
		}
	}
}

// crash loses what is in flight but a prefix of its synced steps; with
// tear, the sectors of the step it stopped in land at random. It reports
// how many steps were in flight and whether any was torn.
func (d *disk) crash(rng *rand.Rand, tear bool) (inFlight int, torn bool) {
	inFlight = len(d.flight)
	// The steps' ends: after each Sync and each meta transaction.
	var ends []int
	for i, s := range d.flight {
		if s.sync || s.meta != nil {
			ends = append(ends, i+1)
		}
	}
	kept := 0
	if k := rng.IntN(len(ends) + 1); k > 0 {
		kept = ends[k-1]
	}
	for _, s := range d.flight[:kept] {
		d.land(s, nil)
	}
	if tear {
		for _, s := range d.flight[kept:] {
			if s.sync || s.meta != nil {
				break // the step the crash stopped in ends here
			}
			if s.path != "" {
				torn = true
				d.land(s, func() bool { return rng.IntN(2) == 0 })
			}
		}
	}
	d.flight = nil
	d.inReady, d.failSync = false, false
	d.fs.gen++
	for _, f := range d.fs.files {
		f.view = slices.Clone(f.durable)
	}
	d.meta.view = d.meta.durable.clone()
	return inFlight, torn
}

// failedSync drops the writes since the last Sync, which the failed one
// was to make durable, from the page cache.
func (d *disk) failedSync() {
	i := len(d.flight)
	for i > 0 && d.flight[i-1].path != "" {
		i--
	}
	dropped := d.flight[i:]
	d.flight = d.flight[:i]
	for _, s := range dropped {
		f := d.fs.files[s.path]
		if f == nil {
			continue
		}
		f.view = slices.Clone(f.durable)
		for _, k := range d.flight {
			if k.path == s.path {
				f.view = writeAt(f.view, k.data, k.off)
			}
		}
	}
}

// writeAt writes p into b at off, growing b with zeros as needed.
func writeAt(b, p []byte, off int64) []byte {
	if end := off + int64(len(p)); end > int64(len(b)) {
		b = append(b, make([]byte, end-int64(len(b)))...)
	}
	copy(b[off:], p)
	return b
}

// file is one segment file: what the medium holds, what reads see, and
// where synced writes landed (for the damage faults).
type file struct {
	durable, view []byte
	extents       []extent
}

type extent struct{ lo, hi int64 }

// diskFS is raftnode.WALFS over the disk's files.
type diskFS struct {
	d     *disk
	files map[string]*file
	// gen counts crashes: a handle from before one writes nothing.
	gen int
}

var _ raftnode.WALFS = (*diskFS)(nil)

func (fsys *diskFS) ListDir(dir string) ([]string, error) {
	var names []string
	for _, p := range slices.Sorted(maps.Keys(fsys.files)) {
		if name, ok := strings.CutPrefix(p, dir+"/"); ok {
			names = append(names, name)
		}
	}
	return names, nil
}

// Create preallocates the file at once: raft-wal counts on a segment
// reading as zeros past what it wrote, crash or not.
func (fsys *diskFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	p := dir + "/" + name
	if _, ok := fsys.files[p]; ok {
		return nil, &fs.PathError{Op: "create", Path: p, Err: fs.ErrExist}
	}
	fsys.files[p] = &file{durable: make([]byte, size), view: make([]byte, size)}
	return &handle{fsys: fsys, path: p, gen: fsys.gen}, nil
}

func (fsys *diskFS) Delete(dir, name string) error {
	delete(fsys.files, dir+"/"+name)
	return nil
}

func (fsys *diskFS) open(dir, name string) (*handle, error) {
	p := dir + "/" + name
	if _, ok := fsys.files[p]; !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return &handle{fsys: fsys, path: p, gen: fsys.gen}, nil
}

func (fsys *diskFS) OpenReader(dir, name string) (types.ReadableFile, error) {
	return fsys.open(dir, name)
}

func (fsys *diskFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	return fsys.open(dir, name)
}

func (fsys *diskFS) Size(dir, name string) (int64, error) {
	h, err := fsys.open(dir, name)
	if err != nil {
		return 0, err
	}
	return int64(len(fsys.files[h.path].view)), nil
}

// ZeroFrom is the repair's cut, synced: the open makes it, never a
// Ready's write.
func (fsys *diskFS) ZeroFrom(dir, name string, offset int64) error {
	h, err := fsys.open(dir, name)
	if err != nil {
		return err
	}
	f := fsys.files[h.path]
	fsys.d.sync()
	if offset > int64(len(f.durable)) {
		f.durable = append(f.durable, make([]byte, offset-int64(len(f.durable)))...)
	}
	clear(f.durable[offset:])
	f.view = slices.Clone(f.durable)
	f.extents = slices.DeleteFunc(f.extents, func(e extent) bool { return e.lo >= offset })
	for i := range f.extents {
		f.extents[i].hi = min(f.extents[i].hi, offset)
	}
	return nil
}

// handle is an open file.
type handle struct {
	fsys *diskFS
	path string
	gen  int
}

var errStale = errors.New("sim: a file handle from before the crash")

func (h *handle) file() (*file, error) {
	f := h.fsys.files[h.path]
	if h.gen != h.fsys.gen || f == nil {
		return nil, errStale
	}
	return f, nil
}

func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	f, err := h.file()
	if err != nil {
		return 0, err
	}
	if off >= int64(len(f.view)) {
		return 0, io.EOF
	}
	n := copy(p, f.view[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	f, err := h.file()
	if err != nil {
		return 0, err
	}
	f.view = writeAt(f.view, p, off)
	h.fsys.d.flight = append(h.fsys.d.flight, step{path: h.path, off: off, data: slices.Clone(p)})
	return len(p), nil
}

func (h *handle) Sync() error {
	if _, err := h.file(); err != nil {
		return err
	}
	d := h.fsys.d
	switch {
	case !d.inReady:
		d.sync()
	case d.failSync:
		d.failSync = false
		d.failedSync()
		return errSyncFailed
	default:
		d.flight = append(d.flight, step{sync: true})
	}
	return nil
}

func (h *handle) Close() error { return nil }

// metaState is what raft-wal's meta store holds.
type metaState struct {
	state  types.PersistentState
	stable map[string][]byte
}

func newMetaState() metaState { return metaState{stable: map[string][]byte{}} }

func (m metaState) clone() metaState {
	c := metaState{state: m.state, stable: maps.Clone(m.stable)}
	c.state.Segments = slices.Clone(m.state.Segments)
	return c
}

// diskMeta is raft-wal's meta store: a transaction is durable when it
// returns (BoltDB syncs it), but within a Ready's write it waits, with
// the rest of the write, for the sync event.
type diskMeta struct {
	d       *disk
	durable metaState
	view    metaState
}

var _ types.MetaStore = (*diskMeta)(nil)

func (m *diskMeta) commit(tx func(*metaState)) {
	tx(&m.view)
	if m.d.inReady {
		m.d.flight = append(m.d.flight, step{meta: tx})
		return
	}
	tx(&m.durable)
}

func (m *diskMeta) Load(string) (types.PersistentState, error) { return m.view.clone().state, nil }

func (m *diskMeta) CommitState(s types.PersistentState) error {
	s.Segments = slices.Clone(s.Segments)
	m.commit(func(ms *metaState) { ms.state = s })
	return nil
}

func (m *diskMeta) GetStable(key []byte) ([]byte, error) {
	return slices.Clone(m.view.stable[string(key)]), nil
}

func (m *diskMeta) SetStable(key, value []byte) error {
	k, v := string(key), slices.Clone(value)
	m.commit(func(ms *metaState) { ms.stable[k] = v })
	return nil
}

func (m *diskMeta) Close() error { return nil }

// discard is the log of raftnode's disk storage in the simulation: what
// it decides shows in the trace.
var discard = slog.New(slog.DiscardHandler)

// The snapshots raftnode writes name their members as Tenure node IDs,
// which the simulation has none of: its node IDs are raft IDs, not
// hashes of names. The simulation's snapshot data carries the
// ConfState ahead of the state instead, and takes it back at start.

func wrapSnapshot(snap raftpb.Snapshot) raftpb.Snapshot {
	cs, err := snap.Metadata.ConfState.Marshal()
	must(err)
	data := binary.AppendUvarint(nil, uint64(len(cs)))
	snap.Data = append(append(data, cs...), snap.Data...)
	return snap
}

func unwrapSnapshot(snap raftpb.Snapshot) raftpb.Snapshot {
	n, k := binary.Uvarint(snap.Data)
	if k <= 0 || uint64(len(snap.Data)-k) < n {
		panic("sim: a snapshot without its ConfState")
	}
	var cs raftpb.ConfState
	must(cs.Unmarshal(snap.Data[k : k+int(n)]))
	snap.Metadata.ConfState = cs
	snap.Data = snap.Data[k+int(n):]
	return snap
}

// The damage faults harm what a synced write left on the medium (and
// the page cache's copy of it), which a node meets when it next reads
// its log at start. They pick among the synced writes still on the
// disk, in the order of the files' names and of their writing.

// written is one synced write: its file and its place in the file's
// extents.
type written struct {
	path string
	i    int
}

func (d *disk) synced() []written {
	var all []written
	for _, p := range slices.Sorted(maps.Keys(d.fs.files)) {
		for i := range d.fs.files[p].extents {
			all = append(all, written{p, i})
		}
	}
	return all
}

func (d *disk) extent(w written) (*file, extent) {
	f := d.fs.files[w.path]
	return f, f.extents[w.i]
}

// flip flips one bit of the byte at off within w.
func (d *disk) flip(w written, off int64, bit int) {
	f, e := d.extent(w)
	f.durable[e.lo+off] ^= 1 << bit
	f.view[e.lo+off] ^= 1 << bit
}

// lose is a write the device acknowledged and never made: its place
// reads as the preallocated zeros.
func (d *disk) lose(w written) {
	f, e := d.extent(w)
	clear(f.durable[e.lo:e.hi])
	clear(f.view[e.lo:e.hi])
}

// misdirect is a write the device put in the wrong place: from's bytes
// land where to's write starts, in the same file, and from's own place
// keeps the zeros it had before.
func (d *disk) misdirect(from, to written) {
	f, e := d.extent(from)
	data := slices.Clone(f.durable[e.lo:e.hi])
	d.lose(from)
	_, t := d.extent(to)
	f.durable = writeAt(f.durable, data, t.lo)
	f.view = writeAt(f.view, data, t.lo)
}
