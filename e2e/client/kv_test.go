package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
)

func TestKVGetPutRangeDelete(t *testing.T) {
	addr := startServer(t)
	kv := newClient(t, addr).KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if _, err := kv.Get(ctx, "a/1"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("got = %v, expected: ErrNotFound", err)
	}
	var last int64
	for _, k := range []string{"a/2", "a/1", "a/3", "b/1"} {
		rev, err := kv.Put(ctx, k, "v-"+k)
		if err != nil {
			t.Fatal(err)
		}
		if rev <= last {
			t.Fatalf("got = revision %d for %s, expected: above %d", rev, k, last)
		}
		last = rev
	}
	first, err := kv.Get(ctx, "a/1")
	if err != nil {
		t.Fatal(err)
	}
	if first.Key != "a/1" || first.Value != "v-a/1" || first.Version != 1 || first.CreateRevision != first.ModRevision || first.TTL != 0 || first.SessionID != 0 {
		t.Fatalf("got = %+v, expected: a/1=v-a/1 version 1, created at its mod revision", first)
	}
	rev, err := kv.Put(ctx, "a/1", "again")
	if err != nil {
		t.Fatal(err)
	}
	again, err := kv.Get(ctx, "a/1")
	if err != nil {
		t.Fatal(err)
	}
	if again.Value != "again" || again.Version != 2 || again.CreateRevision != first.CreateRevision || again.ModRevision != rev {
		t.Fatalf("got = %+v, expected: version 2, created at %d, modified at %d", again, first.CreateRevision, rev)
	}

	kvs, rrev, more, err := kv.Range(ctx, "a/", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(kvs); strings.Join(got, ",") != "a/1,a/2,a/3" || more || rrev < rev {
		t.Fatalf("got = %v more %v revision %d, expected: [a/1 a/2 a/3] sorted, no more, revision >= %d", got, more, rrev, rev)
	}
	kvs, _, more, err = kv.Range(ctx, "a/", 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(kvs); strings.Join(got, ",") != "a/1,a/2" || !more {
		t.Fatalf("got = %v more %v, expected: [a/1 a/2], more", got, more)
	}

	if n, err := kv.Delete(ctx, "a/1"); err != nil || n != 1 {
		t.Fatalf("got = %d, %v, expected: 1 deleted", n, err)
	}
	if _, err := kv.Get(ctx, "a/1"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("got = %v after Delete, expected: ErrNotFound", err)
	}
	if n, err := kv.Delete(ctx, "a/1"); err != nil || n != 0 {
		t.Fatalf("got = %d, %v for a missing key, expected: 0 deleted", n, err)
	}
	if n, err := kv.DeletePrefix(ctx, "a/"); err != nil || n != 2 {
		t.Fatalf("got = %d, %v, expected: 2 deleted", n, err)
	}
	kvs, _, _, err = kv.Range(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(kvs); strings.Join(got, ",") != "b/1" {
		t.Fatalf("got = %v, expected: only b/1 left", got)
	}
}

func keysOf(kvs []client.KeyValue) []string {
	out := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, kv.Key)
	}
	return out
}

// TestKVKeyTTL: a key with a TTL of its own expires no earlier than the
// TTL after its write, with an EXPIRE event.
func TestKVKeyTTL(t *testing.T) {
	addr := startServer(t)
	kv := newClient(t, addr).KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const ttl = 300 * time.Millisecond

	written := time.Now()
	rev, err := kv.Put(ctx, "ttl/k", "v", client.WithKeyTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	events := kv.Watch(ctx, "ttl/k", client.WithRevision(rev+1))
	got, err := kv.Get(ctx, "ttl/k")
	if err != nil {
		t.Fatal(err)
	}
	if got.TTL != ttl {
		t.Fatalf("got = TTL %v, expected: %v", got.TTL, ttl)
	}
	select {
	case ev := <-events:
		expired := time.Since(written)
		if ev.Err != nil || ev.Type != client.EventExpire || ev.KV.Key != "ttl/k" || ev.Revision <= rev {
			t.Fatalf("got = %+v, expected: EXPIRE of ttl/k after revision %d", ev, rev)
		}
		t.Logf("expired %v after the write", expired)
		if expired < ttl {
			t.Fatalf("got = expired %v after the write, expected: at least the TTL %v", expired, ttl)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("got = no event 5s after the write, expected: EXPIRE")
	}
	if _, err := kv.Get(ctx, "ttl/k"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("got = %v after expiry, expected: ErrNotFound", err)
	}
}

// TestKVSessionBoundKey: a key bound to a session lives while the
// session does and vanishes when it closes.
func TestKVSessionBoundKey(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	kv := c.KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Long enough that a loaded machine does not starve the heartbeats
	// that are to keep the keys.
	const ttl = time.Second
	s, err := c.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "bound/put", "v", client.WithSession(s))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.CompareAndSwap(ctx, "bound/cas", client.Absent(), "v", client.WithSession(s)); err != nil {
		t.Fatal(err)
	}
	got, err := kv.Get(ctx, "bound/put")
	if err != nil {
		t.Fatal(err)
	}
	if got.SessionID != s.ID() {
		t.Fatalf("got = session %d, expected: %d", got.SessionID, s.ID())
	}
	// Heartbeats keep it past the TTL.
	time.Sleep(3 * ttl)
	if kvs, _, _, err := kv.Range(ctx, "bound/", 0); err != nil || len(kvs) != 2 {
		t.Fatalf("got = %v, %v after 3 TTLs, expected: both keys kept by heartbeats", keysOf(kvs), err)
	}

	events := kv.Watch(ctx, "bound/", client.WithPrefix(), client.WithRevision(rev+1))
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]client.EventType{}
	for len(seen) < 2 {
		select {
		case ev := <-events:
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			if ev.Type != client.EventPut {
				seen[ev.KV.Key] = ev.Type
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("got = removals %v 5s after Close, expected: both keys", seen)
		}
	}
	if kvs, _, _, err := kv.Range(ctx, "bound/", 0); err != nil || len(kvs) != 0 {
		t.Fatalf("got = %v, %v after Close, expected: no keys", keysOf(kvs), err)
	}
	// A closed session can bind nothing.
	if _, err := kv.Put(ctx, "bound/late", "v", client.WithSession(s)); !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("got = %v, expected: ErrSessionExpired", err)
	}
	if _, err := kv.Get(ctx, "bound/late"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("got = %v, expected: ErrNotFound (nothing written)", err)
	}
}

func TestKVCompareAndSwap(t *testing.T) {
	addr := startServer(t)
	kv := newClient(t, addr).KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	created, err := kv.CompareAndSwap(ctx, "cas", client.Absent(), "one")
	if err != nil {
		t.Fatal(err)
	}
	if created.Value != "one" || created.Version != 1 || created.ModRevision == 0 {
		t.Fatalf("got = %+v, expected: one at version 1", created)
	}

	for _, tc := range []struct {
		name  string
		cmp   client.Compare
		value string
		// ok says whether the compare holds; when it does not,
		// the error must carry the key as it was.
		ok bool
	}{
		{"absent fails on an existing key", client.Absent(), "x", false},
		{"a wrong value fails", client.ValueIs("two"), "x", false},
		{"the right value swaps", client.ValueIs("one"), "two", true},
		{"a stale mod revision fails", client.ModRevisionIs(created.ModRevision), "x", false},
		{"mod revision 0 fails on an existing key", client.ModRevisionIs(0), "x", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := kv.Get(ctx, "cas")
			if err != nil {
				t.Fatal(err)
			}
			got, err := kv.CompareAndSwap(ctx, "cas", tc.cmp, tc.value)
			if tc.ok {
				if err != nil || got.Value != tc.value || got.ModRevision <= before.ModRevision || got.Version != before.Version+1 {
					t.Fatalf("got = %+v, %v, expected: %s at version %d", got, err, tc.value, before.Version+1)
				}
				return
			}
			var cf *client.CompareFailedError
			if !errors.Is(err, client.ErrCompareFailed) || !errors.As(err, &cf) {
				t.Fatalf("got = %v, expected: a CompareFailedError", err)
			}
			if !cf.Found || cf.Current != before || cf.Revision < before.ModRevision {
				t.Fatalf("got = current %+v found %v revision %d, expected: %+v found, revision >= %d", cf.Current, cf.Found, cf.Revision, before, before.ModRevision)
			}
			var te *client.Error
			if !errors.As(err, &te) || te.Op != "CompareAndSwap" {
				t.Fatalf("got = %#v, expected: a *client.Error for CompareAndSwap", err)
			}
			if after, _ := kv.Get(ctx, "cas"); after != before {
				t.Fatalf("got = %+v after a failed compare, expected: unchanged %+v", after, before)
			}
		})
	}

	cur, err := kv.Get(ctx, "cas")
	if err != nil {
		t.Fatal(err)
	}
	swapped, err := kv.CompareAndSwap(ctx, "cas", client.ModRevisionIs(cur.ModRevision), "three")
	if err != nil || swapped.Value != "three" {
		t.Fatalf("got = %+v, %v, expected: three written at the current mod revision", swapped, err)
	}
	if err := kv.CompareAndDelete(ctx, "cas", client.ModRevisionIs(cur.ModRevision)); !errors.Is(err, client.ErrCompareFailed) {
		t.Fatalf("got = %v deleting at a stale revision, expected: ErrCompareFailed", err)
	}
	if err := kv.CompareAndDelete(ctx, "cas", client.ValueIs("three")); err != nil {
		t.Fatal(err)
	}
	_, err = kv.CompareAndSwap(ctx, "cas", client.ValueIs("three"), "four")
	var cf *client.CompareFailedError
	if !errors.As(err, &cf) || cf.Found || cf.Revision == 0 {
		t.Fatalf("got = %v (%+v), expected: compare failed on an absent key, not found", err, cf)
	}
	if _, err := kv.CompareAndSwap(ctx, "cas", client.ModRevisionIs(0), "five"); err != nil {
		t.Fatalf("got = %v, expected: mod revision 0 holds for an absent key", err)
	}
}

