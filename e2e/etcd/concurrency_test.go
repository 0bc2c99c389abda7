//go:build linux

package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/testnet"
)

// These tests run etcd's own Go client and its concurrency recipes
// (Mutex, Election, Session, STM) against one Tenure node, as programs
// written for etcd use them: nothing in them knows the server is not etcd
// (TestConcurrency runs them against a real etcd too).

// tenureServer is one Tenure node with fixed ports and data dir, so that
// it can be killed and started again as the same node.
type tenureServer struct {
	t               *testing.T
	api, peer, etcd string
	dir             string
	starts          int
	p               *proc
}

// newTenureServer starts a Tenure node serving the etcd API on free
// loopback ports, killed at cleanup.
func newTenureServer(t *testing.T) *tenureServer {
	t.Helper()
	addrs := testnet.FreeN(t, 3)
	s := &tenureServer{t: t, api: addrs[0], peer: addrs[1], etcd: addrs[2], dir: t.TempDir()}
	s.start()
	return s
}

// start runs the node (again) and returns once its API is ready and its
// etcd listener accepts connections.
func (s *tenureServer) start() {
	t := s.t
	t.Helper()
	s.starts++
	// No automatic compaction, as startTenure: a watch must be able to
	// resume from any revision.
	args := []string{"serve",
		"--listen", s.api, "--peer-listen", s.peer, "--etcd-listen", s.etcd,
		"--data-dir", filepath.Join(s.dir, "data"), "--auto-compaction-retention", "0",
	}
	s.p = startProc(t, "tenure", tenureBinary(t), args, filepath.Join(s.dir, fmt.Sprintf("tenure-%d.log", s.starts)))
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	s.p.waitFor(t, func() bool {
		resp, err := hc.Get("http://" + s.api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		c, err := net.DialTimeout("tcp", s.etcd, 500*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// kill ends the node with SIGKILL and waits for it to be gone.
func (s *tenureServer) kill() {
	_ = s.p.cmd.Process.Kill()
	<-s.p.exited
}

func (s *tenureServer) target() target { return target{name: "tenure", addr: s.etcd} }

// newSession opens a concurrency session of ttl seconds on c.
func newSession(t *testing.T, c *clientv3.Client, ttl int) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatalf("concurrency.NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// keysUnder lists the keys under prefix, oldest creation first.
func keysUnder(t *testing.T, c *clientv3.Client, prefix string) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := c.Get(ctxT(t), prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get %s*: %v", prefix, err)
	}
	return resp.Kvs
}

// TestConcurrency runs the recipes against Tenure and, as a reference
// that keeps the tests honest about etcd's behaviour, against a real etcd
// when TENURE_ETCD_REFERENCE is set (the long run; the README's test
// command leaves it out for time).
func TestConcurrency(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	servers := []string{"tenure"}
	if os.Getenv("TENURE_ETCD_REFERENCE") != "" {
		servers = append(servers, "etcd")
	}
	for _, server := range servers {
		t.Run(server, func(t *testing.T) {
			var tg target
			if server == "tenure" {
				tg = newTenureServer(t).target()
			} else {
				tg = target{name: "etcd", addr: startEtcd(t)}
			}
			t.Run("MutexExclusion", func(t *testing.T) { testMutexExclusion(t, tg) })
			t.Run("TryLock", func(t *testing.T) { testTryLock(t, tg) })
			t.Run("LockCancelled", func(t *testing.T) { testLockCancelled(t, tg) })
			t.Run("Election", func(t *testing.T) { testElection(t, tg) })
			t.Run("SessionExpiry", func(t *testing.T) { testSessionExpiry(t, tg) })
			t.Run("EndedSession", func(t *testing.T) { testEndedSession(t, tg) })
			for _, iso := range []struct {
				name  string
				level concurrency.Isolation
			}{
				{"SerializableSnapshot", concurrency.SerializableSnapshot},
				{"Serializable", concurrency.Serializable},
				{"RepeatableReads", concurrency.RepeatableReads},
				{"ReadCommitted", concurrency.ReadCommitted},
			} {
				t.Run("STM/"+iso.name, func(t *testing.T) { testSTM(t, tg, iso.name, iso.level) })
			}
			t.Run("TxnCAS", func(t *testing.T) { testTxnCAS(t, tg) })
		})
	}
}

// Sessions on clients of their own take one mutex in turns: never two
// holders, every holder's lock key created after the previous holder's,
// and every holder's write guarded by IsOwner accepted.
func testMutexExclusion(t *testing.T, tg target) {
	const workers, rounds = 8, 5
	const name, counter = "mutex-excl", "mutex-excl-counter"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var (
		holders atomic.Int32
		mu      sync.Mutex // for the race detector: etcd's lock is invisible to it
		lastRev int64
		held    int
	)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, tg)
		sess := newSession(t, c, 10)
		wg.Go(func() {
			errc <- func() error {
				for r := range rounds {
					m := concurrency.NewMutex(sess, name)
					if err := m.Lock(ctx); err != nil {
						return fmt.Errorf("worker %d round %d: lock: %w", w, r, err)
					}
					if n := holders.Add(1); n != 1 {
						return fmt.Errorf("worker %d round %d: %d holders at once", w, r, n)
					}
					resp, err := c.Get(ctx, m.Key())
					if err != nil {
						return fmt.Errorf("get own lock key: %w", err)
					}
					if len(resp.Kvs) != 1 {
						return fmt.Errorf("worker %d: lock key %s absent while held", w, m.Key())
					}
					kv := resp.Kvs[0]
					if kv.Lease != int64(sess.Lease()) {
						return fmt.Errorf("lock key %s: lease = %x, expected: %x", m.Key(), kv.Lease, sess.Lease())
					}
					mu.Lock()
					prev := lastRev
					lastRev = kv.CreateRevision
					held++
					n := held
					mu.Unlock()
					if kv.CreateRevision <= prev {
						return fmt.Errorf("worker %d: lock key created at revision %d, after a holder whose key was created at %d", w, kv.CreateRevision, prev)
					}
					tr, err := c.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(counter, strconv.Itoa(n))).Commit()
					if err != nil {
						return fmt.Errorf("guarded put: %w", err)
					}
					if !tr.Succeeded {
						return fmt.Errorf("worker %d: write guarded by IsOwner refused while holding the lock", w)
					}
					time.Sleep(time.Duration(rand.N(3)) * time.Millisecond)
					holders.Add(-1)
					if err := m.Unlock(ctx); err != nil {
						return fmt.Errorf("unlock: %w", err)
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	c := newClient(t, tg)
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 0 {
		t.Errorf("lock keys left after every holder unlocked: %d (first %q)", len(kvs), kvs[0].Key)
	}
	resp, err := c.Get(ctx, counter)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != strconv.Itoa(workers*rounds) {
		t.Errorf("guarded counter: got = %v, expected: %d", resp.Kvs, workers*rounds)
	}
}

// TryLock answers ErrLocked while another session holds the mutex and
// leaves no key of its own behind; it takes the mutex once it is free.
func testTryLock(t *testing.T, tg target) {
	const name = "trylock"
	ctx := ctxT(t)
	c := newClient(t, tg)
	m1 := concurrency.NewMutex(newSession(t, c, 10), name)
	m2 := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := m1.TryLock(ctx); err != nil {
		t.Fatalf("first TryLock of a free mutex: %v", err)
	}
	held := m1.Key()
	if err := m2.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock of a held mutex: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != held {
		t.Fatalf("keys after a refused TryLock: got = %v, expected: only the holder's %s", kvs, held)
	}
	// The holder's own session trying again still holds it.
	if err := m1.TryLock(ctx); err != nil {
		t.Fatalf("TryLock by the holder's session: %v", err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(ctx); err != nil {
		t.Fatalf("TryLock of a mutex just unlocked: %v", err)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != m2.Key() {
		t.Fatalf("keys after the second session took the lock: got = %v, expected: only %s", kvs, m2.Key())
	}
	if err := m1.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock by the former holder: got = %v, expected: %v", err, concurrency.ErrLocked)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Lock whose context ends while it waits returns the context's error
// and deletes its key, so that it does not stand in line for ever.
func testLockCancelled(t *testing.T, tg target) {
	const name = "lock-cancelled"
	ctx := ctxT(t)
	c := newClient(t, tg)
	holder := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	waiter := concurrency.NewMutex(newSession(t, c, 10), name)
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := waiter.Lock(dctx)
	dcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock until its deadline: got = %v, expected: %v", err, context.DeadlineExceeded)
	}
	canceller := concurrency.NewMutex(newSession(t, c, 10), name)
	cctx, ccancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, ccancel)
	err = canceller.Lock(cctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock cancelled: got = %v, expected: %v", err, context.Canceled)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != holder.Key() {
		t.Fatalf("keys after two abandoned Locks: got = %v, expected: only the holder's %s", kvs, holder.Key())
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Nobody is left in line: a new contender takes it at once.
	next := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := next.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the holder left and the waiters gave up: %v", err)
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// An observer sees every leader and every value proclaimed, in order,
// when each change is observed before the next is made (etcd's Observe
// promises the latest value, not every one in between).
func testElection(t *testing.T, tg target) {
	const name = "election"
	ctx := ctxT(t)
	c := newClient(t, tg)
	sa, sb, so := newSession(t, c, 10), newSession(t, c, 10), newSession(t, c, 10)
	ea, eb := concurrency.NewElection(sa, name), concurrency.NewElection(sb, name)
	observer := concurrency.NewElection(so, name)

	if _, err := observer.Leader(ctx); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("Leader with nobody elected: got = %v, expected: %v", err, concurrency.ErrElectionNoLeader)
	}
	if err := observer.Proclaim(ctx, "x"); !errors.Is(err, concurrency.ErrElectionNotLeader) {
		t.Fatalf("Proclaim without a campaign: got = %v, expected: %v", err, concurrency.ErrElectionNotLeader)
	}
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	obs := observer.Observe(octx)
	var lastCreate, lastMod int64
	observed := func(e *concurrency.Election, value string) {
		t.Helper()
		select {
		case resp, ok := <-obs:
			if !ok {
				t.Fatalf("observe ended waiting for %q", value)
			}
			kv := resp.Kvs[0]
			if string(kv.Value) != value || string(kv.Key) != e.Key() || kv.CreateRevision != e.Rev() {
				t.Fatalf("observed %s=%q created at %d, expected: %s=%q created at %d", kv.Key, kv.Value, kv.CreateRevision, e.Key(), value, e.Rev())
			}
			if kv.CreateRevision < lastCreate || kv.ModRevision <= lastMod {
				t.Fatalf("observed %q at create %d mod %d, after create %d mod %d", value, kv.CreateRevision, kv.ModRevision, lastCreate, lastMod)
			}
			lastCreate, lastMod = kv.CreateRevision, kv.ModRevision
		case <-ctx.Done():
			t.Fatalf("observe: nothing seen waiting for %q", value)
		}
	}
	// expect observes value and, nothing having changed since, reads it
	// from Leader too.
	expect := func(e *concurrency.Election, value string) {
		t.Helper()
		observed(e, value)
		resp, err := observer.Leader(ctx)
		if err != nil {
			t.Fatalf("Leader: %v", err)
		}
		if got := string(resp.Kvs[0].Value); got != value {
			t.Fatalf("Leader: got = %q, expected: %q", got, value)
		}
	}

	if err := ea.Campaign(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	expect(ea, "a1")
	for _, v := range []string{"a2", "a3"} {
		if err := ea.Proclaim(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	observed(ea, "a2") // proclaimed in a row: each is seen, in order
	expect(ea, "a3")

	campaigned := make(chan error, 1)
	go func() { campaigned <- eb.Campaign(ctx, "b1") }()
	select {
	case err := <-campaigned:
		t.Fatalf("a second candidate was elected while the leader stays: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-campaigned; err != nil {
		t.Fatalf("campaign once the leader resigned: %v", err)
	}
	expect(eb, "b1")
	if err := ea.Proclaim(ctx, "stale"); !errors.Is(err, concurrency.ErrElectionNotLeader) {
		t.Fatalf("Proclaim by the resigned leader: got = %v, expected: %v", err, concurrency.ErrElectionNotLeader)
	}
	if err := eb.Proclaim(ctx, "b2"); err != nil {
		t.Fatal(err)
	}
	expect(eb, "b2")
	if err := eb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := observer.Leader(ctx); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("Leader once everyone resigned: got = %v, expected: %v", err, concurrency.ErrElectionNoLeader)
	}
	if err := ea.Campaign(ctx, "a4"); err != nil {
		t.Fatal(err)
	}
	expect(ea, "a4")
	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ocancel()
	for range obs { // observe closes its channel once its context ends
	}
}

// A holder whose client goes away without revoking its lease (a crashed
// process) keeps the lock until its session's TTL runs out, never sooner,
// and then, within about the TTL, the next waiter gets it; an election led by the same session
// passes to the next candidate.
func testSessionExpiry(t *testing.T, tg target) {
	const name, ename, ttl = "expiry-lock", "expiry-election", 2
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	crashing, err := clientv3.New(clientv3.Config{Endpoints: []string{tg.addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer crashing.Close()
	sa, err := concurrency.NewSession(crashing, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	ma, ea := concurrency.NewMutex(sa, name), concurrency.NewElection(sa, ename)
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ea.Campaign(ctx, "crashing"); err != nil {
		t.Fatal(err)
	}
	heldKey := ma.Key()

	c := newClient(t, tg)
	sb := newSession(t, c, 10)
	mb, eb := concurrency.NewMutex(sb, name), concurrency.NewElection(sb, ename)
	locked, elected := make(chan time.Time, 1), make(chan time.Time, 1)
	errc := make(chan error, 2)
	go func() {
		if err := mb.Lock(ctx); err != nil {
			errc <- fmt.Errorf("waiter's Lock: %w", err)
			return
		}
		locked <- time.Now()
	}()
	go func() {
		if err := eb.Campaign(ctx, "next"); err != nil {
			errc <- fmt.Errorf("waiter's Campaign: %w", err)
			return
		}
		elected <- time.Now()
	}()
	// Both wait behind the holder's keys before its client goes.
	waitFor(ctx, t, "the waiter's lock and election keys", func() bool {
		return len(keysUnder(t, c, name+"/")) == 2 && len(keysUnder(t, c, ename+"/")) == 2
	})
	// A keep-alive of our own just before the close: the lease can end no
	// sooner than a full TTL after it was sent.
	sent := time.Now()
	if _, err := crashing.KeepAliveOnce(ctx, sa.Lease()); err != nil {
		t.Fatalf("keep the holder's lease alive once more: %v", err)
	}
	if err := crashing.Close(); err != nil {
		t.Fatalf("close the holder's client: %v", err)
	}

	for range 2 {
		var at time.Time
		select {
		case at = <-locked:
			if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != mb.Key() {
				t.Errorf("lock keys once the waiter holds it: got = %v, expected: only %s", kvs, mb.Key())
			}
		case at = <-elected:
			resp, err := eb.Leader(ctx)
			if err != nil || string(resp.Kvs[0].Value) != "next" {
				t.Errorf("leader once the holder's session expired: got = %v, %v, expected: next", resp, err)
			}
		case err := <-errc:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("the holder's session never expired: %v", ctx.Err())
		}
		// The upper bound is loose, for a loaded machine: it catches a
		// lease that outlives its TTL by far, not a slow expiry.
		switch d := at.Sub(sent); {
		case d < ttl*time.Second:
			t.Errorf("passed on %v after the holder's last keep-alive, before its %ds TTL ran out", d, ttl)
		case d > (ttl+8)*time.Second:
			t.Errorf("passed on %v after the holder's last keep-alive, far beyond its %ds TTL", d, ttl)
		default:
			t.Logf("passed on %v after the holder's last keep-alive (TTL %ds)", d.Round(time.Millisecond), ttl)
		}
	}
	if resp, err := c.Get(ctx, heldKey); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the expired holder's lock key %s: got = %v, %v, expected: deleted", heldKey, resp, err)
	}
	ttlResp, err := c.TimeToLive(ctx, sa.Lease())
	if err != nil || ttlResp.TTL != -1 {
		t.Errorf("TimeToLive of the expired lease: got = %v, %v, expected: TTL -1", ttlResp, err)
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := eb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// A session that has ended can take nothing: Lock and Campaign on a
// revoked lease answer etcd's "requested lease not found", and a waiter
// whose session expires while it waits learns, once its turn comes, that
// its key is gone (ErrSessionExpired) instead of holding the lock.
func testEndedSession(t *testing.T, tg target) {
	const name, ename = "ended-lock", "ended-election"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t, tg)

	revoked, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	if err := revoked.Close(); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	if err := concurrency.NewMutex(revoked, name).Lock(ctx); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("Lock on a revoked session: got = %v, expected: %v", err, rpctypes.ErrLeaseNotFound)
	}
	if err := concurrency.NewElection(revoked, ename).Campaign(ctx, "v"); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("Campaign on a revoked session: got = %v, expected: %v", err, rpctypes.ErrLeaseNotFound)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 0 {
		t.Errorf("keys after a Lock on a revoked session: %v", kvs)
	}

	holder := concurrency.NewMutex(newSession(t, c, 10), name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	expiring, err := concurrency.NewSession(c, concurrency.WithTTL(2))
	if err != nil {
		t.Fatal(err)
	}
	waiter := concurrency.NewMutex(expiring, name)
	locked := make(chan error, 1)
	go func() { locked <- waiter.Lock(ctx) }()
	waitFor(ctx, t, "the waiter's key", func() bool { return len(keysUnder(t, c, name+"/")) == 2 })
	expiring.Orphan() // no more keep-alives: the lease ends by itself
	waitFor(ctx, t, "the waiter's lease to expire", func() bool {
		r, err := c.TimeToLive(ctx, expiring.Lease())
		return err == nil && r.TTL == -1
	})
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 1 || string(kvs[0].Key) != holder.Key() {
		t.Errorf("keys once the waiter's lease expired: got = %v, expected: only the holder's %s", kvs, holder.Key())
	}
	select {
	case err := <-locked:
		t.Fatalf("the waiter's Lock returned before the holder let go: %v", err)
	default:
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; !errors.Is(err, concurrency.ErrSessionExpired) {
		t.Errorf("Lock of a waiter whose session expired: got = %v, expected: %v", err, concurrency.ErrSessionExpired)
	}
	if kvs := keysUnder(t, c, name+"/"); len(kvs) != 0 {
		t.Errorf("keys after everyone left: %v", kvs)
	}
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Concurrent STM transactions increment counters. With the isolation
// levels that check what they read (all but ReadCommitted) workers share
// the counters and a total, and no increment is lost: the counters add up
// to the number of commits, and so does the total. The serializable
// levels read one revision, so every attempt, committed or retried, sees
// counters that add up to the total. ReadCommitted makes no check at all
// (etcd's STM commits its writes unconditionally), so there each worker
// increments a counter of its own.
func testSTM(t *testing.T, tg target, name string, level concurrency.Isolation) {
	const workers, commits, counters = 4, 8, 3
	prefix := "stm/" + name + "/"
	total := prefix + "total"
	counter := func(i int) string { return fmt.Sprintf("%sc%d", prefix, i) }
	shared := level != concurrency.ReadCommitted
	snapshot := level == concurrency.SerializableSnapshot || level == concurrency.Serializable
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var attempts atomic.Int64
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, tg)
		wg.Go(func() {
			errc <- func() error {
				for range commits {
					var skew error
					_, err := concurrency.NewSTM(c, func(stm concurrency.STM) error {
						attempts.Add(1)
						if !shared {
							k := counter(w)
							stm.Put(k, strconv.Itoa(atoi(stm.Get(k))+1))
							return nil
						}
						sum, tot := 0, atoi(stm.Get(total))
						for i := range counters {
							sum += atoi(stm.Get(counter(i)))
						}
						if snapshot && sum != tot {
							skew = fmt.Errorf("an attempt read counters adding up to %d beside a total of %d", sum, tot)
						}
						k := counter(rand.N(counters))
						stm.Put(k, strconv.Itoa(atoi(stm.Get(k))+1))
						stm.Put(total, strconv.Itoa(tot+1))
						return nil
					}, concurrency.WithIsolation(level), concurrency.WithAbortContext(ctx))
					if err != nil {
						return fmt.Errorf("worker %d: STM: %w", w, err)
					}
					if skew != nil {
						return skew
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	c := newClient(t, tg)
	n := counters
	if !shared {
		n = workers
	}
	sum := 0
	for i := range n {
		resp, err := c.Get(ctx, counter(i))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 {
			sum += atoi(string(resp.Kvs[0].Value))
		}
	}
	if sum != workers*commits {
		t.Errorf("counters add up to %d, expected: %d commits", sum, workers*commits)
	}
	if shared {
		resp, err := c.Get(ctx, total)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || atoi(string(resp.Kvs[0].Value)) != workers*commits {
			t.Errorf("total: got = %v, expected: %d", resp.Kvs, workers*commits)
		}
	}
	t.Logf("%d commits in %d attempts", workers*commits, attempts.Load())
}

// atoi reads a counter; an absent key (STM's Get answers "") is 0.
func atoi(s string) int {
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(fmt.Sprintf("counter %q: %v", s, err))
	}
	return n
}

// Compare-and-swap with a plain Txn: concurrent increments conditioned on
// the key's mod revision lose none, a refused one answers the current
// value from its Else branch, and of concurrent creators conditioned on
// create revision 0 exactly one succeeds.
func testTxnCAS(t *testing.T, tg target) {
	const workers, increments = 4, 10
	const key, created = "cas/counter", "cas/created"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var won, refused atomic.Int32
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t, tg)
		wg.Go(func() {
			errc <- func() error {
				r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(created), "=", 0)).
					Then(clientv3.OpPut(created, strconv.Itoa(w))).Commit()
				if err != nil {
					return err
				}
				if r.Succeeded {
					won.Add(1)
				}
				resp, err := c.Get(ctx, key)
				if err != nil {
					return err
				}
				value, rev := 0, int64(0)
				if len(resp.Kvs) == 1 {
					value, rev = atoi(string(resp.Kvs[0].Value)), resp.Kvs[0].ModRevision
				}
				for done := 0; done < increments; {
					r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
						Then(clientv3.OpPut(key, strconv.Itoa(value+1))).
						Else(clientv3.OpGet(key)).Commit()
					if err != nil {
						return err
					}
					if r.Succeeded {
						done++
						value, rev = value+1, r.Header.Revision
						continue
					}
					refused.Add(1)
					kvs := r.Responses[0].GetResponseRange().Kvs
					if len(kvs) != 1 || kvs[0].ModRevision == rev {
						return fmt.Errorf("a refused swap's Else read %v, expected: the key at another mod revision than %d", kvs, rev)
					}
					value, rev = atoi(string(kvs[0].Value)), kvs[0].ModRevision
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	if n := won.Load(); n != 1 {
		t.Errorf("creators conditioned on create revision 0 that succeeded: got = %d, expected: 1", n)
	}
	resp, err := newClient(t, tg).Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || atoi(string(resp.Kvs[0].Value)) != workers*increments {
		t.Fatalf("counter: got = %v, expected: %d", resp.Kvs, workers*increments)
	}
	if resp.Kvs[0].Version != workers*increments {
		t.Errorf("counter's version: got = %d, expected: %d", resp.Kvs[0].Version, workers*increments)
	}
	t.Logf("%d swaps, %d refused", workers*increments, refused.Load())
}

// A watch survives the Tenure process being killed and started again on
// the same data dir: etcd's client resumes it from the revision after the
// last event it delivered, and every event written before and after the
// restart arrives exactly once, in order. A watch opened after the
// restart from a revision before it replays the same history.
func TestConcurrencyWatchResumesAfterRestart(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	const prefix = "resume/"
	s := newTenureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := newClient(t, s.target())

	put := func(i int) int64 {
		t.Helper()
		var lastErr error
		for ctx.Err() == nil {
			// Until the client has found the restarted node a put may fail
			// before it reaches it; none is sent twice once one succeeds.
			pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
			r, err := c.Put(pctx, fmt.Sprintf("%s%02d", prefix, i), strconv.Itoa(i))
			pcancel()
			if err == nil {
				return r.Header.Revision
			}
			lastErr = err
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("put %d: %v", i, lastErr)
		return 0
	}
	var revs []int64
	for i := range 5 {
		revs = append(revs, put(i))
	}
	wch := c.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(revs[0]))
	var got []*clientv3.Event
	receive := func(n int) {
		t.Helper()
		for len(got) < n {
			select {
			case wr, ok := <-wch:
				if !ok {
					t.Fatalf("the watch ended after %d events", len(got))
				}
				if err := wr.Err(); err != nil {
					t.Fatalf("watch: %v", err)
				}
				got = append(got, wr.Events...)
			case <-ctx.Done():
				t.Fatalf("%d events, waiting for %d: %v", len(got), n, ctx.Err())
			}
		}
	}
	receive(5)
	for i := 5; i < 10; i++ {
		revs = append(revs, put(i))
	}
	receive(7)
	s.kill()
	s.start()
	for i := 10; i < 15; i++ {
		revs = append(revs, put(i))
	}
	receive(15)
	// Anything delivered twice would come now.
	select {
	case wr := <-wch:
		got = append(got, wr.Events...)
	case <-time.After(500 * time.Millisecond):
	}
	check := func(what string, evs []*clientv3.Event, from int) {
		t.Helper()
		if len(evs) != len(revs)-from {
			t.Errorf("%s: %d events, expected: %d", what, len(evs), len(revs)-from)
		}
		for j, ev := range evs {
			i := from + j
			if i >= len(revs) {
				break
			}
			want := fmt.Sprintf("%s%02d", prefix, i)
			if ev.Type != clientv3.EventTypePut || string(ev.Kv.Key) != want || ev.Kv.ModRevision != revs[i] {
				t.Errorf("%s: event %d: got = %s %s at %d, expected: PUT %s at %d", what, j, ev.Type, ev.Kv.Key, ev.Kv.ModRevision, want, revs[i])
			}
		}
	}
	check("the watch across the restart", got, 0)
	if revs[10] <= revs[9] {
		t.Errorf("the first write after the restart is at revision %d, not after the last before it (%d)", revs[10], revs[9])
	}

	// A new watch from a revision written before the restart.
	fresh := newClient(t, s.target())
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch = fresh.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(revs[7]))
	got = nil
	receive(len(revs) - 7)
	check("a watch from before the restart", got, 7)
}
