package e2e

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// The data dir in testdata/upgrade was written by the build before the
// binary log (commit 3ce64be, cluster version 5, whose log and
// snapshots are JSON), by TestWriteUpgradeFixture below: sessions with
// labels, a held lock with a waiter, a semaphore, an ended grant, native
// keys with a TTL and bound to a session, an etcd lease with keys, a
// compacted history, and enough writes for a snapshot with log entries
// after it. expected.json is the state as that build answered it just
// before it was killed. scripts/upgrade-fixture.sh writes both again.
const (
	upgradeDir     = "testdata/upgrade"
	upgradeNodeID  = "upgrade-fixture"
	upgradeArchive = "datadir-cluster-version-5.tar.gz"
)

// upgradeState is what a build answers about the fixture's state.
type upgradeState struct {
	Sessions json.RawMessage `json:"sessions"` // tenurev1.ListSessionsResponse
	Leases   json.RawMessage `json:"leases"`   // tenurev1.ListLeasesResponse
	Keys     json.RawMessage `json:"keys"`     // tenurev1.RangeResponse
	// Etcd is every key as the etcd API answers it, with revisions and
	// leases, now and at Past; Compacted is the compact revision.
	Etcd      []etcdKey `json:"etcd"`
	EtcdPast  []etcdKey `json:"etcd_past"`
	Past      int64     `json:"past"`
	Compacted int64     `json:"compacted"`
	Revision  int64     `json:"revision"`
	EtcdLease int64     `json:"etcd_lease"`
	LeaseKeys []string  `json:"lease_keys"`
}

type etcdKey struct {
	Key, Value                         []byte
	Create, Mod, Version, Lease, Count int64
}

// captureUpgradeState reads the state through both APIs.
func captureUpgradeState(t *testing.T, ctx context.Context, api *apiClients, etcd *clientv3.Client, past, etcdLease int64) upgradeState {
	t.Helper()
	var st upgradeState
	marshal := func(m proto.Message) json.RawMessage {
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sessions, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ListSessionsResponse], error) {
		return api.sessions.List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{}))
	})
	if err != nil {
		t.Fatalf("list sessions: %v", err)
	}
	leases, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ListLeasesResponse], error) {
		return api.leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{AllNamespaces: true}))
	})
	if err != nil {
		t.Fatalf("list leases: %v", err)
	}
	keys, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.RangeResponse], error) {
		return api.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{}))
	})
	if err != nil {
		t.Fatalf("range keys: %v", err)
	}
	st.Sessions, st.Leases, st.Keys = marshal(sessions.Msg), marshal(leases.Msg), marshal(keys.Msg)
	etcdKeys := func(opts ...clientv3.OpOption) ([]etcdKey, int64) {
		resp, err := etcd.Get(ctx, "\x00", append([]clientv3.OpOption{clientv3.WithFromKey()}, opts...)...)
		if err != nil {
			t.Fatalf("etcd range: %v", err)
		}
		var out []etcdKey
		for _, kv := range resp.Kvs {
			out = append(out, etcdKey{kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, resp.Count})
		}
		return out, resp.Header.Revision
	}
	st.Etcd, st.Revision = etcdKeys()
	st.Past, st.EtcdLease = past, etcdLease
	st.EtcdPast, _ = etcdKeys(clientv3.WithRev(past))
	for rev := past - 1; rev > 0; rev-- {
		if _, err := etcd.Get(ctx, "a", clientv3.WithRev(rev)); errors.Is(err, rpctypes.ErrCompacted) {
			st.Compacted = rev
			break
		}
	}
	ttl, err := etcd.TimeToLive(ctx, clientv3.LeaseID(etcdLease), clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatalf("etcd lease %x: %v", etcdLease, err)
	}
	for _, k := range ttl.Keys {
		st.LeaseKeys = append(st.LeaseKeys, string(k))
	}
	return st
}

