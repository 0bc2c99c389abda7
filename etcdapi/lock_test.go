package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// lockResult is what a Lock call running apart returned.
type lockResult struct {
	resp *v3lockpb.LockResponse
	err  error
}

func lockAsync(ctx context.Context, lc v3lockpb.LockClient, name string, lease clientv3.LeaseID) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		resp, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte(name), Lease: int64(lease)})
		ch <- lockResult{resp, err}
	}()
	return ch
}

// waitForKey waits until key exists: a contender has joined the queue.
func waitForKey(t *testing.T, f *fakeBackend, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !keyExists(t, f, key) {
		if time.Now().After(deadline) {
			t.Fatalf("key %q never appeared", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func grantN(t *testing.T, c *clientv3.Client, n int) []clientv3.LeaseID {
	t.Helper()
	var ids []clientv3.LeaseID
	for range n {
		g, err := c.Grant(context.Background(), 30)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, g.ID)
	}
	return ids
}

func lockKey(name string, lease clientv3.LeaseID) string { return fmt.Sprintf("%s/%x", name, lease) }

func TestLockService(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	lc := v3lockpb.NewLockClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases := grantN(t, c, 3)
	a, b, d := leases[0], leases[1], leases[2]

	held, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("job"), Lease: int64(a)})
	if err != nil {
		t.Fatal(err)
	}
	if string(held.Key) != lockKey("job", a) || held.Header.Revision != f.m.KVRevision() {
		t.Fatalf("got = key %q at %d, expected: %q at %d", held.Key, held.Header.Revision, lockKey("job", a), f.m.KVRevision())
	}

	t.Run("a second contender waits until the holder unlocks", func(t *testing.T) {
		ch := lockAsync(ctx, lc, "job", b)
		waitForKey(t, f, lockKey("job", b))
		select {
		case r := <-ch:
			t.Fatalf("got = %v, %v while the lock was held, expected: to wait", r.resp, r.err)
		default:
		}
		if _, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: held.Key}); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		if r.err != nil || string(r.resp.Key) != lockKey("job", b) {
			t.Fatalf("got = %v, %v, expected: key %q", r.resp, r.err, lockKey("job", b))
		}
		held = r.resp
	})
	t.Run("a contender that gives up leaves the queue", func(t *testing.T) {
		wctx, wcancel := context.WithCancel(ctx)
		ch := lockAsync(wctx, lc, "job", d)
		waitForKey(t, f, lockKey("job", d))
		wcancel()
		r := <-ch
		if status.Code(r.err) != codes.Canceled {
			t.Errorf("got = %v, expected: Canceled", r.err)
		}
		waitForGone(t, f, lockKey("job", d))
	})
	t.Run("a contender whose lease expires while it waits is told so", func(t *testing.T) {
		ch := lockAsync(ctx, lc, "job", d)
		waitForKey(t, f, lockKey("job", d))
		s, _ := sessionOf(t, f, d)
		f.expire(s.ID)
		if _, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: held.Key}); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		wantStatus(t, r.err, codes.Unknown, "mutex: session is expired")
	})
	t.Run("an unknown lease is refused", func(t *testing.T) {
		_, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("job"), Lease: 0x5151})
		// etcd's server runs the recipe on a client of itself, whose
		// errors reach the caller as codes.Unknown with etcd's text.
		wantStatus(t, err, codes.Unknown, "etcdserver: requested lease not found")
	})
	t.Run("lease 0 gets a lease of its own, of concurrency's default TTL", func(t *testing.T) {
		resp, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("solo")})
		if err != nil {
			t.Fatal(err)
		}
		var kv statemachine.KeyValue
		_ = f.Read(ctx, false, func(m *statemachine.Machine) error {
			return m.RangeKeys(string(resp.Key), "", 0, func(k statemachine.KeyValue) bool { kv = k; return false })
		})
		ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(kv.EtcdLease()))
		if err != nil || ttl.GrantedTTL != recipeSessionTTL || string(resp.Key) != lockKey("solo", clientv3.LeaseID(kv.EtcdLease())) {
			t.Errorf("got = key %q lease %x granted %v (%v), expected: a 60 s lease named in the key", resp.Key, kv.EtcdLease(), ttl, err)
		}
	})
	t.Run("a caller without access is refused and nothing is written", func(t *testing.T) {
		f.deny = true
		defer func() { f.deny = false }()
		before := f.m.KVRevision()
		_, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("other"), Lease: int64(a)})
		wantStatus(t, err, codes.Unknown, "etcdserver: permission denied")
		if f.m.KVRevision() != before {
			t.Errorf("got = revision %d, expected: %d", f.m.KVRevision(), before)
		}
	})
}

