package server

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// The cluster version gate: commands an older replica would apply
// differently (lease collection, preferred holders) run only once every
// member has registered a build that runs them.

// nodeStatus is ts's answer to ClusterService.Status.
func nodeStatus(t *testing.T, ts *testServer) *tenurev1.StatusResponse {
	t.Helper()
	clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	resp, err := clusterSvc.Status(ctxT(t), connect.NewRequest(&tenurev1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

// acquireGC acquires name for session sid with gc_after gc.
func acquireGC(t *testing.T, ts *testServer, sid int64, name string, gc time.Duration) int64 {
	t.Helper()
	resp, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sid, Name: name, GcAfter: durationpb.New(gc)}))
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	if !resp.Msg.GetAcquired() {
		t.Fatalf("acquire %s: got = not acquired, expected: acquired", name)
	}
	return resp.Msg.GetToken()
}

func release(t *testing.T, ts *testServer, name string, token int64) {
	t.Helper()
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: name, Token: token})); err != nil {
		t.Fatalf("release %s: %v", name, err)
	}
}

// getLease reads default/name: nil, with the error, when it fails.
func getLease(t *testing.T, ts *testServer, name string) (*tenurev1.Lease, error) {
	t.Helper()
	resp, err := ts.Leases.Get(ctxT(t), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: name}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetLease(), nil
}

