package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
)

// The etcd API decides who owns a lease where the native API does: at
// apply time. carol, who may write the same keys as alice, races alice's
// lease grants from many goroutines, aiming at the lease IDs alice is
// about to be given (session IDs are the next revisions) and at those she
// holds: revoking them, keeping them alive, attaching keys to them and
// locking with them. None of it may touch alice's leases.
func TestEtcdNoPrincipalActsOnAnotherPrincipalsLeases(t *testing.T) {
	es := startEtcdAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice := es.client(t, "alice", "alice-pw")
	conn := es.conn(t)
	carolCtx := withToken(ctx, es.carolToken)
	leases, kv, locks := pb.NewLeaseClient(conn), pb.NewKVClient(conn), v3lockpb.NewLockClient(conn)

	// The highest lease ID anybody can see; carol aims just past it.
	var highest atomic.Int64
	seen := func() {
		r, err := leases.LeaseLeases(carolCtx, &pb.LeaseLeasesRequest{})
		if err != nil {
			return
		}
		for _, l := range r.Leases {
			if l.ID > highest.Load() {
				highest.Store(l.ID)
			}
		}
	}

	var (
		mu      sync.Mutex
		touched []string // what carol did to alice's leases
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	attack := func(id int64) {
		what := func(format string, args ...any) {
			mu.Lock()
			touched = append(touched, fmt.Sprintf(format, args...))
			mu.Unlock()
		}
		switch id % 5 {
		case 0:
			if _, err := leases.LeaseRevoke(carolCtx, &pb.LeaseRevokeRequest{ID: id}); err == nil {
				what("revoked lease %d", id)
			}
		case 1:
			ka, err := leases.LeaseKeepAlive(carolCtx)
			if err != nil {
				return
			}
			defer ka.CloseSend()
			if ka.Send(&pb.LeaseKeepAliveRequest{ID: id}) != nil {
				return
			}
			if r, err := ka.Recv(); err == nil && r.TTL > 0 {
				what("kept lease %d alive (TTL %d)", id, r.TTL)
			}
		case 2, 3:
			if _, err := kv.Put(carolCtx, &pb.PutRequest{Key: []byte(fmt.Sprintf("app/carol-%d", id)), Value: []byte("x"), Lease: id}); err == nil {
				what("attached app/carol-%d to lease %d", id, id)
			}
		case 4:
			lctx, cancel := context.WithTimeout(carolCtx, 200*time.Millisecond)
			defer cancel()
			if r, err := locks.Lock(lctx, &v3lockpb.LockRequest{Name: []byte("app/lock"), Lease: id}); err == nil {
				what("locked app/lock as %s with lease %d", r.Key, id)
			}
		}
	}
	for g := range 8 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				seen()
				attack(highest.Load() + int64(1+(g+n)%6))
			}
		})
	}

	// alice grants leases one at a time and binds a key to each.
	var mine []int64
	for i := range 20 {
		l, err := alice.Grant(ctx, 30)
		if err != nil {
			t.Fatalf("alice's grant %d: %v", i, err)
		}
		mine = append(mine, int64(l.ID))
		if _, err := alice.Put(ctx, fmt.Sprintf("app/alice-%d", i), "v", clientv3.WithLease(l.ID)); err != nil {
			t.Fatalf("alice's put on lease %x: %v", l.ID, err)
		}
		// carol also aims at the leases alice holds.
		for range 3 {
			attack(int64(l.ID))
		}
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	var onAlice []string
	for _, what := range touched {
		for _, id := range mine {
			if containsID(what, id) {
				onAlice = append(onAlice, what)
			}
		}
	}
	mu.Unlock()
	if len(onAlice) > 0 {
		t.Errorf("carol acted on alice's leases:\n%v", onAlice)
	}
	for i, id := range mine {
		r, err := alice.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
		if err != nil || r.TTL <= 0 {
			t.Errorf("alice's lease %x after the attack: got = %+v, %v, expected: alive", id, r, err)
			continue
		}
		var keys []string
		for _, k := range r.Keys {
			keys = append(keys, string(k))
		}
		if want := []string{fmt.Sprintf("app/alice-%d", i)}; !slices.Equal(keys, want) {
			t.Errorf("keys of alice's lease %x: got = %v, expected: %v", id, keys, want)
		}
	}
	// carol may still use her own leases: the refusals were about whose.
	own, err := leases.LeaseGrant(carolCtx, &pb.LeaseGrantRequest{TTL: 30})
	if err != nil {
		t.Fatalf("carol grants her own lease: %v", err)
	}
	if _, err := kv.Put(carolCtx, &pb.PutRequest{Key: []byte("app/carol"), Value: []byte("x"), Lease: own.ID}); err != nil {
		t.Errorf("carol attaches a key to her own lease: %v", err)
	}
	if _, err := leases.LeaseRevoke(carolCtx, &pb.LeaseRevokeRequest{ID: own.ID}); err != nil {
		t.Errorf("carol revokes her own lease: %v", err)
	}
	// And a refusal says so in etcd's words.
	if _, err := leases.LeaseRevoke(carolCtx, &pb.LeaseRevokeRequest{ID: mine[0]}); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
		t.Errorf("carol revokes alice's lease: got = %v, expected: %v", err, rpctypes.ErrGRPCPermissionDenied)
	}
}

// containsID reports whether what names lease id.
func containsID(what string, id int64) bool {
	var got int64
	for _, format := range []string{"revoked lease %d", "kept lease %d alive", "attached app/carol-%d", "locked app/lock as %s with lease %d"} {
		if format == "locked app/lock as %s with lease %d" {
			var key string
			if n, _ := fmt.Sscanf(what, format, &key, &got); n == 2 && got == id {
				return true
			}
			continue
		}
		if n, _ := fmt.Sscanf(what, format, &got); n == 1 && got == id {
			return true
		}
	}
	return false
}