func waitForGone(t *testing.T, f *fakeBackend, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for keyExists(t, f, key) {
		if time.Now().After(deadline) {
			t.Fatalf("key %q was never deleted", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLockTakesTurnsWithMutexKeys checks the key layout and order
// clientv3/concurrency's Mutex uses, written to the store as its Txn
// writes them: the Lock service waits behind an older mutex key and
// takes the lock once that key is deleted.
func TestLockTakesTurnsWithMutexKeys(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	lc := v3lockpb.NewLockClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases := grantN(t, c, 2)
	mutexLease, svcLease := leases[0], leases[1]

	putWithLease(t, f, lockKey("shared", mutexLease), mutexLease)
	ch := lockAsync(ctx, lc, "shared", svcLease)
	waitForKey(t, f, lockKey("shared", svcLease))
	// Another name's key does not hold this one up.
	putWithLease(t, f, lockKey("shared2", mutexLease), mutexLease)
	select {
	case r := <-ch:
		t.Fatalf("got = %v, %v while the mutex held the lock, expected: to wait", r.resp, r.err)
	default:
	}
	if res := f.apply(deleteKey(lockKey("shared", mutexLease))); res.Err != nil {
		t.Fatal(res.Err)
	}
	r := <-ch
	if r.err != nil || string(r.resp.Key) != lockKey("shared", svcLease) {
		t.Fatalf("got = %v, %v, expected: key %q", r.resp, r.err, lockKey("shared", svcLease))
	}
}

// TestLockWithConcurrencyMutex runs etcd's own Mutex against the Lock
// service on one name: each excludes the other. The Mutex needs the KV
// and Watch services; the test is skipped where they are missing.
func TestLockWithConcurrencyMutex(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	lc := v3lockpb.NewLockClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	skipWithoutKVAndWatch(t, c)
	s, err := concurrency.NewSession(c, concurrency.WithTTL(30))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, "shared")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	svcLease := grantN(t, c, 1)[0]
	ch := lockAsync(ctx, lc, "shared", svcLease)
	waitForKey(t, f, lockKey("shared", svcLease))
	select {
	case r := <-ch:
		t.Fatalf("got = %v, %v while the Mutex held the lock, expected: to wait", r.resp, r.err)
	default:
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	// Now the service holds it: the Mutex must wait, and TryLock fail.
	other := concurrency.NewMutex(s, "shared")
	if err := other.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Errorf("TryLock: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	locked := make(chan error, 1)
	go func() { locked <- m.Lock(ctx) }()
	waitForKey(t, f, lockKey("shared", s.Lease()))
	select {
	case err := <-locked:
		t.Fatalf("Mutex.Lock got = %v while the service held the lock, expected: to wait", err)
	default:
	}
	if _, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: r.resp.Key}); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("Mutex.Lock after the service unlocked: %v", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// skipWithoutKVAndWatch skips t where the KV or Watch service is not
// served yet: etcd's concurrency package needs both.
func skipWithoutKVAndWatch(t *testing.T, c *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pb.NewKVClient(c.ActiveConnection()).Range(ctx, &pb.RangeRequest{Key: []byte("probe")}); status.Code(err) == codes.Unimplemented {
		t.Skipf("the KV service is not served yet: %v", err)
	}
	ws, err := pb.NewWatchClient(c.ActiveConnection()).Watch(ctx)
	if err == nil {
		err = ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("probe")}}})
	}
	if err == nil {
		_, err = ws.Recv()
	}
	if status.Code(err) == codes.Unimplemented {
		t.Skipf("the Watch service is not served yet: %v", err)
	}
}

// TestLockExclusionMixed has etcd's Mutex and the Lock service contend
// for one name in rounds: never two holders at once.
func TestLockExclusionMixed(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	skipWithoutKVAndWatch(t, c)
	lc := v3lockpb.NewLockClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const rounds = 5
	var (
		holders atomic.Int32
		overlap atomic.Bool
		wg      sync.WaitGroup
	)
	critical := func() {
		if holders.Add(1) != 1 {
			overlap.Store(true)
		}
		runtime.Gosched()
		holders.Add(-1)
	}
	errs := make(chan error, 4)
	for range 2 {
		s, err := concurrency.NewSession(c, concurrency.WithTTL(30))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := concurrency.NewMutex(s, "mixed")
			for range rounds {
				if err := m.Lock(ctx); err != nil {
					errs <- fmt.Errorf("Mutex.Lock: %w", err)
					return
				}
				critical()
				if err := m.Unlock(ctx); err != nil {
					errs <- fmt.Errorf("Mutex.Unlock: %w", err)
					return
				}
			}
		}()
	}
	for _, lease := range grantN(t, c, 2) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				resp, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("mixed"), Lease: int64(lease)})
				if err != nil {
					errs <- fmt.Errorf("Lock: %w", err)
					return
				}
				critical()
				if _, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: resp.Key}); err != nil {
					errs <- fmt.Errorf("Unlock: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlap.Load() {
		t.Error("got = two holders at once, expected: one at a time")
	}
}
