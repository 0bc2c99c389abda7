package raftnode

// The applier: the state machine as applied so far, the lock readers
// share with apply, and the applied index readers wait on. It is the
// only code that takes the state's lock, so the rule "one writer, many
// readers, no disk I/O under the lock" is kept in one place.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// state is what the applier needs from the replicated state. *statemachine.Machine
// is the only production implementation; the seam exists so that the log,
// snapshots and read protocol can be tested with a fake while the machine
// evolves.
type state interface {
	Apply(now int64, cmd statemachine.Command) statemachine.Result
	Revision() int64
	Snapshot(w io.Writer) error
	Restore(r io.Reader) error
}

var _ state = (*statemachine.Machine)(nil)

// applier owns the state and is the only writer to it: the engine's apply
// goroutine applies, snapshots and restores, never concurrently with
// each other; Node's readers run alongside under mu.
type applier struct {
	mu sync.RWMutex // guards st; held for writing across a whole batch
	st state

	newState  func() state
	observer  func(*statemachine.Machine, []statemachine.Event)
	onRestore func(revision int64, m *statemachine.Machine)
	log       *slog.Logger
	metrics   *metrics

	// applied is the index of the last entry whose effect is visible under
	// mu, raft's own empty entries and barriers included.
	applied atomic.Uint64
	// version is the state's cluster version, kept beside it so that a
	// proposal picks the log's form (statemachine.EncodeFor) without
	// taking mu. 0 until the state says: the form every build reads.
	version atomic.Int32

	waitMu sync.Mutex    // guards waitCh
	waitCh chan struct{} // closed when applied moves; nil until a reader waits
	// waiting lets a batch skip waitMu when no reader is parked, which is
	// the common case under write load.
	waiting atomic.Bool
}

// applyData applies one encoded command; the caller holds mu for writing.
func (f *applier) applyData(index, term uint64, data []byte) statemachine.Result {
	now, cmd, err := DecodeCommand(data, int(f.version.Load()))
	if err != nil {
		// Every replica fails the same entry the same way, so the state
		// stays identical; the proposer learns why from Result.Err.
		f.log.Error("undecodable log entry", "index", index, "term", term, "error", err)
		return statemachine.Result{Revision: f.st.Revision(), Err: err}
	}
	res := f.st.Apply(now, cmd)
	if _, ok := cmd.(statemachine.SetVersion); ok {
		f.noteVersion()
	}
	if (len(res.Events) > 0 || res.AuthRevision > 0) && f.observer != nil {
		f.observer(machine(f.st), res.Events)
	}
	return res
}

// DecodeCommand decodes a command from the log at the state's cluster
// version, refusing a binary entry below statemachine.BinaryVersion,
// which a member on an older build could not read: every replica refuses
// it alike, so the states stay identical. It is exported so that
// internal/sim decodes entries as apply does.
func DecodeCommand(data []byte, clusterVersion int) (now int64, cmd statemachine.Command, err error) {
	now, cmd, err = statemachine.Decode(data)
	if err == nil && statemachine.IsBinary(data) && clusterVersion < statemachine.BinaryVersion {
		err = fmt.Errorf("%w: a binary entry at cluster version %d, which a member on an older build could not read", statemachine.ErrNotSupported, clusterVersion)
	}
	return now, cmd, err
}

// applyBatch runs apply on ents under one write lock for the whole
// batch, telling it the index the state reflects (a restored snapshot
// may cover some of them), and then raises applied to the last. apply
// reads each entry's framing and calls applyData with the command it
// carries, under that lock (ApplyEntries). It reports false, having
// done nothing, when the state already reflects the whole batch.
func (f *applier) applyBatch(ents []raftpb.Entry, apply func(applied uint64)) bool {
	if len(ents) == 0 || ents[len(ents)-1].Index <= f.applied.Load() {
		return false
	}
	f.mu.Lock()
	apply(f.applied.Load())
	f.mu.Unlock()
	f.advance(ents[len(ents)-1].Index)
	return true
}

// noteVersion copies the state's cluster version into version; the
// caller holds mu.
func (f *applier) noteVersion() {
	if m := machine(f.st); m != nil {
		f.version.Store(int32(m.ClusterVersion()))
	}
}

// advance raises applied to idx and wakes parked readers. It never lowers
// applied: a barrier and a batch may report out of order.
func (f *applier) advance(idx uint64) {
	for {
		cur := f.applied.Load()
		if idx <= cur {
			return
		}
		if f.applied.CompareAndSwap(cur, idx) {
			break
		}
	}
	f.metrics.applied.Set(float64(idx))
	f.wake()
}

func (f *applier) wake() {
	if !f.waiting.Load() {
		return
	}
	f.waitMu.Lock()
	if f.waitCh != nil {
		close(f.waitCh)
		f.waitCh = nil
	}
	f.waiting.Store(false)
	f.waitMu.Unlock()
}

// appliedChanged returns a channel that is closed the next time applied
// moves. Callers take it before checking applied, so no move is missed.
func (f *applier) appliedChanged() <-chan struct{} {
	f.waitMu.Lock()
	defer f.waitMu.Unlock()
	if f.waitCh == nil {
		f.waitCh = make(chan struct{})
	}
	f.waiting.Store(true)
	return f.waitCh
}

// snapshotVersion heads every snapshot, followed by the applied index, so
// that a restored node knows how far its state reaches without waiting
// for the next entry. Bump it when the header changes.
const snapshotVersion byte = 1

const snapshotHeaderLen = 1 + 8

// Snapshots are taken into memory under the read lock and written out
// while applies continue: the Machine is not safe for concurrent use, and
// copying it to a buffer first is cheap at Tenure's sizes (sessions,
// leases and small keys, bounded by the limits) and keeps disk I/O out of
// every lock.

