package raftnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/statemachine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeState is a tiny key/value state with revisions, standing in for
// statemachine.Machine so that the log can be tested on its own.
type fakeState struct {
	Rev  int64                            `json:"rev"`
	KV   map[string]statemachine.KeyValue `json:"kv"`
	hook func(statemachine.Command)       // called at the start of Apply; may block the apply goroutine
}

var _ state = (*fakeState)(nil)

func newFake(hook func(statemachine.Command)) func() state {
	return func() state { return &fakeState{KV: map[string]statemachine.KeyValue{}, hook: hook} }
}

func (s *fakeState) Revision() int64 { return s.Rev }

func (s *fakeState) Apply(now int64, cmd statemachine.Command) statemachine.Result {
	if s.hook != nil {
		s.hook(cmd)
	}
	switch c := cmd.(type) {
	case statemachine.Put:
		s.Rev++
		prev, had := s.KV[c.Key]
		kv := statemachine.KeyValue{Key: c.Key, Value: c.Value, CreateRevision: s.Rev, ModRevision: s.Rev, Version: prev.Version + 1}
		if had {
			kv.CreateRevision = prev.CreateRevision
		}
		s.KV[c.Key] = kv
		res := statemachine.Result{Revision: s.Rev, KV: &kv,
			Events: []statemachine.Event{{Revision: s.Rev, Type: statemachine.EventKeyPut, Time: now, KV: &kv}}}
		if had {
			res.PrevKV = &prev
		}
		return res
	case statemachine.NewEpoch: // a command that changes nothing and has no events
		return statemachine.Result{Revision: s.Rev}
	default:
		return statemachine.Result{Revision: s.Rev, Err: statemachine.ErrUnknownCommand}
	}
}

func (s *fakeState) Snapshot(w io.Writer) error { return json.NewEncoder(w).Encode(s) }

func (s *fakeState) Restore(r io.Reader) error { return json.NewDecoder(r).Decode(s) }

// testConfig returns a config for a single node on a fresh port with
// short timeouts, and WAL segments of 1 MiB: raft-wal's 64 MiB segment
// is read whole each time the log is opened again, which under the race
// detector cost a second or more a reopen (TestSnapshotRestore/wal took
// 1.9 s, 0.2 s with these).
func testConfig(dir, logStore string) Config {
	return Config{
		DataDir:         dir,
		PeerAddr:        "127.0.0.1:0",
		LogStore:        logStore,
		WALSegmentSize:  1 << 20,
		Bootstrap:       true,
		ElectionTimeout: 50 * time.Millisecond,
		Logger:          slog.New(slog.DiscardHandler),
	}
}

