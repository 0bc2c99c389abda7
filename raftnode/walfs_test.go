package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"
	"go.etcd.io/raft/v3/raftpb"
)

// memFS is a WALFS in memory, durable at once: enough to show that the
// disk storage reaches its segments through DiskFiles alone.
type memFS struct{ files map[string][]byte }

func (m *memFS) path(dir, name string) string { return dir + "/" + name }

func (m *memFS) ListDir(dir string) ([]string, error) {
	var names []string
	for p := range m.files {
		if d, name, _ := strings.Cut(p, dir+"/"); d == "" && name != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

func (m *memFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	p := m.path(dir, name)
	if _, ok := m.files[p]; ok {
		return nil, &fs.PathError{Op: "create", Path: p, Err: fs.ErrExist}
	}
	m.files[p] = make([]byte, size)
	return &memFile{m, p}, nil
}

func (m *memFS) Delete(dir, name string) error {
	delete(m.files, m.path(dir, name))
	return nil
}

func (m *memFS) open(dir, name string) (*memFile, error) {
	p := m.path(dir, name)
	if _, ok := m.files[p]; !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return &memFile{m, p}, nil
}

func (m *memFS) OpenReader(dir, name string) (types.ReadableFile, error) { return m.open(dir, name) }
func (m *memFS) OpenWriter(dir, name string) (types.WritableFile, error) { return m.open(dir, name) }

func (m *memFS) Size(dir, name string) (int64, error) {
	f, err := m.open(dir, name)
	if err != nil {
		return 0, err
	}
	return int64(len(m.files[f.path])), nil
}

func (m *memFS) ZeroFrom(dir, name string, offset int64) error {
	f, err := m.open(dir, name)
	if err != nil {
		return err
	}
	b := m.files[f.path]
	if offset > int64(len(b)) {
		b = append(b, make([]byte, offset-int64(len(b)))...)
	}
	clear(b[offset:])
	m.files[f.path] = b
	return nil
}

type memFile struct {
	fs   *memFS
	path string
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	b := f.fs.files[f.path]
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	b := f.fs.files[f.path]
	if end := off + int64(len(p)); end > int64(len(b)) {
		b = append(b, make([]byte, end-int64(len(b)))...)
	}
	copy(b[off:], p)
	f.fs.files[f.path] = b
	return len(p), nil
}

func (f *memFile) Sync() error  { return nil }
func (f *memFile) Close() error { return nil }

// memMeta is raft-wal's meta store in memory; every open of the WAL
// gets the same one.
type memMeta struct {
	state  types.PersistentState
	stable map[string][]byte
}

func (m *memMeta) Load(string) (types.PersistentState, error) { return m.state, nil }
func (m *memMeta) CommitState(s types.PersistentState) error {
	m.state = s
	m.state.Segments = slices.Clone(s.Segments)
	return nil
}
func (m *memMeta) GetStable(k []byte) ([]byte, error) { return m.stable[string(k)], nil }
func (m *memMeta) SetStable(k, v []byte) error {
	m.stable[string(k)] = slices.Clone(v)
	return nil
}
func (m *memMeta) Close() error { return nil }

type memFiles struct {
	fs    *memFS
	meta  *memMeta
	snaps *raft.InmemSnapshotStore
}

func newMemFiles() *memFiles {
	return &memFiles{fs: &memFS{files: map[string][]byte{}}, meta: &memMeta{stable: map[string][]byte{}}, snaps: raft.NewInmemSnapshotStore()}
}

func (m *memFiles) files() DiskFiles {
	return DiskFiles{WAL: m.fs, Meta: func() types.MetaStore { return m.meta }, Snapshots: m.snaps}
}

// open opens the disk storage over m, as openStores opens it over the
// real files under dir.
func (m *memFiles) open(t *testing.T, dir string) (*diskStorage, func() error, error) {
	t.Helper()
	mt, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{LogStore: "wal", WALSegmentSize: 64 << 10}
	wal, meta, closeWAL, err := openDiskWAL(dir, cfg, m.files(), m.snaps, unmeasuredSpace(mt, log), &walTail{}, log)
	if err != nil {
		return nil, nil, err
	}
	return &diskStorage{wal: wal, meta: meta, snapshots: m.snaps, log: log}, closeWAL, nil
}

func memEntryData(i int) []byte { return []byte(strings.Repeat(fmt.Sprintf("entry-%02d|", i), 20)) }

// The disk storage runs over files it is given: raft-wal's segments, its
// meta store and the snapshots in memory, nothing under the directory
// that names them. The verifying reader and the repair work through the
// same files: a flipped byte in a synced batch is refused on a node
// alone, and cut off, with the entries owed, on a member.
func TestDiskStorageOverGivenFiles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "raft")
	m := newMemFiles()
	d, closeWAL, err := m.open(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.load(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		if err := d.append([]raftpb.Entry{{Index: uint64(i), Term: 1, Data: memEntryData(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.saveHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 10}); err != nil {
		t.Fatal(err)
	}
	if err := closeWAL(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got = %v, expected: nothing written under %s", err, dir)
	}

	d, closeWAL, err = m.open(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.ents) != 10 || b.hs.Vote != 1 || !bytes.Equal(b.ents[9].Data, memEntryData(10)) {
		t.Fatalf("got = %d entries, hard state %+v, expected: the 10 entries and the vote written", len(b.ents), b.hs)
	}
	if err := closeWAL(); err != nil {
		t.Fatal(err)
	}

	var seg string
	for p := range m.fs.files {
		seg = p
	}
	at := bytes.Index(m.fs.files[seg], memEntryData(5))
	if at < 0 {
		t.Fatalf("entry 5 is not in %s", seg)
	}
	m.fs.files[seg][at+20] ^= 0x20

	_, _, err = m.open(t, dir)
	var ce *CorruptLogError
	if !errors.As(err, &ce) || ce.FirstIndex != 5 {
		t.Fatalf("alone: got = %v, expected: a *CorruptLogError at entry 5", err)
	}

	// raft-wal's SetUint64 encoding.
	if err := m.meta.SetStable(membersKey, binary.LittleEndian.AppendUint64(nil, 3)); err != nil {
		t.Fatal(err)
	}
	d, closeWAL, err = m.open(t, dir)
	if err != nil {
		t.Fatalf("a member: got = %v, expected: the damage cut off", err)
	}
	defer closeWAL()
	b, err = d.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.ents) != 4 {
		t.Fatalf("got = %d entries, expected: 4, cut before the damaged batch", len(b.ents))
	}
	if owed, _ := d.meta.GetUint64(catchUpKey); owed != 10 {
		t.Fatalf("got = catch-up index %d, expected: 10, the entries cut owed", owed)
	}
}
