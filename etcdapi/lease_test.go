package etcdapi

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// noLeakAfter fails t if goroutines started during it outlive it. Call
// it before serve, so that its check runs after serve's clean-ups.
func noLeakAfter(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// ttlBackend is a fake Backend with other session TTL bounds.
type ttlBackend struct {
	*fakeBackend
	min, max time.Duration
}

func (b ttlBackend) SessionTTL() (time.Duration, time.Duration) { return b.min, b.max }

// sessionOf is the session of etcd lease id, and whether there is one.
func sessionOf(t *testing.T, f *fakeBackend, id clientv3.LeaseID) (statemachine.Session, bool) {
	t.Helper()
	var (
		s  statemachine.Session
		ok bool
	)
	_ = f.Read(context.Background(), false, func(m *statemachine.Machine) error {
		s, ok = m.SessionByLease(int64(id))
		return nil
	})
	return s, ok
}

// putWithLease writes key bound to etcd lease id, as an etcd Put with a
// lease does, without the KV service.
func putWithLease(t *testing.T, f *fakeBackend, key string, id clientv3.LeaseID) {
	t.Helper()
	res := f.apply(statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: key, Value: "v", Lease: int64(id)}}})
	if res.Err != nil {
		t.Fatalf("put %q with lease %x: %v", key, id, res.Err)
	}
}

// grantID grants a lease with the ID r names, which clientv3's Grant
// cannot ask for.
func grantID(ctx context.Context, c *clientv3.Client, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	return pb.NewLeaseClient(c.ActiveConnection()).LeaseGrant(ctx, r)
}

func keyExists(t *testing.T, f *fakeBackend, key string) bool {
	t.Helper()
	found := false
	_ = f.Read(context.Background(), false, func(m *statemachine.Machine) error {
		return m.RangeKeys(key, "", 0, func(statemachine.KeyValue) bool { found = true; return false })
	})
	return found
}

func TestLeaseGrant(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, ttlBackend{fakeBackend: f, min: 3 * time.Second, max: time.Hour})
	ctx := context.Background()

	t.Run("an ID of 0 lets the server pick the session's own ID", func(t *testing.T) {
		resp, err := c.Grant(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := sessionOf(t, f, resp.ID)
		if !ok {
			t.Fatalf("no session answers to lease %x", resp.ID)
		}
		if int64(resp.ID) != s.ID || resp.TTL != 10 || time.Duration(s.TTL) != 10*time.Second {
			t.Errorf("got = ID %x TTL %d, session %d TTL %v, expected: the session's ID, TTL 10 s", resp.ID, resp.TTL, s.ID, time.Duration(s.TTL))
		}
		if s.Labels["api"] != "etcd" || s.Identity != "etcd" {
			t.Errorf("got = labels %v identity %q, expected: api=etcd, the Backend's identity", s.Labels, s.Identity)
		}
		if resp.Revision != f.m.KVRevision() {
			t.Errorf("got = header revision %d, expected: %d", resp.Revision, f.m.KVRevision())
		}
	})
	t.Run("a given ID is kept, and a second grant of it is refused", func(t *testing.T) {
		resp, err := grantID(ctx, c, &pb.LeaseGrantRequest{TTL: 10, ID: 0x1234})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ID != 0x1234 {
			t.Errorf("got = ID %x, expected: 1234", resp.ID)
		}
		if _, ok := sessionOf(t, f, 0x1234); !ok {
			t.Error("no session answers to lease 1234")
		}
		if _, err := grantID(ctx, c, &pb.LeaseGrantRequest{TTL: 10, ID: 0x1234}); !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseExist) {
			t.Errorf("got = %v, expected: %v", err, rpctypes.ErrLeaseExist)
		}
	})
	t.Run("a TTL below the minimum is raised to it", func(t *testing.T) {
		resp, err := c.Grant(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := sessionOf(t, f, resp.ID)
		if resp.TTL != 3 || time.Duration(s.TTL) != 3*time.Second {
			t.Errorf("got = TTL %d, session TTL %v, expected: 3", resp.TTL, time.Duration(s.TTL))
		}
	})
	t.Run("a TTL above etcd's or the Backend's maximum is refused and opens nothing", func(t *testing.T) {
		before := len(f.m.Sessions())
		for _, ttl := range []int64{maxLeaseTTL + 1, 3601} {
			if _, err := c.Grant(ctx, ttl); !errors.Is(err, rpctypes.ErrLeaseTTLTooLarge) {
				t.Errorf("TTL %d: got = %v, expected: %v", ttl, err, rpctypes.ErrLeaseTTLTooLarge)
			}
		}
		if after := len(f.m.Sessions()); after != before {
			t.Errorf("got = %d sessions, expected: %d", after, before)
		}
	})
	t.Run("a negative ID is refused", func(t *testing.T) {
		_, err := grantID(ctx, c, &pb.LeaseGrantRequest{TTL: 10, ID: -5})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("got = %v, expected: InvalidArgument", err)
		}
	})
}