func openFake(t testing.TB, cfg Config, hook func(statemachine.Command)) *Node {
	t.Helper()
	n, err := open(cfg, newFake(hook))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func waitLeader(t testing.TB, n *Node) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for !n.IsLeader() {
		select {
		case <-n.LeaderChanges():
		case <-timeout:
			t.Fatal("node did not become leader within 5s")
		}
	}
	// A leader's first read round appends a barrier of its term, once
	// (readindex.go), and the lease starts one at once (lease.go): a read
	// here settles it, so that the entries a test writes next lie in the
	// log as it wrote them, one batch each.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Read(ctx, func(*statemachine.Machine) error { return nil }); err != nil {
		t.Fatalf("first read on the leader: %v", err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func put(t testing.TB, n *Node, key, value string) statemachine.Result {
	t.Helper()
	res, err := n.Propose(ctxT(t), statemachine.Put{Key: key, Value: value})
	if err != nil {
		t.Fatalf("propose put %s: %v", key, err)
	}
	if res.Err != nil {
		t.Fatalf("put %s: result error %v", key, res.Err)
	}
	return res
}

// readKV returns the fake's keys and revision through a linearizable read.
func readKV(t testing.TB, n *Node) (map[string]string, int64) {
	t.Helper()
	var got map[string]string
	var rev int64
	err := n.readState(ctxT(t), func(st state) error {
		got, rev = fakeKV(st)
		return nil
	})
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return got, rev
}

// localKV returns the fake's keys and revision as n has applied them,
// leader or not.
func localKV(t testing.TB, n *Node) (map[string]string, int64) {
	t.Helper()
	var got map[string]string
	var rev int64
	err := n.readLocalState(func(st state) error {
		got, rev = fakeKV(st)
		return nil
	})
	if err != nil {
		t.Fatalf("local read on %s: %v", n.ID(), err)
	}
	return got, rev
}

func fakeKV(st state) (map[string]string, int64) {
	f := st.(*fakeState)
	kv := make(map[string]string, len(f.KV))
	for k, v := range f.KV {
		kv[k] = v.Value
	}
	return kv, f.Rev
}

var logStores = []string{"wal", "boltdb"}

func TestProposeReturnsTheStateMachineResult(t *testing.T) {
	t.Parallel()
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			var mu sync.Mutex
			var seen []statemachine.Event
			cfg := testConfig(t.TempDir(), store)
			cfg.Observer = func(_ *statemachine.Machine, ev []statemachine.Event) {
				mu.Lock()
				seen = append(seen, ev...)
				mu.Unlock()
			}
			n := openFake(t, cfg, nil)
			waitLeader(t, n)

			before := time.Now().UnixNano()
			r1 := put(t, n, "a", "1")
			r2 := put(t, n, "a", "2")
			r3 := put(t, n, "b", "3")
			after := time.Now().UnixNano()

			if r1.Revision != 1 || r2.Revision != 2 || r3.Revision != 3 {
				t.Errorf("revisions = %d, %d, %d, expected: 1, 2, 3", r1.Revision, r2.Revision, r3.Revision)
			}
			if r2.PrevKV == nil || r2.PrevKV.Value != "1" || r2.KV.Version != 2 {
				t.Errorf("second put: prev = %+v, kv = %+v, expected prev value 1 and version 2", r2.PrevKV, r2.KV)
			}
			if ev := r3.Events; len(ev) != 1 || ev[0].Time < before || ev[0].Time > after {
				t.Errorf("events = %+v, expected one event stamped between %d and %d", ev, before, after)
			}

			// A command the state rejects is a result, not an error.
			res, err := n.Propose(ctxT(t), statemachine.Release{Token: 7})
			if err != nil || !errors.Is(res.Err, statemachine.ErrUnknownCommand) {
				t.Errorf("rejected command: err = %v, res.Err = %v, expected: nil, ErrUnknownCommand", err, res.Err)
			}

			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 3 {
				t.Fatalf("observer saw %d events, expected: 3", len(seen))
			}
			for i, ev := range seen {
				if ev.Revision != int64(i+1) {
					t.Errorf("observer event %d has revision %d, expected: %d", i, ev.Revision, i+1)
				}
			}
		})
	}
}

func TestReopenReplaysTheLog(t *testing.T) {
	t.Parallel()
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			dir := t.TempDir()
			n := openFake(t, testConfig(dir, store), nil)
			waitLeader(t, n)
			put(t, n, "a", "1")
			put(t, n, "b", "2")
			put(t, n, "a", "3")
			if err := n.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}

			var replayed int
			cfg := testConfig(dir, store)
			cfg.Observer = func(_ *statemachine.Machine, ev []statemachine.Event) { replayed += len(ev) }
			n = openFake(t, cfg, nil)
			waitLeader(t, n)
			// Read right after election, with no new write: the read index
			// is the new leader's no-op, which the applier never hands the state.
			got, rev := readKV(t, n)
			if rev != 3 || got["a"] != "3" || got["b"] != "2" {
				t.Errorf("after reopen: kv = %v at revision %d, expected: map[a:3 b:2] at 3", got, rev)
			}
			if replayed != 3 {
				t.Errorf("observer saw %d replayed events, expected: 3", replayed)
			}
			if r := put(t, n, "c", "4"); r.Revision != 4 {
				t.Errorf("next revision = %d, expected: 4", r.Revision)
			}
		})
	}
}