// TestKVWatchFromRevision: a watch replays history from a revision and
// then follows live changes, every event in revision order, and a
// single-key watch sees only its key.
func TestKVWatchFromRevision(t *testing.T) {
	addr := startServer(t)
	kv := newClient(t, addr).KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, start, _, err := kv.Range(ctx, "w/", 0)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		typ client.EventType
		key string
		rev int64
	}
	var all []want
	put := func(k, v string) {
		rev, err := kv.Put(ctx, k, v)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, want{client.EventPut, k, rev})
	}
	put("w/a", "1")
	put("w/b", "1")
	put("w/a", "2")
	for range 20 {
		put("w/b", "n")
	}
	swapped, err := kv.CompareAndSwap(ctx, "w/a", client.ValueIs("2"), "3")
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, want{client.EventPut, "w/a", swapped.ModRevision})
	if _, err := kv.Put(ctx, "other", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Delete(ctx, "w/b"); err != nil {
		t.Fatal(err)
	}
	_, rev, _, err := kv.Range(ctx, "w/", 0)
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, want{client.EventDelete, "w/b", rev})

	check := func(t *testing.T, events <-chan client.WatchEvent, expected []want) {
		t.Helper()
		for i, w := range expected {
			select {
			case ev := <-events:
				if ev.Err != nil || ev.Type != w.typ || ev.KV.Key != w.key || ev.Revision != w.rev {
					t.Fatalf("event %d: got = %v %s at %d (err %v), expected: %v %s at %d", i, ev.Type, ev.KV.Key, ev.Revision, ev.Err, w.typ, w.key, w.rev)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("event %d: got = nothing in 5s, expected: %v %s at %d", i, w.typ, w.key, w.rev)
			}
		}
	}

	t.Run("a prefix watch replays every event in order, then follows", func(t *testing.T) {
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		events := kv.Watch(wctx, "w/", client.WithPrefix(), client.WithRevision(start+1))
		check(t, events, all)
		rev, err := kv.Put(ctx, "w/c", "live")
		if err != nil {
			t.Fatal(err)
		}
		check(t, events, []want{{client.EventPut, "w/c", rev}})
		wcancel()
		select {
		case _, open := <-events:
			if open {
				// At most one event may have been under way; then it closes.
				if _, open = <-events; open {
					t.Fatal("got = channel open after cancel, expected: closed")
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatal("got = channel open 5s after cancel, expected: closed")
		}
	})

	t.Run("a key watch sees only its key", func(t *testing.T) {
		var onlyA []want
		for _, w := range all {
			if w.key == "w/a" {
				onlyA = append(onlyA, w)
			}
		}
		check(t, kv.Watch(ctx, "w/a", client.WithRevision(start+1)), onlyA)
	})

	t.Run("a watch of an invalid key ends with ErrInvalidArgument", func(t *testing.T) {
		events := kv.Watch(ctx, "")
		select {
		case ev := <-events:
			if !errors.Is(ev.Err, client.ErrInvalidArgument) {
				t.Fatalf("got = %+v, expected: ErrInvalidArgument", ev)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("got = nothing in 5s, expected: ErrInvalidArgument")
		}
		if _, open := <-events; open {
			t.Fatal("got = channel open after the error, expected: closed")
		}
	})
}

// TestErrorsAcrossTheNetwork: each sentinel survives the trip from the
// server's error table to errors.Is in the caller.
func TestErrorsAcrossTheNetwork(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	kv := c.KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	closed, err := c.NewSession(ctx, client.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// A revoked leader's Proclaim names a token that is no longer held.
	s := newSession(t, c, client.WithTTL(2*time.Second))
	e := s.Election("errors")
	if err := e.Campaign(ctx, "me"); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	leases := tenurev1connect.NewLeaseServiceClient(&http.Client{Transport: tr}, "http://"+addr)
	if _, err := leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Namespace: "default", Name: "errors"})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("got = leadership not lost 5s after the revoke, expected: lost")
	}

	closedClient, err := client.New(ctx, []string{deadAddr(t)}, client.WithRetry(2, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	closedClient.Close()

	for _, tc := range []struct {
		name     string
		call     func() error
		expected []error
		op       string
	}{
		{"Get of a missing key is ErrNotFound", func() error { _, err := kv.Get(ctx, "missing"); return err }, []error{client.ErrNotFound}, "Get"},
		{"Put of an empty key is ErrInvalidArgument", func() error { _, err := kv.Put(ctx, "", "v"); return err }, []error{client.ErrInvalidArgument}, "Put"},
		{"Put of a value over 64 KiB is ErrInvalidArgument", func() error {
			_, err := kv.Put(ctx, "big", strings.Repeat("x", 64<<10+1))
			return err
		}, []error{client.ErrInvalidArgument}, "Put"},
		{"Put with a key TTL under the minimum is ErrInvalidArgument", func() error {
			_, err := kv.Put(ctx, "short", "v", client.WithKeyTTL(time.Millisecond))
			return err
		}, []error{client.ErrInvalidArgument}, "Put"},
		{"DeletePrefix of everything is ErrInvalidArgument", func() error { _, err := kv.DeletePrefix(ctx, ""); return err }, []error{client.ErrInvalidArgument}, "Delete"},
		{"a failed compare is ErrCompareFailed", func() error {
			_, err := kv.CompareAndSwap(ctx, "missing", client.ValueIs("x"), "y")
			return err
		}, []error{client.ErrCompareFailed}, "CompareAndSwap"},
		{"Put bound to a closed session is ErrSessionExpired", func() error {
			_, err := kv.Put(ctx, "k", "v", client.WithSession(closed))
			return err
		}, []error{client.ErrSessionExpired}, "Put"},
		{"a lock on a bad namespace is ErrInvalidArgument", func() error {
			return s.Mutex("m", client.WithNamespace("Not A Label")).TryLock(ctx)
		}, []error{client.ErrInvalidArgument}, "Acquire"},
		{"Proclaim with a revoked grant is ErrNotLeader and ErrNotHolder", func() error { return e.Proclaim(ctx, "still me?") }, []error{client.ErrNotLeader, client.ErrNotHolder}, "Proclaim"},
		{"a call on a closed client is ErrClosed", func() error { _, err := closedClient.KV().Get(ctx, "k"); return err }, []error{client.ErrClosed}, "Get"},
		{"a call with every endpoint down is ErrUnavailable", func() error {
			c, err := client.New(ctx, []string{deadAddr(t)}, client.WithRetry(2, 10*time.Millisecond))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.KV().Put(ctx, "k", "v")
			return err
		}, []error{client.ErrUnavailable}, "Put"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			for _, want := range tc.expected {
				if !errors.Is(err, want) {
					t.Fatalf("got = %v, expected: %v", err, want)
				}
			}
			var te *client.Error
			if !errors.As(err, &te) || te.Op != tc.op {
				t.Fatalf("got = %#v, expected: a *client.Error for %s", err, tc.op)
			}
		})
	}
}

// TestCloseLeavesNoGoroutines opens a client, sessions, locks and
// watches, closes everything, and checks that no goroutine of the client
// is left behind.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	addr := startServer(t)
	ignore := goleak.IgnoreCurrent()
	t.Run("use and close everything", func(t *testing.T) {
		c := newClient(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a := newSession(t, c, client.WithTTL(time.Second))
		b := newSession(t, c, client.WithTTL(time.Second))
		m := a.Mutex("leak", client.WithWatchdog(func() {}))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		waiting := make(chan error, 1)
		go func() { waiting <- b.Mutex("leak").Lock(ctx) }()
		sem := b.Semaphore("leak-sem", 2)
		if err := sem.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		rw := a.RWMutex("leak-rw")
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		events := c.KV().Watch(wctx, "leak/", client.WithPrefix())
		if _, err := c.KV().Put(ctx, "leak/k", "v", client.WithSession(a)); err != nil {
			t.Fatal(err)
		}
		// The watch may have started after the put; either way it is
		// running. Closing the session deletes the key.
		if err := a.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-waiting; err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-events:
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("got = no watch event in 5s, expected: the session's key deleted")
		}
		wcancel()
		for range events {
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	})
	goleak.VerifyNone(t, ignore)
}

// TestKVWatchSeesWritesAfterItReturns: a watch without a start revision
// starts when Watch returns, so a write made right after is delivered —
// the etcd habit of watching, then reading or writing, must not race.
func TestKVWatchSeesWritesAfterItReturns(t *testing.T) {
	addr := startServer(t)
	kv := newClient(t, addr).KV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 20 {
		key := fmt.Sprintf("after/%d", i)
		wctx, wcancel := context.WithCancel(ctx)
		events := kv.Watch(wctx, key)
		rev, err := kv.Put(ctx, key, "v")
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-events:
			if ev.Err != nil || ev.Type != client.EventPut || ev.Revision != rev {
				t.Fatalf("round %d: got = %+v, expected: PUT at %d", i, ev, rev)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("round %d: got = no event 2s after a Put made once Watch returned, expected: PUT at %d", i, rev)
		}
		wcancel()
		for range events {
		}
	}
}
