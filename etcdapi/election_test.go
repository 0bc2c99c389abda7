package etcdapi

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type campaignResult struct {
	resp *v3electionpb.CampaignResponse
	err  error
}

func campaignAsync(ctx context.Context, ec v3electionpb.ElectionClient, name string, lease int64, val string) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		resp, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte(name), Lease: lease, Value: []byte(val)})
		ch <- campaignResult{resp, err}
	}()
	return ch
}

// wantStatus checks that err is the status etcd's server answers for
// one of the concurrency package's errors: codes.Unknown and its text.
func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if st := status.Convert(err); err == nil || st.Code() != code || st.Message() != msg {
		t.Errorf("got = %v, expected: %v: %s", err, code, msg)
	}
}

func TestElection(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ec := v3electionpb.NewElectionClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases := grantN(t, c, 3)
	a, b, d := int64(leases[0]), int64(leases[1]), int64(leases[2])
	name := []byte("e")

	_, err := ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: name})
	wantStatus(t, err, codes.Unknown, "election: no leader")

	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	obs, err := ec.Observe(octx, &v3electionpb.LeaderRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	observe := func(want string) {
		t.Helper()
		resp, err := obs.Recv()
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
		if string(resp.Kv.Value) != want {
			t.Errorf("Observe: got = %q, expected: %q", resp.Kv.Value, want)
		}
	}

	first, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: a, Value: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	leaderA := first.Leader
	if string(leaderA.Key) != lockKey("e", leases[0]) || leaderA.Lease != a || leaderA.Rev != f.m.KVRevision() || first.Header.Revision != leaderA.Rev {
		t.Fatalf("got = %+v at %d, expected: key %q of lease %x created at %d", leaderA, first.Header.Revision, lockKey("e", leases[0]), a, f.m.KVRevision())
	}
	observe("a")
	lead, err := ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: name})
	if err != nil || string(lead.Kv.Value) != "a" || lead.Kv.Lease != a || lead.Kv.CreateRevision != leaderA.Rev {
		t.Errorf("Leader: got = %v, %v, expected: a's key", lead, err)
	}

	waitB := campaignAsync(ctx, ec, "e", b, "b")
	waitForKey(t, f, lockKey("e", leases[1]))
	select {
	case r := <-waitB:
		t.Fatalf("got = %v, %v while a led, expected: to wait", r.resp, r.err)
	default:
	}

	if _, err := ec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: leaderA, Value: []byte("a2")}); err != nil {
		t.Fatal(err)
	}
	observe("a2")
	stale := *leaderA
	stale.Rev--
	_, err = ec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: &stale, Value: []byte("x")})
	wantStatus(t, err, codes.Unknown, "election: not leader")
	_, err = ec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Value: []byte("x")})
	wantStatus(t, err, codes.Unknown, `"leader" field must be provided`)
	_, err = ec.Resign(ctx, &v3electionpb.ResignRequest{})
	wantStatus(t, err, codes.Unknown, `"leader" field must be provided`)

	// A campaign that gives up leaves, and does not hold up those after it.
	dctx, dcancel := context.WithCancel(ctx)
	waitD := campaignAsync(dctx, ec, "e", d, "d")
	waitForKey(t, f, lockKey("e", leases[2]))
	dcancel()
	if r := <-waitD; status.Code(r.err) != codes.Canceled {
		t.Errorf("cancelled campaign: got = %v, %v, expected: Canceled", r.resp, r.err)
	}
	waitForGone(t, f, lockKey("e", leases[2]))

	if _, err := ec.Resign(ctx, &v3electionpb.ResignRequest{Leader: leaderA}); err != nil {
		t.Fatal(err)
	}
	r := <-waitB
	if r.err != nil || string(r.resp.Leader.Key) != lockKey("e", leases[1]) {
		t.Fatalf("got = %v, %v, expected: b leads", r.resp, r.err)
	}
	observe("b")

	// Campaigning again with the same lease keeps its place and proclaims.
	again, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: b, Value: []byte("b2")})
	if err != nil || again.Leader.Rev != r.resp.Leader.Rev {
		t.Fatalf("got = %v, %v, expected: b still leads from revision %d", again, err, r.resp.Leader.Rev)
	}
	observe("b2")

	if _, err := ec.Resign(ctx, &v3electionpb.ResignRequest{Leader: again.Leader}); err != nil {
		t.Fatal(err)
	}
	_, err = ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: name})
	wantStatus(t, err, codes.Unknown, "election: no leader")
	// With no leader, Observe waits for the next one.
	if _, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: d, Value: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	observe("d")
	ocancel()
	if _, err := obs.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Observe after cancel: got = %v, expected: Canceled", err)
	}
}

// TestElectionLeaderExpires checks that a leader whose lease expires
// hands over to the next candidate.
func TestElectionLeaderExpires(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ec := v3electionpb.NewElectionClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases := grantN(t, c, 2)
	if _, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte("x"), Lease: int64(leases[0]), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	waitB := campaignAsync(ctx, ec, "x", int64(leases[1]), "2")
	waitForKey(t, f, lockKey("x", leases[1]))
	s, _ := sessionOf(t, f, leases[0])
	f.expire(s.ID)
	if r := <-waitB; r.err != nil || r.resp.Leader.Lease != int64(leases[1]) {
		t.Fatalf("got = %v, %v, expected: the second candidate leads", r.resp, r.err)
	}
}

// TestElectionWithConcurrencyElection runs etcd's own Election against
// the Election service on one name. It needs the KV and Watch services
// and is skipped where they are missing.
func TestElectionWithConcurrencyElection(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	skipWithoutKVAndWatch(t, c)
	ec := v3electionpb.NewElectionClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(30))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := concurrency.NewElection(s, "shared")
	if err := e.Campaign(ctx, "client"); err != nil {
		t.Fatal(err)
	}
	lead, err := ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: []byte("shared")})
	if err != nil || string(lead.Kv.Value) != "client" {
		t.Fatalf("Leader: got = %v, %v, expected: the client's value", lead, err)
	}
	lease := grantN(t, c, 1)[0]
	waitSvc := campaignAsync(ctx, ec, "shared", int64(lease), "service")
	waitForKey(t, f, lockKey("shared", lease))
	select {
	case r := <-waitSvc:
		t.Fatalf("got = %v, %v while the client led, expected: to wait", r.resp, r.err)
	default:
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-waitSvc; r.err != nil {
		t.Fatal(r.err)
	}
	got, err := e.Leader(ctx)
	if err != nil || string(got.Kvs[0].Value) != "service" {
		t.Errorf("concurrency Leader: got = %v, %v, expected: the service's value", got, err)
	}
}

// TestElectionObserveChecksCredentials checks that an observer whose
// access is withdrawn is cut off at the next message.
func TestElectionObserveChecksCredentials(t *testing.T) {
	noLeakAfter(t)
	f := newFakeBackend(t)
	c := serve(t, f)
	ec := v3electionpb.NewElectionClient(c.ActiveConnection())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease := grantN(t, c, 1)[0]
	cr, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte("e"), Lease: int64(lease), Value: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ec.Observe(ctx, &v3electionpb.LeaderRequest{Name: []byte("e")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.Recv(); err != nil {
		t.Fatal(err)
	}
	f.deny = true
	putWithLease(t, f, string(cr.Leader.Key), lease)
	_, err = obs.Recv()
	wantStatus(t, err, codes.Unknown, "etcdserver: permission denied")
}