// snapshotBytes is the state and its applied index in the snapshot
// format, taken under the read lock.
func (f *applier) snapshotBytes() ([]byte, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.snapshotLocked()
}

// snapshotWith is snapshotBytes that also runs also under the read lock,
// so that whatever also copies (the configuration) is as of the same
// applied index as the state; it returns that index. The state comes in
// pieces of statePiece bytes, in order: one buffer grown by doubling
// to a large state's length would leave up to as much again behind as
// garbage while it is built, and keep up to twice the length alive
// while the snapshot is written.
//
// A state that can write most of its snapshot after the lock is let go
// (splitSnapshotter: the state machine's keys and history) does so, and
// applies go on meanwhile.
//
// The state comes from finish, which the caller may run later, on
// another goroutine, while applies go on: it writes what the lock did not
// have to cover. It must run once, before the next snapshotWith.
func (f *applier) snapshotWith(also func()) (finish func() ([][]byte, error), applied uint64, err error) {
	var w chunkWriter
	rest, applied, err := f.snapshotHeadWith(also, &w)
	if err != nil {
		return nil, 0, err
	}
	return func() ([][]byte, error) {
		if err := rest(); err != nil {
			return nil, fmt.Errorf("raftnode: snapshot state: %w", err)
		}
		return w.chunks(), nil
	}, applied, nil
}

// snapshotHeadWith is the part of snapshotWith under the read lock.
func (f *applier) snapshotHeadWith(also func(), w io.Writer) (rest func() error, applied uint64, err error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	also()
	applied = f.applied.Load()
	split, ok := f.st.(splitSnapshotter)
	if !ok {
		return func() error { return nil }, applied, f.writeSnapshotLocked(w)
	}
	if err := f.writeSnapshotHeader(w); err != nil {
		return nil, 0, err
	}
	rest, err = split.SnapshotSplit(w)
	if err != nil {
		return nil, 0, fmt.Errorf("raftnode: snapshot state: %w", err)
	}
	return rest, applied, nil
}

// splitSnapshotter is a state that writes its snapshot in two steps, the
// second without the lock (statemachine.Machine.SnapshotSplit).
type splitSnapshotter interface {
	SnapshotSplit(w io.Writer) (rest func() error, err error)
}

var _ splitSnapshotter = (*statemachine.Machine)(nil)

// read runs fn on the state under the read lock.
func (f *applier) read(fn func(state) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return fn(f.st)
}

// snapshotLocked is snapshotBytes for a caller that holds mu.
func (f *applier) snapshotLocked() ([]byte, error) {
	var buf bytes.Buffer
	if err := f.writeSnapshotLocked(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeSnapshotLocked writes the snapshot header and the state to w; the
// caller holds mu.
func (f *applier) writeSnapshotLocked(w io.Writer) error {
	if err := f.writeSnapshotHeader(w); err != nil {
		return err
	}
	if err := f.st.Snapshot(w); err != nil {
		return fmt.Errorf("raftnode: snapshot state: %w", err)
	}
	return nil
}

// writeSnapshotHeader writes the header naming the applied index; the
// caller holds mu.
func (f *applier) writeSnapshotHeader(w io.Writer) error {
	var hdr [snapshotHeaderLen]byte
	hdr[0] = snapshotVersion
	binary.BigEndian.PutUint64(hdr[1:], f.applied.Load())
	if _, err := w.Write(hdr[:]); err != nil {
		return fmt.Errorf("raftnode: snapshot state: %w", err)
	}
	return nil
}

// statePiece is the size of the pieces snapshotWith returns.
const statePiece = 256 << 10

// chunkWriter keeps what is written in pieces of statePiece bytes.
type chunkWriter struct {
	full [][]byte
	cur  []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(w.cur) == cap(w.cur) {
			if w.cur != nil {
				w.full = append(w.full, w.cur)
			}
			w.cur = make([]byte, 0, statePiece)
		}
		k := copy(w.cur[len(w.cur):cap(w.cur)], p)
		w.cur, p = w.cur[:len(w.cur)+k], p[k:]
	}
	return n, nil
}

// chunks is what was written, in order.
func (w *chunkWriter) chunks() [][]byte {
	if len(w.cur) > 0 {
		return append(w.full, w.cur)
	}
	return w.full
}

// Restore replaces the state with a snapshot, at startup or when a
// follower is sent one. The new state is built outside the lock, so
// readers keep seeing the old one until the swap.
func (f *applier) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var hdr [snapshotHeaderLen]byte
	if _, err := io.ReadFull(rc, hdr[:]); err != nil {
		return fmt.Errorf("raftnode: read snapshot header: %w", err)
	}
	if hdr[0] != snapshotVersion {
		return fmt.Errorf("raftnode: snapshot version %d, this build reads %d", hdr[0], snapshotVersion)
	}
	idx := binary.BigEndian.Uint64(hdr[1:])
	st := f.newState()
	if err := st.Restore(rc); err != nil {
		return fmt.Errorf("raftnode: restore state: %w", err)
	}
	f.mu.Lock()
	f.st = st
	f.noteVersion()
	if f.onRestore != nil {
		f.onRestore(st.Revision(), machine(st))
	}
	f.mu.Unlock()
	// Store, not advance: the state now is exactly the snapshot's.
	f.applied.Store(idx)
	f.metrics.restores.Inc()
	f.metrics.applied.Set(float64(idx))
	f.wake()
	return nil
}

// restoreBytes restores the state from a snapshot in the applier's format.
func (f *applier) restoreBytes(b []byte) error {
	return f.Restore(io.NopCloser(bytes.NewReader(b)))
}