// normalize clears what a restart may change without losing anything:
// heartbeats and renewals the leader holds in memory, and the derived
// times that follow them.
func normalize(t *testing.T, raw json.RawMessage, m proto.Message) proto.Message {
	t.Helper()
	if err := protojson.Unmarshal(raw, m); err != nil {
		t.Fatal(err)
	}
	switch m := m.(type) {
	case *tenurev1.ListSessionsResponse:
		m.Revision = 0
		for _, s := range m.Sessions {
			s.LastHeartbeat = nil
		}
	case *tenurev1.ListLeasesResponse:
		m.Revision = 0
		for _, l := range m.Leases {
			l.RenewTime = nil
			for _, g := range l.Holders {
				g.RenewTime = nil
			}
		}
	case *tenurev1.RangeResponse:
		m.GlobalRevision = 0
	}
	return m
}

// A data dir of the build before the binary log starts on this build and
// keeps every key, session, grant, waiter and version of the history;
// the cluster version rises to this build's, which then takes keys of
// any bytes, and a restart after that replays the old JSON entries and
// the new binary ones alike.
func TestADataDirOfTheBuildBeforeTheBinaryLogKeepsEverything(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(upgradeDir, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want upgradeState
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	p := newServerProc(t, tenureBinary(t))
	untar(t, filepath.Join(upgradeDir, upgradeArchive), p.dataDir)
	etcdAddr := freePort(t)
	p.args = []string{"--node-id", upgradeNodeID, "--etcd-listen", etcdAddr}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p.start(ctx)
	etcd := etcdClient(t, etcdAddr)

	check := func(when string) {
		t.Helper()
		got := captureUpgradeState(t, ctx, p.api, etcd, want.Past, want.EtcdLease)
		for _, c := range []struct {
			what      string
			got, want json.RawMessage
			m         func() proto.Message
		}{
			{"sessions", got.Sessions, want.Sessions, func() proto.Message { return &tenurev1.ListSessionsResponse{} }},
			{"leases", got.Leases, want.Leases, func() proto.Message { return &tenurev1.ListLeasesResponse{} }},
			{"keys", got.Keys, want.Keys, func() proto.Message { return &tenurev1.RangeResponse{} }},
		} {
			g, w := normalize(t, c.got, c.m()), normalize(t, c.want, c.m())
			if !proto.Equal(g, w) {
				t.Fatalf("%s %s:\ngot = %v\nexpected: %v", c.what, when, g, w)
			}
		}
		for _, c := range []struct {
			what      string
			got, want any
		}{
			{"etcd keys", got.Etcd, want.Etcd},
			{"etcd keys at the past revision", got.EtcdPast, want.EtcdPast},
			{"compact revision", got.Compacted, want.Compacted},
			{"etcd lease's keys", got.LeaseKeys, want.LeaseKeys},
		} {
			if g, w := fmt.Sprint(c.got), fmt.Sprint(c.want); g != w {
				t.Fatalf("%s %s:\ngot = %s\nexpected: %s", c.what, when, g, w)
			}
		}
	}
	check("after the upgrade")

	// The version rises to this build's, and with it the binary log.
	clusterSvc := tenurev1connect.NewClusterServiceClient(&http.Client{Transport: p.api.tr}, p.url)
	waitFor(t, 20*time.Second, "the cluster version to rise", func() bool {
		st, err := clusterSvc.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
		return err == nil && st.Msg.GetClusterVersion() > 5
	})
	if _, err := etcd.Put(ctx, "/binary/\xff", "\xff\xfe", clientv3.WithLease(clientv3.LeaseID(want.EtcdLease))); err != nil {
		t.Fatalf("a key that is not UTF-8 after the upgrade: %v", err)
	}
	// A new grant's fencing token is above every token of the old log.
	s, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
		return p.api.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "after", Ttl: durationpb.New(time.Hour)}))
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
		return p.api.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Msg.GetSession().GetId(), Name: "after-upgrade"}))
	})
	if err != nil {
		t.Fatal(err)
	}
	var old tenurev1.ListLeasesResponse
	normalize(t, want.Leases, &old)
	for _, l := range old.Leases {
		if l.GetFencingToken() >= a.Msg.GetToken() {
			t.Fatalf("token after the upgrade: got = %d, expected: above %s's %d", a.Msg.GetToken(), l.GetName(), l.GetFencingToken())
		}
	}

	// A restart replays both forms.
	p.kill()
	p.start(ctx)
	etcd = etcdClient(t, etcdAddr)
	resp, err := etcd.Get(ctx, "/binary/\xff")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "\xff\xfe" {
		t.Fatalf("/binary/\\xff after a restart: got = %v (%v), expected: ff fe", resp, err)
	}
	if _, err := etcd.Delete(ctx, "/binary/\xff"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.api.sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: s.Msg.GetSession().GetId()})); err != nil {
		t.Fatal(err)
	}
	// What the old build wrote is untouched by all this, but for the
	// revisions the new writes took.
	got := captureUpgradeState(t, ctx, p.api, etcd, want.Past, want.EtcdLease)
	if fmt.Sprint(got.Etcd) != fmt.Sprint(want.Etcd) {
		t.Fatalf("etcd keys after a restart:\ngot = %v\nexpected: %v", got.Etcd, want.Etcd)
	}
}

