package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/tenurehq/tenure/internal/certs"
	"github.com/tenurehq/tenure/internal/testnet"
)

// TestEtcdCallsThroughAFollowerOfASecureClusterActAsTheirCaller: on three
// `tenure serve` processes with API TLS, peer TLS, a policy and the etcd
// API, a follower forwards etcd calls to the leader on behalf of their
// caller, never its own: team-b, racing team-a's lease grants through the
// same follower, can neither revoke, keep alive nor attach keys to
// team-a's leases, while team-a's own calls through the follower work.
func TestEtcdCallsThroughAFollowerOfASecureClusterActAsTheirCaller(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	etcdAddrs := testnet.FreeN(t, 3)
	sc := startSecureCluster(t, func(i int, _ func(string) string) []string {
		return []string{"--etcd-listen", etcdAddrs[i]}
	})
	f, tokens := sc.file, sc.tokens
	follower := ""
	for i, n := range sc.nodes {
		for _, m := range sc.members {
			if m.APIAddress == n.api && m.ID != sc.leader && follower == "" {
				follower = etcdAddrs[i]
			}
		}
	}
	if follower == "" {
		t.Fatalf("no follower among %v (leader %s)", sc.members, sc.leader)
	}
	tlsConfig, err := certs.ClientConfig(f("ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(follower, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leases, kv := pb.NewLeaseClient(conn), pb.NewKVClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	as := func(principal string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, tokens[principal])
	}
	a, b := as("team-a"), as("team-b")

	// Until every member runs cluster version 5, etcd writes are refused.
	waitFor(t, 20*time.Second, "team-a's first put through a follower", func() bool {
		_, err = kv.Put(a, &pb.PutRequest{Key: []byte("team-a/ready"), Value: []byte("1")})
		return err == nil
	})
	first, err := leases.LeaseGrant(a, &pb.LeaseGrantRequest{TTL: 30})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var touched []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	aim := func(id int64) {
		if _, err := leases.LeaseRevoke(b, &pb.LeaseRevokeRequest{ID: id}); err == nil {
			mu.Lock()
			touched = append(touched, fmt.Sprintf("revoked %x", id))
			mu.Unlock()
		}
		if _, err := kv.Put(b, &pb.PutRequest{Key: []byte(fmt.Sprintf("team-b/%x", id)), Value: []byte("x"), Lease: id}); err == nil {
			mu.Lock()
			touched = append(touched, fmt.Sprintf("attached team-b/%x", id))
			mu.Unlock()
		}
	}
	next := first.ID
	var nextMu sync.Mutex
	for range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				nextMu.Lock()
				id := next + int64(1+i%4)
				nextMu.Unlock()
				aim(id)
			}
		})
	}
	mine := []int64{first.ID}
	for range 15 {
		l, err := leases.LeaseGrant(a, &pb.LeaseGrantRequest{TTL: 30})
		if err != nil {
			t.Fatalf("team-a grants through a follower: %v", err)
		}
		nextMu.Lock()
		next = l.ID
		nextMu.Unlock()
		mine = append(mine, l.ID)
		if _, err := kv.Put(a, &pb.PutRequest{Key: []byte(fmt.Sprintf("team-a/%x", l.ID)), Value: []byte("v"), Lease: l.ID}); err != nil {
			t.Fatalf("team-a attaches a key to its lease through a follower: %v", err)
		}
	}
	close(stop)
	wg.Wait()

	ka, err := leases.LeaseKeepAlive(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: mine[0]}); err != nil {
		t.Fatal(err)
	}
	if r, err := ka.Recv(); err == nil && r.TTL > 0 {
		t.Errorf("team-b keeps team-a's lease %x alive through a follower: got = TTL %d, expected: refused", mine[0], r.TTL)
	}
	ka.CloseSend()

	for _, what := range touched {
		for _, id := range mine {
			if what == fmt.Sprintf("revoked %x", id) || what == fmt.Sprintf("attached team-b/%x", id) {
				t.Errorf("team-b through a follower: %s, one of team-a's leases", what)
			}
		}
	}
	for _, id := range mine {
		r, err := leases.LeaseTimeToLive(a, &pb.LeaseTimeToLiveRequest{ID: id, Keys: true})
		if err != nil || r.TTL <= 0 || len(r.Keys) > 1 {
			t.Errorf("team-a's lease %x after the race: got = %v, %v, expected: alive with at most its own key", id, r, err)
		}
	}
	// team-a's leases are no one's to team-b, through a follower as on
	// the leader: TimeToLive answers as for a lease that is gone, and
	// Leases lists none of them.
	for _, id := range mine[:3] {
		if r, err := leases.LeaseTimeToLive(b, &pb.LeaseTimeToLiveRequest{ID: id}); err != nil || r.TTL != -1 {
			t.Errorf("team-b asks team-a's lease %x's TTL through a follower: got = %v, %v, expected: TTL -1", id, r, err)
		}
	}
	if list, err := leases.LeaseLeases(b, &pb.LeaseLeasesRequest{}); err != nil {
		t.Errorf("team-b lists leases through a follower: %v", err)
	} else {
		for _, l := range list.Leases {
			for _, id := range mine {
				if l.ID == id {
					t.Errorf("team-b's lease list through a follower shows team-a's lease %x", id)
				}
			}
		}
	}
	if _, err := leases.LeaseRevoke(b, &pb.LeaseRevokeRequest{ID: mine[0]}); err == nil {
		t.Errorf("team-b revokes team-a's lease through a follower: got = no error, expected: permission denied")
	}
	if _, err := leases.LeaseRevoke(a, &pb.LeaseRevokeRequest{ID: mine[0]}); err != nil {
		t.Errorf("team-a revokes its own lease through a follower: %v", err)
	}
	// Bytes keep through the follower to the leader, which authorizes and
	// applies the range as given: a prefix whose end is not UTF-8 (п's is
	// d0 c0) deletes what it names; team-b's range over team-a's keys is
	// refused.
	for _, k := range []string{"team-a/п", "team-a/пример", "team-a/рыба", "team-a/\xff"} {
		if _, err := kv.Put(a, &pb.PutRequest{Key: []byte(k), Value: []byte("\x00\xfe")}); err != nil {
			t.Fatalf("team-a puts %q through a follower: %v", k, err)
		}
	}
	if _, err := kv.DeleteRange(b, &pb.DeleteRangeRequest{Key: []byte("team-a/п"), RangeEnd: []byte("team-a/\xd0\xc0")}); err == nil {
		t.Errorf("team-b deletes team-a's keys through a follower: got = no error, expected: permission denied")
	}
	del, err := kv.DeleteRange(a, &pb.DeleteRangeRequest{Key: []byte("team-a/п"), RangeEnd: []byte("team-a/\xd0\xc0")})
	if err != nil || del.Deleted != 2 {
		t.Fatalf("team-a: del --prefix team-a/п through a follower: got = %v (%v), expected: 2 deleted", del, err)
	}
	got, err := kv.Range(a, &pb.RangeRequest{Key: []byte("team-a/\xd1"), RangeEnd: []byte("team-a0")})
	if err != nil || len(got.Kvs) != 2 || string(got.Kvs[0].Key) != "team-a/рыба" || string(got.Kvs[1].Key) != "team-a/\xff" || string(got.Kvs[1].Value) != "\x00\xfe" {
		t.Fatalf("team-a's keys above п through a follower: got = %v (%v), expected: рыба and \\xff, values 00 fe", got, err)
	}
}