func TestLeaseRevokeDeletesKeys(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := context.Background()
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	putWithLease(t, f, "a", g.ID)
	putWithLease(t, f, "b", g.ID)

	f.deny = true
	if _, err := c.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("denied: got = %v, expected: %v", err, rpctypes.ErrPermissionDenied)
	}
	f.deny = false
	if !keyExists(t, f, "a") {
		t.Fatal("a refused revoke deleted the keys")
	}

	resp, err := c.Revoke(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if keyExists(t, f, "a") || keyExists(t, f, "b") {
		t.Error("the lease's keys outlived its revoke")
	}
	if resp.Header.Revision != f.m.KVRevision() {
		t.Errorf("got = header revision %d, expected: %d", resp.Header.Revision, f.m.KVRevision())
	}
	if _, err := c.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("second revoke: got = %v, expected: %v", err, rpctypes.ErrLeaseNotFound)
	}
}

func TestLeaseExpiryDeletesKeys(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := context.Background()
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	putWithLease(t, f, "k", g.ID)
	s, _ := sessionOf(t, f, g.ID)
	f.expire(s.ID)
	if keyExists(t, f, "k") {
		t.Error("the key outlived its lease's expiry")
	}
	ttl, err := c.TimeToLive(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Errorf("got = TTL %d, expected: -1 for an expired lease", ttl.TTL)
	}
}

func TestLeaseTimeToLive(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := context.Background()
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	putWithLease(t, f, "y", g.ID)
	putWithLease(t, f, "x", g.ID)

	resp, err := c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	// Whole seconds rounded down: a moment after the grant, 29.
	if resp.GrantedTTL != 30 || resp.TTL < 28 || resp.TTL > 29 {
		t.Errorf("got = TTL %d granted %d, expected: 28 or 29 of 30", resp.TTL, resp.GrantedTTL)
	}
	if len(resp.Keys) != 2 || string(resp.Keys[0]) != "x" || string(resp.Keys[1]) != "y" {
		t.Errorf("got = keys %q, expected: [x y]", resp.Keys)
	}
	if plain, err := c.TimeToLive(ctx, g.ID); err != nil || len(plain.Keys) != 0 {
		t.Errorf("without keys: got = %v, %q, expected: no keys", err, plain.Keys)
	}

	f.deny = true
	if _, err := c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("denied: got = %v, expected: %v", err, rpctypes.ErrPermissionDenied)
	}
	f.deny = false

	unknown, err := c.TimeToLive(ctx, 0x999999)
	if err != nil {
		t.Fatal(err)
	}
	if unknown.TTL != -1 || unknown.ID != 0x999999 {
		t.Errorf("unknown: got = ID %x TTL %d, expected: ID 999999 TTL -1", unknown.ID, unknown.TTL)
	}
}

func TestLeaseLeases(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := context.Background()
	native := f.apply(statemachine.OpenSession{Identity: "native", TTL: int64(10 * time.Second)}).Session
	g, err := grantID(ctx, c, &pb.LeaseGrantRequest{TTL: 10, ID: 77})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[clientv3.LeaseID]bool{}
	for _, l := range resp.Leases {
		got[l.ID] = true
	}
	if len(got) != 2 || !got[clientv3.LeaseID(native.ID)] || !got[clientv3.LeaseID(g.ID)] {
		t.Errorf("got = %v, expected: the native session %d and lease 77", got, native.ID)
	}
}

func TestLeaseKeepAlive(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := c.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sessionOf(t, f, g.ID)

	kctx, kcancel := context.WithCancel(ctx)
	ch, err := c.KeepAlive(kctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-ch:
		if resp == nil || resp.ID != g.ID || resp.TTL != 5 {
			t.Errorf("got = %+v, expected: ID %x TTL 5", resp, g.ID)
		}
	case <-ctx.Done():
		t.Fatal("no keep-alive response")
	}
	f.mu.Lock()
	renewed := time.Until(f.deadline[s.ID])
	f.mu.Unlock()
	if renewed < 4*time.Second {
		t.Errorf("got = %v left after the renewal, expected: about 5 s", renewed)
	}
	kcancel()

	// A lease that is gone is answered with TTL 0, as etcd answers it.
	stream, err := pb.NewLeaseClient(c.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: 0x424242}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.ID != 0x424242 || resp.TTL != 0 {
		t.Errorf("unknown lease: got = ID %x TTL %d, expected: ID 424242 TTL 0", resp.ID, resp.TTL)
	}
	_ = stream.CloseSend()
	if _, err := c.KeepAliveOnce(ctx, 0x424242); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("KeepAliveOnce: got = %v, expected: %v", err, rpctypes.ErrLeaseNotFound)
	}
}

// laggingBackend is a node whose own state has applied nothing yet:
// its serializable reads see an empty machine, its linearizable ones
// the leader's.
type laggingBackend struct {
	*fakeBackend
	empty *statemachine.Machine
}

func (b laggingBackend) Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error {
	if serializable {
		return fn(b.empty)
	}
	return b.fakeBackend.Read(ctx, serializable, fn)
}

// TestLeaseKeepAliveOnLaggingNode checks that a keep-alive right after a
// grant, on a node that has not applied it yet, renews the lease rather
// than telling the client it is gone.
func TestLeaseKeepAliveOnLaggingNode(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	empty := statemachine.New()
	empty.Apply(0, statemachine.SetVersion{Version: statemachine.Version})
	c := serve(t, laggingBackend{fakeBackend: f, empty: empty})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.KeepAliveOnce(ctx, g.ID)
	if err != nil || resp.TTL != 30 {
		t.Fatalf("got = %v, %v, expected: TTL 30", resp, err)
	}
}