func etcdClient(t *testing.T, addr string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// untar unpacks a gzipped tar of regular files and directories into dir.
func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(filepath.Separator)) {
			t.Fatalf("archive entry %q leaves %s", h.Name, dir)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o700); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
				t.Fatal(err)
			}
			out, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("archive entry %q: type %c", h.Name, h.Typeflag)
		}
	}
}

// TestWriteUpgradeFixture writes testdata/upgrade again from the build
// named by WRITE_UPGRADE_FIXTURE_WITH (scripts/upgrade-fixture.sh
// builds it from the commit before the binary log). It is how the
// fixture was made, kept beside the test that reads it; without the
// variable it has nothing to do.
func TestWriteUpgradeFixture(t *testing.T) {
	oldBin := os.Getenv("WRITE_UPGRADE_FIXTURE_WITH")
	if oldBin == "" {
		t.Skip("WRITE_UPGRADE_FIXTURE_WITH names no build to write the fixture with")
	}
	p := newServerProc(t, oldBin)
	etcdAddr := freePort(t)
	p.args = []string{"--node-id", upgradeNodeID, "--etcd-listen", etcdAddr}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p.start(ctx)
	etcd := etcdClient(t, etcdAddr)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	open := func(identity string, ttl time.Duration, labels map[string]string) int64 {
		s, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
			return p.api.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: identity, Ttl: durationpb.New(ttl), Labels: labels}))
		})
		must("open "+identity, err)
		return s.Msg.GetSession().GetId()
	}
	acquire := func(req *tenurev1.AcquireRequest) int64 {
		a, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
			return p.api.leases.Acquire(ctx, connect.NewRequest(req))
		})
		must("acquire "+req.GetName(), err)
		return a.Msg.GetToken()
	}
	put := func(key, value string, ttl time.Duration, session int64) {
		req := &tenurev1.PutRequest{Key: key, Value: value, SessionId: session}
		if ttl > 0 {
			req.Ttl = durationpb.New(ttl)
		}
		_, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
			return p.api.kv.Put(ctx, connect.NewRequest(req))
		})
		must("put "+key, err)
	}

	// Before the snapshot: sessions, grants, native keys.
	alice := open("alice", time.Hour, map[string]string{"team": "a"})
	bob := open("bob", time.Hour, nil)
	carol := open("carol", 30*time.Minute, map[string]string{"team": "c", "zone": "z1"})
	acquire(&tenurev1.AcquireRequest{SessionId: alice, Name: "scheduler", Value: "10.0.0.1:8080", Labels: map[string]string{"app": "sched"}, LockDelay: durationpb.New(5 * time.Second)})
	acquire(&tenurev1.AcquireRequest{SessionId: alice, Namespace: "jobs", Name: "shard-1", Capacity: 2})
	acquire(&tenurev1.AcquireRequest{SessionId: carol, Namespace: "jobs", Name: "shard-1", Capacity: 2, Value: "carol's"})
	// gc_after 0 keeps the released record for good: with the server's
	// default (1h) the fixture would lose it an hour after it was made.
	token := acquire(&tenurev1.AcquireRequest{SessionId: carol, Name: "migration", GcAfter: durationpb.New(0)})
	_, err := p.api.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: "migration", Token: token}))
	must("release migration", err)
	put("config/feature", "on", 0, 0)
	put("config/expiring", "soon", time.Hour, 0)
	put("alive/alice", "10.0.0.1", 0, alice)

	// etcd: a lease of the client's choosing with keys, a Txn, history.
	const etcdLease = 0x7e57
	_, err = pb.NewLeaseClient(etcd.ActiveConnection()).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 3600, ID: etcdLease})
	must("etcd lease grant", err)
	_, err = etcd.Put(ctx, "/registry/pods/default/web-1", `{"kind":"Pod"}`, clientv3.WithLease(etcdLease))
	must("etcd put with the lease", err)
	_, err = etcd.Put(ctx, "/registry/leases/kube-node-lease/n1", "holder=n1", clientv3.WithLease(etcdLease))
	must("etcd put with the lease", err)
	for i := range 5 {
		_, err = etcd.Put(ctx, "a", fmt.Sprintf("v%d", i))
		must("etcd put a", err)
	}
	_, err = etcd.Txn(ctx).If(clientv3.Compare(clientv3.Value("a"), "=", "v4")).
		Then(clientv3.OpPut("b", "from a txn"), clientv3.OpDelete("config/feature")).Commit()
	must("etcd txn", err)
	cr, err := etcd.Put(ctx, "a", "v5")
	must("etcd put a", err)
	_, err = etcd.Compact(ctx, cr.Header.Revision-2)
	must("etcd compact", err)
	past := cr.Header.Revision

	// Past the snapshot threshold (256 entries), then more after it.
	for i := range 300 {
		put(fmt.Sprintf("fill/%03d", i), strings.Repeat("x", i%17), 0, 0)
	}
	put("config/feature", "back on", 0, 0)
	_, err = etcd.Put(ctx, "a", "after the snapshot")
	must("etcd put a", err)
	acquire(&tenurev1.AcquireRequest{SessionId: bob, Namespace: "jobs", Name: "nightly", Value: "bob's", Labels: map[string]string{"cron": "nightly"}})

	// bob waits for the scheduler: a waiter in the state when the node dies.
	waiting, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() {
		_, _ = p.api.leases.Acquire(waiting, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: bob, Name: "scheduler", Wait: true}))
	}()
	waitFor(t, 10*time.Second, "bob to wait for the scheduler", func() bool {
		l, err := p.api.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Name: "scheduler"}))
		return err == nil && len(l.Msg.GetLease().GetWaiters()) == 1
	})

	st := captureUpgradeState(t, ctx, p.api, etcd, past, etcdLease)
	p.kill() // as a crash would: the waiter stays queued
	if err := os.RemoveAll(upgradeDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(upgradeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(st, "", "  ")
	must("marshal the state", err)
	must("write expected.json", os.WriteFile(filepath.Join(upgradeDir, "expected.json"), append(out, '\n'), 0o644))
	writeTar(t, p.dataDir, filepath.Join(upgradeDir, upgradeArchive))
}

// writeTar packs the regular files under dir, the LOCK file aside, into
// a gzipped tar at archive.
func writeTar(t *testing.T, dir, archive string) {
	t.Helper()
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir || d.Name() == "LOCK" {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name, h.ModTime = filepath.ToSlash(rel), time.Unix(0, 0)
		if err := tw.WriteHeader(h); err != nil || d.IsDir() {
			return err
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	for _, e := range []error{err, tw.Close(), zw.Close(), f.Close()} {
		if e != nil {
			t.Fatal(e)
		}
	}
}