func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) {
			dir := t.TempDir()
			n := openFake(t, testConfig(dir, store), nil)
			waitLeader(t, n)
			for i := range 5 {
				put(t, n, fmt.Sprintf("k%d", i), "before")
			}
			snapshotNow(t, n)
			put(t, n, "k0", "after")
			if err := n.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}

			restored := int64(-1)
			cfg := testConfig(dir, store)
			cfg.OnRestore = func(rev int64, _ *statemachine.Machine) { restored = rev }
			n = openFake(t, cfg, nil)
			if restored != 5 {
				t.Errorf("OnRestore revision = %d, expected: 5", restored)
			}
			if idx := n.AppliedIndex(); idx == 0 {
				t.Error("applied index after restore = 0, expected the snapshot's index")
			}
			waitLeader(t, n)
			got, rev := readKV(t, n)
			if rev != 6 || got["k0"] != "after" || got["k4"] != "before" {
				t.Errorf("after restore and replay: kv = %v at revision %d, expected k0=after, k4=before at 6", got, rev)
			}
		})
	}
}

func TestUndecodableEntryIsAResult(t *testing.T) {
	t.Parallel()
	n := openFake(t, testConfig(t.TempDir(), "wal"), nil)
	waitLeader(t, n)
	put(t, n, "a", "1")

	res := proposeRaw(t, n, []byte{200, 0, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	if !errors.Is(res.Err, statemachine.ErrUnknownCommand) || res.Revision != 1 {
		t.Errorf("response = %#v, expected a Result with ErrUnknownCommand at revision 1", res)
	}
	if r := put(t, n, "b", "2"); r.Revision != 2 {
		t.Errorf("revision after a bad entry = %d, expected: 2", r.Revision)
	}
}

func TestReadSeesEveryAcknowledgedWrite(t *testing.T) {
	t.Parallel()
	n := openFake(t, testConfig(t.TempDir(), "wal"), nil)
	waitLeader(t, n)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 20 {
				key := fmt.Sprintf("w%d", w)
				val := fmt.Sprint(i)
				res, err := n.Propose(context.Background(), statemachine.Put{Key: key, Value: val})
				if err != nil {
					errs <- err
					return
				}
				err = n.readState(context.Background(), func(st state) error {
					kv := st.(*fakeState).KV[key]
					if kv.ModRevision < res.Revision {
						return fmt.Errorf("read %s at mod revision %d after a write acknowledged at %d", key, kv.ModRevision, res.Revision)
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestProposeReturnsWhenTheContextEndsAndTheEntryStillCommits(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	hook := func(cmd statemachine.Command) {
		if p, ok := cmd.(statemachine.Put); ok && p.Key == "slow" {
			close(entered)
			<-release
		}
	}
	n := openFake(t, testConfig(t.TempDir(), "wal"), hook)
	waitLeader(t, n)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := n.Propose(ctx, statemachine.Put{Key: "slow", Value: "v"})
		errc <- err
	}()
	// The entry is committed and the apply goroutine is parked applying it;
	// cancelling must not wait for it.
	<-entered
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("propose error = %v, expected: context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("propose did not return after its context was cancelled")
	}
	close(release)
	if got, _ := readKV(t, n); got["slow"] != "v" {
		t.Errorf("after cancel: kv = %v, expected the entry to commit anyway", got)
	}
}

func TestNotLeader(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	cfg.Bootstrap = false // never joined, so never leader
	n := openFake(t, cfg, nil)

	_, err := n.Propose(ctxT(t), statemachine.Put{Key: "a"})
	var nle *NotLeaderError
	if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nle) {
		t.Errorf("propose on a non-leader: err = %v, expected: a *NotLeaderError", err)
	}
	if err := n.Read(ctxT(t), func(*statemachine.Machine) error { return nil }); !errors.Is(err, ErrNotLeader) {
		t.Errorf("read on a non-leader: err = %v, expected: ErrNotLeader", err)
	}
	if err := n.Barrier(ctxT(t)); !errors.Is(err, ErrNotLeader) {
		t.Errorf("barrier on a non-leader: err = %v, expected: ErrNotLeader", err)
	}
	if n.IsLeader() {
		t.Error("IsLeader = true on a node that never joined")
	}
	if err := n.ReadLocal(func(*statemachine.Machine) error { return nil }); err != nil {
		t.Errorf("local read on a non-leader: %v", err)
	}
}

func TestClosedNode(t *testing.T) {
	t.Parallel()
	n := openFake(t, testConfig(t.TempDir(), "wal"), nil)
	waitLeader(t, n)
	put(t, n, "a", "1")
	if err := n.Close(); err != nil {
		t.Fatalf("first close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := n.Propose(ctxT(t), statemachine.Put{Key: "a"}); !errors.Is(err, ErrClosed) {
		t.Errorf("propose after close: err = %v, expected: ErrClosed", err)
	}
	if err := n.Read(ctxT(t), func(*statemachine.Machine) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("read after close: err = %v, expected: ErrClosed", err)
	}
	if err := n.ReadLocal(func(*statemachine.Machine) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("local read after close: err = %v, expected: ErrClosed", err)
	}
	if err := n.Barrier(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("barrier after close: err = %v, expected: ErrClosed", err)
	}
	if n.IsLeader() {
		t.Error("IsLeader = true after close")
	}
	// The lessor learns that leadership ended.
	select {
	case v := <-n.LeaderChanges():
		if v {
			t.Error("last leadership change after close = true, expected: false")
		}
	default:
		t.Error("no leadership change after closing a leader, expected: false")
	}
}

func TestCloseWaitsForProposalsInFlight(t *testing.T) {
	t.Parallel()
	n := openFake(t, testConfig(t.TempDir(), "wal"), nil)
	waitLeader(t, n)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				_, err := n.Propose(context.Background(), statemachine.Put{Key: "k", Value: "v"})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("propose during close: %v, expected: success or ErrClosed", err)
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond) // let proposals pile up in raft's queue
	if err := n.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	wg.Wait()
}

func TestOpenRefusesTheOtherLogStoresDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := openFake(t, testConfig(dir, "wal"), nil)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := open(testConfig(dir, "boltdb"), newFake(nil))
	if err == nil || !strings.Contains(err.Error(), "holds a raft-wal WAL") {
		t.Errorf("open boltdb on a wal directory: err = %v, expected a refusal", err)
	}
	_, err = open(testConfig(t.TempDir(), "sqlite"), newFake(nil))
	if err == nil {
		t.Error("open with an unknown LogStore kind: err = nil, expected an error")
	}
}

func TestMetricsAreRegisteredAndReleased(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	cfg := testConfig(dir, "wal")
	cfg.Registerer = reg
	n := openFake(t, cfg, nil)
	waitLeader(t, n)
	put(t, n, "a", "1")

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
		if mf.GetName() == "tenure_raft_propose_duration_seconds" {
			if c := mf.GetMetric()[0].GetHistogram().GetSampleCount(); c != 1 {
				t.Errorf("propose histogram count = %d, expected: 1", c)
			}
		}
		if mf.GetName() == "tenure_raft_is_leader" {
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 1 {
				t.Errorf("is_leader = %v, expected: 1", v)
			}
		}
	}
	for _, name := range []string{
		"tenure_raft_propose_duration_seconds", "tenure_raft_apply_batch_duration_seconds",
		"tenure_raft_store_logs_duration_seconds", "tenure_raft_applied_index", "tenure_raft_is_leader",
	} {
		if !got[name] {
			t.Errorf("metric %s not registered", name)
		}
	}

	// Reopening on the same registry works because Close unregisters.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openFake(t, cfg, nil)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond; replication and elections have no event a test can
// wait on directly.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRealMachine runs the log, a snapshot and a restart against
// statemachine.Machine instead of the fake.
func TestRealMachine(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	n := openLeader(t, cfg)
	res, err := n.Propose(ctxT(t), statemachine.OpenSession{Identity: "test", TTL: int64(10 * time.Second)})
	if err != nil || res.Err != nil || res.Session == nil {
		t.Fatalf("open session: err = %v, result = %+v", err, res)
	}
	res, err = n.Propose(ctxT(t), statemachine.Put{Key: "k", Value: "v", SessionID: res.Session.ID})
	if err != nil || res.Err != nil {
		t.Fatalf("put: err = %v, result error = %v", err, res.Err)
	}
	snapshotNow(t, n)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openLeader(t, cfg)
	err = n.Read(ctxT(t), func(m *statemachine.Machine) error {
		kv, ok := m.Key("k")
		if !ok || kv.Value != "v" {
			return fmt.Errorf("key k = %+v, %v after restart, expected value v", kv, ok)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// trivial is the benchmarks' command: it decodes like any other but the
// fake applies it without touching state, so the figures are the log's.
var trivial = statemachine.NewEpoch{}