func setPreferred(t *testing.T, ts *testServer, name, identity string) (*tenurev1.SetPreferredHolderResponse, error) {
	t.Helper()
	resp, err := ts.Leases.SetPreferredHolder(ctxT(t), connect.NewRequest(&tenurev1.SetPreferredHolderRequest{Name: name, Identity: identity}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// collectionsProposed is how many lease collections the lessor has
// proposed, postponed ones included.
func collectionsProposed(t *testing.T, ts *testServer) float64 {
	t.Helper()
	families, err := ts.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "tenure_lessor_expiries_proposed_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "kind" && lp.GetValue() == "lease_gc" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestAFreshNodeRunsTheLatestClusterVersion(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	st := nodeStatus(t, ts)
	if st.GetVersion() != statemachine.Version || st.GetClusterVersion() != statemachine.Version {
		t.Fatalf("status: got = version %d cluster version %d, expected: both %d", st.GetVersion(), st.GetClusterVersion(), statemachine.Version)
	}
	s := openSession(t, ts, "a", 30*time.Second)
	acquireGC(t, ts, s.GetId(), "primary", time.Hour)
	res, err := setPreferred(t, ts, "primary", "p")
	if err != nil {
		t.Fatalf("SetPreferredHolder: got = %v, expected: nil", err)
	}
	if got := res.GetLease().GetPreferredHolder(); got != "p" {
		t.Fatalf("preferred holder: got = %q, expected: \"p\"", got)
	}
}

// A node whose build runs an older version than the cluster's could not
// apply what the log now holds: its join is refused, and changes nothing.
func TestANodeOnAnOlderBuildCannotJoinANewerCluster(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	before, err := clusterSvc.Members(ctxT(t), connect.NewRequest(&tenurev1.MembersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	// No version: a build from before versions (on this engine, to test
	// the version alone).
	_, err = clusterSvc.Join(ctxT(t), connect.NewRequest(&tenurev1.JoinRequest{Id: "old", PeerAddress: "127.0.0.1:1", ApiAddress: "127.0.0.1:2", Engine: raftnode.EngineEtcd}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || nativeapi.ReasonOf(err) != api.ReasonNotSupported {
		t.Fatalf("join of a version-1 build: got = %v, expected: failed_precondition, reason %s", err, api.ReasonNotSupported)
	}
	after, err := clusterSvc.Members(ctxT(t), connect.NewRequest(&tenurev1.MembersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Msg.GetMembers()) != len(before.Msg.GetMembers()) {
		t.Fatalf("members after the refused join: got = %d, expected: %d", len(after.Msg.GetMembers()), len(before.Msg.GetMembers()))
	}
}

// seedOldMember makes dir hold a one-voter cluster, node1 at peer, that
// also lists a non-voter "old" which registered as a build of cluster
// version version (0: from before cluster versions, SetMember without
// one), as a rolling upgrade would find it. Nothing listens at old's
// addresses, which it returns.
func seedOldMember(t *testing.T, dir, peer string, version int) (oldPeer, oldAPI string) {
	t.Helper()
	oldPeer, oldAPI = testnet.Free(t), testnet.Free(t)
	n, err := raftnode.Open(raftnode.Config{
		NodeID: "node1", DataDir: dir, PeerAddr: peer, Bootstrap: true,
		ElectionTimeout: 100 * time.Millisecond,
		WALSegmentSize:  testWALSegmentSize,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !n.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("seed node not leader after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx := ctxT(t)
	if err := n.AddNonvoter(ctx, "old", oldPeer); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Propose(ctx, statemachine.SetMember{ID: "old", APIAddress: oldAPI, Version: version}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	return oldPeer, oldAPI
}

func TestAMemberOnAnOlderBuildHoldsTheClusterVersionBack(t *testing.T) {
	t.Parallel()
	dir, peer := t.TempDir(), testnet.Free(t)
	oldPeer, oldAPI := seedOldMember(t, dir, peer, 0)
	samePeer := func(rc *raftnode.Config) { rc.PeerAddr = peer }
	ts := startServer(t, dir, testLimits(), samePeer)

	if st := nodeStatus(t, ts); st.GetVersion() != statemachine.Version || st.GetClusterVersion() != 1 {
		t.Fatalf("status: got = version %d cluster version %d, expected: version %d, cluster version 1", st.GetVersion(), st.GetClusterVersion(), statemachine.Version)
	}
	s := openSession(t, ts, "a", 30*time.Second)
	acquireGC(t, ts, s.GetId(), "primary", time.Hour)

	// Preferred holders are refused, saying why.
	_, err := setPreferred(t, ts, "primary", "p")
	wantCode(t, err, connect.CodeFailedPrecondition, "upgrade every member")
	if reason := err.(*connect.Error).Meta().Get(api.ErrorHeader); reason != string(api.ReasonNotSupported) {
		t.Fatalf("reason: got = %q, expected: %q", reason, api.ReasonNotSupported)
	}
	if l, err := getLease(t, ts, "primary"); err != nil || l.GetPreferredHolder() != "" {
		t.Fatalf("after the refusal: got = %v (%v), expected: no preferred holder", l, err)
	}

	// Collections are put off: the lessor asks, and is told to wait.
	release(t, ts, "postponed", acquireGC(t, ts, s.GetId(), "postponed", 50*time.Millisecond))
	waitFor(t, "the lessor to propose the collection", func() bool { return collectionsProposed(t, ts) >= 1 })
	if l, err := getLease(t, ts, "postponed"); err != nil || l.GetStatus() != "released" {
		t.Fatalf("after a postponed collection: got = %v (%v), expected: the record, released", l, err)
	}

	// The old member comes back upgraded: the leader raises the version.
	clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	if _, err := clusterSvc.Join(ctxT(t), connect.NewRequest(&tenurev1.JoinRequest{Id: "old", PeerAddress: oldPeer, ApiAddress: oldAPI, Version: statemachine.Version, Engine: raftnode.EngineEtcd})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cluster version to reach this build's", func() bool {
		return nodeStatus(t, ts).GetClusterVersion() == statemachine.Version
	})
	if _, err := setPreferred(t, ts, "primary", "p"); err != nil {
		t.Fatalf("SetPreferredHolder at cluster version %d: got = %v, expected: nil", statemachine.Version, err)
	}
	release(t, ts, "after", acquireGC(t, ts, s.GetId(), "after", 50*time.Millisecond))
	waitFor(t, "the lease idle since the raise to be collected", func() bool {
		_, err := getLease(t, ts, "after")
		return connect.CodeOf(err) == connect.CodeNotFound
	})

	// The postponed collection is not lost: a new leader dates it from
	// the logged idle time, long past, and collects it at once.
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, dir, testLimits(), samePeer)
	waitFor(t, "the postponed lease to be collected by the next leader", func() bool {
		_, err := getLease(t, ts, "postponed")
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	if st := nodeStatus(t, ts); st.GetClusterVersion() != statemachine.Version {
		t.Fatalf("cluster version after a restart: got = %d, expected: %d", st.GetClusterVersion(), statemachine.Version)
	}
}

// An acquire without gc_after gets the server's LeaseGCAfter; 0 keeps the
// record; a negative one is refused, changing nothing.
func TestAcquireGCAfterDefaultsToTheServersLimit(t *testing.T) {
	limits := testLimits()
	limits.LeaseGCAfter = 50 * time.Millisecond
	ts := startServer(t, t.TempDir(), limits)
	s := openSession(t, ts, "a", 30*time.Second)

	_, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.GetId(), Name: "negative", GcAfter: durationpb.New(-time.Second)}))
	wantCode(t, err, connect.CodeInvalidArgument, "gc_after")
	if _, err := getLease(t, ts, "negative"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("after a refused acquire: got = %v, expected: not found", err)
	}

	kept := acquireGC(t, ts, s.GetId(), "kept", 0)
	resp, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.GetId(), Name: "defaulted"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.GetLease().GetGcAfter().AsDuration(); got != limits.LeaseGCAfter {
		t.Fatalf("gc_after of an acquire without one: got = %v, expected: the server's %v", got, limits.LeaseGCAfter)
	}
	release(t, ts, "kept", kept)
	release(t, ts, "defaulted", resp.Msg.GetToken())
	waitFor(t, "the defaulted lease to be collected", func() bool {
		_, err := getLease(t, ts, "defaulted")
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	// Went idle first, and is still there: gc_after 0 keeps it.
	l, err := getLease(t, ts, "kept")
	if err != nil || l.GetStatus() != "released" || l.GetDeleteTime() != nil {
		t.Fatalf("kept: got = %v (%v), expected: released, no delete time", l, err)
	}
}
