package server

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
)

// TestEtcdNoLeaderAnswerIsMarkedForTheForwarder: a node that knows no
// leader answers a call another node forwarded to it in etcd's form for
// the method (Unavailable for KV, codes.Unknown for Lock, as etcd's
// recipes answer), and marks the answer as a "no leader" in its trailer,
// so that the follower that forwarded it waits for the leader and tries
// again rather than hand it on as the leader's answer. A client's own
// call never gets the mark.
func TestEtcdNoLeaderAnswerIsMarkedForTheForwarder(t *testing.T) {
	// Not bootstrapped: it waits to be added, and knows no leader.
	ts := openServer(t, t.TempDir(), testLimits(), func(c *raftnode.Config) { c.Bootstrap = false })
	ts.cfg.Etcd = EtcdConfig{Listener: testnet.Listen(t)}
	if err := ts.startEtcd(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(ts.cfg.Etcd.Listener.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	forwarded := metadata.AppendToOutgoingContext(ctx, etcdForwardedKey, "another-node")

	kv, locks := pb.NewKVClient(conn), v3lockpb.NewLockClient(conn)
	// Each waits the few seconds a call waits for a leader: side by side.
	t.Run("calls", func(t *testing.T) { testNoLeaderAnswers(t, ctx, forwarded, kv, locks) })
}

func testNoLeaderAnswers(t *testing.T, ctx, forwarded context.Context, kv pb.KVClient, locks v3lockpb.LockClient) {
	for _, tc := range []struct {
		name   string
		call   func(*metadata.MD) error
		code   codes.Code
		marked bool
	}{
		{"a forwarded Put", func(md *metadata.MD) error {
			_, err := kv.Put(forwarded, &pb.PutRequest{Key: []byte("k")}, grpc.Trailer(md))
			return err
		}, codes.Unavailable, true},
		{"a forwarded Lock", func(md *metadata.MD) error {
			_, err := locks.Lock(forwarded, &v3lockpb.LockRequest{Name: []byte("job"), Lease: 1}, grpc.Trailer(md))
			return err
		}, codes.Unknown, true},
		{"a client's own Put", func(md *metadata.MD) error {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("k")}, grpc.Trailer(md))
			return err
		}, codes.Unavailable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var md metadata.MD
			err := tc.call(&md)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || st.Message() != "etcdserver: no leader" {
				t.Errorf("got = %v, expected: %v \"etcdserver: no leader\"", err, tc.code)
			}
			if marked := len(md.Get(etcdNoLeaderKey)) > 0; marked != tc.marked {
				t.Errorf("trailer marked %v, expected: %v", marked, tc.marked)
			}
		})
	}
}
