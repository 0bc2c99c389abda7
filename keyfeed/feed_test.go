package keyfeed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// node is a Source without raft: commands apply at once to a machine
// and are published to a hub, as the server's apply loop does.
type node struct {
	mu  sync.Mutex
	m   *statemachine.Machine
	hub *watch.Hub
}

// newNode is a node at the latest cluster version, with a hub that keeps
// history events.
func newNode(history int) *node {
	n := &node{m: statemachine.New(), hub: watch.NewHub(history)}
	n.apply(statemachine.SetVersion{Version: statemachine.Version})
	return n
}

func (n *node) apply(cmd statemachine.Command) statemachine.Result {
	n.mu.Lock()
	defer n.mu.Unlock()
	res := n.m.Apply(time.Now().UnixNano(), cmd)
	n.hub.Publish(res.Events)
	return res
}

func (n *node) put(t *testing.T, key string) int64 {
	t.Helper()
	res := n.apply(statemachine.Put{Key: key, Value: "v"})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.KVRevision == 0 {
		return res.Revision // keys take the global revision before version 5
	}
	return res.KVRevision
}

func (n *node) Read(ctx context.Context, _ bool, fn func(m *statemachine.Machine) error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fn(n.m)
}

func (n *node) Sync(context.Context) {}

func (n *node) Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error) {
	return n.hub.Watch(start, filter)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, n *node, start int64, filter func(*statemachine.Event) bool) *Feed {
	t.Helper()
	f, err := Open(testCtx(t), n, start, filter)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// show prints a batch as "@rev: PUT k@mod, DELETE k@mod".
func show(b Batch) string {
	var evs []string
	for _, e := range b.Events {
		typ := "PUT"
		if e.Type != statemachine.EventKeyPut {
			typ = "DELETE"
		}
		evs = append(evs, fmt.Sprintf("%s %s@%d", typ, e.KV.Key, e.Revision))
	}
	return fmt.Sprintf("@%d: %s", b.Revision, strings.Join(evs, ", "))
}

func next(t *testing.T, f *Feed) Batch {
	t.Helper()
	b, err := f.Next(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func expect(t *testing.T, f *Feed, expected string) Batch {
	t.Helper()
	b := next(t, f)
	if got := show(b); got != expected {
		t.Fatalf("got = %q, expected: %q", got, expected)
	}
	return b
}

// blocks reports whether Next has nothing to hand over.
func blocks(f *Feed) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := f.Next(ctx)
	return errors.Is(err, context.DeadlineExceeded)
}

// A feed from the past hands over the history, read at once, then the
// live events, on the keys' clock (a session moves the global revision,
// not the keys'), a command's events in one batch, none missed or twice.
func TestFeedJoinsHistoryAndLiveOnTheKeysClock(t *testing.T) {
	n := newNode(0)
	r1 := n.put(t, "k/1")
	n.apply(statemachine.OpenSession{Identity: "x", TTL: int64(time.Minute)})
	n.put(t, "other")
	r3 := n.put(t, "k/2")
	f := open(t, n, r1, prefix("k/"))
	if f.Revision() != r3 {
		t.Errorf("got = revision %d, expected: %d", f.Revision(), r3)
	}
	b := expect(t, f, fmt.Sprintf("@%d: PUT k/1@%d, PUT k/2@%d", r3, r1, r3))
	if b.Level == 0 {
		t.Error("the last read of the history says no level")
	}
	res := n.apply(statemachine.Txn{Success: []statemachine.TxnOp{
		{Type: statemachine.OpPut, Key: "k/b", Value: "1"},
		{Type: statemachine.OpDelete, Key: "k/1"},
		{Type: statemachine.OpPut, Key: "zz", Value: "1"},
		{Type: statemachine.OpPut, Key: "k/a", Value: "2"},
	}})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	r := res.KVRevision
	expect(t, f, fmt.Sprintf("@%d: PUT k/b@%d, DELETE k/1@%d, PUT k/a@%d", r, r, r, r))
	r5 := n.put(t, "k/1")
	expect(t, f, fmt.Sprintf("@%d: PUT k/1@%d", r5, r5))
	if !blocks(f) {
		t.Error("Next handed something over with nothing owed")
	}
}

func prefix(p string) func(*statemachine.Event) bool {
	return watch.KeyFilter(p, true)
}

// A feed from now, or from a revision still to come, hands over nothing
// before it.
func TestFeedFromNowAndFromARevisionStillToCome(t *testing.T) {
	n := newNode(0)
	r := n.put(t, "k")
	now := open(t, n, 0, prefix("k"))
	later := open(t, n, r+2, prefix("k"))
	if now.Revision() != r {
		t.Errorf("got = revision %d, expected: %d", now.Revision(), r)
	}
	n.put(t, "k")
	due := n.put(t, "k")
	expect(t, now, fmt.Sprintf("@%d: PUT k@%d", r+1, r+1))
	expect(t, now, fmt.Sprintf("@%d: PUT k@%d", due, due))
	expect(t, later, fmt.Sprintf("@%d: PUT k@%d", due, due))
}

// A feed the hub drops (here: a command of 10 events in a hub of 4)
// reads them from the history instead, in one batch, and goes on live.
func TestFeedThatLagsResyncsFromTheHistory(t *testing.T) {
	n := newNode(4)
	f := open(t, n, 0, prefix("g/"))
	var ops []statemachine.TxnOp
	var evs []string
	for i := range 10 {
		ops = append(ops, statemachine.TxnOp{Type: statemachine.OpPut, Key: fmt.Sprintf("g/%d", i), Value: "v"})
	}
	r := n.apply(statemachine.Txn{Success: ops}).KVRevision
	for i := range 10 {
		evs = append(evs, fmt.Sprintf("PUT g/%d@%d", i, r))
	}
	expect(t, f, fmt.Sprintf("@%d: %s", r, strings.Join(evs, ", ")))
	r2 := n.put(t, "g/x")
	expect(t, f, fmt.Sprintf("@%d: PUT g/x@%d", r2, r2))
}

// A feed from before the compact revision is refused with it; one that
// lags past a compaction fails with it.
func TestFeedFromACompactedRevisionIsRefused(t *testing.T) {
	n := newNode(4)
	r1 := n.put(t, "k")
	r2 := n.put(t, "k")
	if res := n.apply(statemachine.Compact{Revision: r2}); res.Err != nil {
		t.Fatal(res.Err)
	}
	var ce *watch.CompactedError
	if _, err := Open(testCtx(t), n, r1, nil); !errors.As(err, &ce) || ce.Oldest != r2 {
		t.Fatalf("got = %v, expected: compacted at %d", err, r2)
	}
	f := open(t, n, r2, nil) // the compact revision itself is kept
	expect(t, f, fmt.Sprintf("@%d: PUT k@%d", r2, r2))

	// Ten puts overrun the hub, and the history is compacted before the
	// feed reads it again.
	n.mu.Lock()
	var last statemachine.Result
	for range 10 {
		last = n.m.Apply(1, statemachine.Put{Key: "k", Value: "v"})
		n.hub.Publish(last.Events)
	}
	n.m.Apply(1, statemachine.Compact{Revision: last.KVRevision})
	n.mu.Unlock()
	if _, err := f.Next(testCtx(t)); !errors.As(err, &ce) || ce.Oldest != last.KVRevision {
		t.Fatalf("got = %v, expected: compacted at %d", err, last.KVRevision)
	}
}

// History comes in batches of at most MaxRevisions revisions, each read
// stopping after MaxScan events, each batch as of the state when read.
func TestFeedHistoryComesInBoundedBatches(t *testing.T) {
	n := newNode(0)
	for range 2500 {
		n.put(t, "h")
	}
	for range MaxScan + 1000 {
		n.put(t, "x")
	}
	last := n.put(t, "h")
	f := open(t, n, 2, prefix("h"))
	var sizes []int
	for want := int64(2); want <= last; {
		b := next(t, f)
		if b.Revision != last {
			t.Errorf("got = batch as of %d, expected: %d", b.Revision, last)
		}
		sizes = append(sizes, len(b.Events))
		for _, e := range b.Events {
			if e.Revision < want {
				t.Fatalf("got = revision %d, expected: %d or later", e.Revision, want)
			}
			want = e.Revision + 1
		}
	}
	if got, expected := fmt.Sprint(sizes), "[1000 1000 500 1]"; got != expected {
		t.Errorf("got = batches of %s events, expected: %s", got, expected)
	}
}

// A feed with nothing to hand over answers Mark with its level once it
// has looked at every event up to the mark, and not before.
func TestFeedMarkAsksForTheLevel(t *testing.T) {
	n := newNode(0)
	f := open(t, n, 0, prefix("k"))
	n.put(t, "other")
	var g int64
	_ = n.Read(context.Background(), true, func(m *statemachine.Machine) error {
		g = m.Revision()
		return nil
	})
	f.Mark(g + 1) // not published yet
	if !blocks(f) {
		t.Fatal("Next handed something over before the mark was published")
	}
	n.put(t, "other2")
	b := next(t, f)
	if len(b.Events) != 0 || b.Level < g+1 {
		t.Fatalf("got = %s level %d, expected: no events, level %d or more", show(b), b.Level, g+1)
	}
	if !blocks(f) {
		t.Error("a mark answered twice")
	}
}

// Before cluster version 5 keys take the global revision, and a feed
// serves from the hub's history by the same rule; raising the version
// mid-feed changes nothing for it.
func TestFeedAcrossTheKeysClockChange(t *testing.T) {
	n := &node{m: statemachine.New(), hub: watch.NewHub(0)}
	r1 := n.put(t, "k")
	n.apply(statemachine.OpenSession{Identity: "x", TTL: int64(time.Minute)})
	r2 := n.put(t, "k")
	f := open(t, n, r1, prefix("k"))
	expect(t, f, fmt.Sprintf("@%d: PUT k@%d", r1, r1))
	expect(t, f, fmt.Sprintf("@%d: PUT k@%d", r2, r2))
	n.apply(statemachine.SetVersion{Version: statemachine.Version})
	r3 := n.put(t, "k")
	if r3 <= r2 {
		t.Fatalf("got = revision %d after %d, expected: later", r3, r2)
	}
	expect(t, f, fmt.Sprintf("@%d: PUT k@%d", r3, r3))
}

// A feed of one key is woken by its key's events only, and does not lag
// for the others, more than the hub keeps; a Mark still has its Level
// once the revision is published, though no event of the key comes: the
// hub wakes the waiting feed at that revision.
func TestFeedOfOneKeyAnswersAMarkWithoutEventsOfItsKey(t *testing.T) {
	n := newNode(4)
	f, err := OpenKey(testCtx(t), n, 0, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	for range 10 {
		n.put(t, "other")
	}
	n.put(t, "k/under") // a key under it is not it
	r := n.put(t, "k")
	expect(t, f, fmt.Sprintf("@%d: PUT k@%d", r, r))

	g := n.hub.Revision()
	f.Mark(g + 1) // not published yet
	got := make(chan Batch, 1)
	go func() {
		b, err := f.Next(testCtx(t))
		if err != nil {
			b.Level = -1
		}
		got <- b
	}()
	select {
	case b := <-got:
		t.Fatalf("Next handed over %s level %d before the mark was published", show(b), b.Level)
	case <-time.After(50 * time.Millisecond):
	}
	n.put(t, "other")
	b := <-got
	if len(b.Events) != 0 || b.Level < g+1 {
		t.Fatalf("got = %s level %d, expected: no events, level %d or more", show(b), b.Level, g+1)
	}
	if !blocks(f) {
		t.Error("a mark answered twice")
	}
}
