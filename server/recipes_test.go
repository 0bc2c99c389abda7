package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.uber.org/zap"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// startEtcdNode is a test server with its etcd listener on, and an etcd
// client of it.
func startEtcdNode(t *testing.T) (*testServer, *clientv3.Client) {
	t.Helper()
	ts := startServer(t, t.TempDir(), testLimits())
	return ts, serveEtcd(t, ts)
}

// recipeLock is the etcd lock of prefix in a native ListLeases across all
// namespaces by leases, nil when it is not listed.
func recipeLock(t *testing.T, ctx context.Context, leases interface {
	List(context.Context, *connect.Request[tenurev1.ListLeasesRequest]) (*connect.Response[tenurev1.ListLeasesResponse], error)
}, prefix string) *tenurev1.Lease {
	t.Helper()
	resp, err := leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{AllNamespaces: true}))
	if err != nil {
		t.Fatalf("ListLeases: %v", err)
	}
	for _, l := range resp.Msg.GetLeases() {
		if l.GetKind() == nativeapi.RecipeKind && string(l.GetKeyPrefix()) == prefix {
			return l
		}
	}
	return nil
}

// awaitRecipeLock polls until the etcd lock of prefix satisfies ok.
func awaitRecipeLock(t *testing.T, ctx context.Context, ts *testServer, prefix, what string, ok func(*tenurev1.Lease) bool) *tenurev1.Lease {
	t.Helper()
	for {
		l := recipeLock(t, ctx, ts.Leases, prefix)
		if ok(l) {
			return l
		}
		if ctx.Err() != nil {
			t.Fatalf("etcd lock %q never showed %s; last seen: %v", prefix, what, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waiting is how many wait for l, -1 when l is not listed.
func waiting(l *tenurev1.Lease) int {
	if l == nil {
		return -1
	}
	return len(l.GetWaiters())
}

// createRevision is key's create revision, etcd's fencing value for it.
func createRevision(t *testing.T, ctx context.Context, c *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get %q: %v, %d keys", key, err, len(resp.Kvs))
	}
	return resp.Kvs[0].CreateRevision
}

// checkHolder checks the holder and waiters of an etcd lock l: holder's
// etcd lease, its key's create revision as the fencing token, waiters'
// leases in order, and an acquire time within [from, to].
func checkHolder(t *testing.T, l *tenurev1.Lease, holder clientv3.LeaseID, token int64, from, to time.Time, waiters ...clientv3.LeaseID) {
	t.Helper()
	if len(l.GetHolders()) != 1 {
		t.Fatalf("holders: got = %v, expected: one", l.GetHolders())
	}
	g := l.GetHolders()[0]
	if g.GetEtcdLeaseId() != int64(holder) || l.GetFencingToken() != token || g.GetToken() != token || l.GetHolderIdentity() != "etcd" || l.GetStatus() != "held" {
		t.Errorf("holder: got = lease %x, token %d/%d, identity %q, status %q, expected: lease %x, token %d, identity etcd, held",
			g.GetEtcdLeaseId(), l.GetFencingToken(), g.GetToken(), l.GetHolderIdentity(), l.GetStatus(), int64(holder), token)
	}
	if at := l.GetAcquireTime(); at == nil || at.AsTime().Before(from.Add(-time.Second)) || at.AsTime().After(to.Add(time.Second)) {
		t.Errorf("since: got = %v, expected: between %v and %v", at, from, to)
	}
	var got, expected []string
	for _, w := range l.GetWaiters() {
		got = append(got, fmt.Sprintf("%x", w.GetEtcdLeaseId()))
		if w.GetSince() == nil {
			t.Errorf("waiter %x: no since, though this node saw its key created", w.GetEtcdLeaseId())
		}
	}
	for _, w := range waiters {
		expected = append(expected, fmt.Sprintf("%x", int64(w)))
	}
	if strings.Join(got, ",") != strings.Join(expected, ",") {
		t.Errorf("waiters: got = %v, expected: %v", got, expected)
	}
}

// metricsText is the node's /metrics.
func metricsText(t *testing.T, ts *testServer) string {
	t.Helper()
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A clientv3 Mutex, a second one waiting and a Lock call of etcd's Lock
// service (etcdctl lock's) waiting behind it show, in a native
// ListLeases across namespaces, as one lease of kind etcd-lock: the
// first holder with its etcd lease and its key's create revision as the
// fencing token, the others waiting in order. When the holder's lease is
// revoked, and then when the next one's session closes, the lock passes
// down the queue, and the list and the metrics follow.
func TestEtcdMutexAndLockServiceShowAsALease(t *testing.T) {
	ts, c := startEtcdNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(c, concurrency.WithTTL(60))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	s1, s2, s3 := session(), session(), session()

	before := time.Now()
	m1 := concurrency.NewMutex(s1, "locks/db")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if rev := createRevision(t, ctx, c, m1.Key()); rev != m1.Header().Revision {
		t.Fatalf("an uncontended Mutex's revision %d is not its key's create revision %d", m1.Header().Revision, rev)
	}
	l := awaitRecipeLock(t, ctx, ts, "locks/db/", "a holder", func(l *tenurev1.Lease) bool { return l != nil })
	checkHolder(t, l, s1.Lease(), m1.Header().Revision, before, after)
	if l.GetName() != "locks/db" || l.GetNamespace() != "" {
		t.Errorf("name: got = %q/%q, expected: no namespace, name locks/db", l.GetNamespace(), l.GetName())
	}

	// Then a Mutex waits, then a Lock call of etcd's Lock service.
	m2 := concurrency.NewMutex(s2, "locks/db")
	m2done := make(chan error, 1)
	go func() { m2done <- m2.Lock(ctx) }()
	awaitRecipeLock(t, ctx, ts, "locks/db/", "one waiter", func(l *tenurev1.Lease) bool { return waiting(l) == 1 })
	lock := v3lockpb.NewLockClient(c.ActiveConnection())
	type lockAnswer struct {
		resp *v3lockpb.LockResponse
		err  error
	}
	m3done := make(chan lockAnswer, 1)
	go func() {
		resp, err := lock.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("locks/db"), Lease: int64(s3.Lease())})
		m3done <- lockAnswer{resp, err}
	}()
	l = awaitRecipeLock(t, ctx, ts, "locks/db/", "two waiters", func(l *tenurev1.Lease) bool { return waiting(l) == 2 })
	checkHolder(t, l, s1.Lease(), m1.Header().Revision, before, after, s2.Lease(), s3.Lease())
	m := metricsText(t, ts)
	for _, line := range []string{
		`tenure_lease_holders{lease="locks/db",namespace="(etcd)"} 1`,
		`tenure_lease_queued{lease="locks/db",namespace="(etcd)"} 2`,
		`tenure_lease_grants_total{lease="locks/db",namespace="(etcd)"} 1`,
	} {
		if !strings.Contains(m, line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// The holder's lease is revoked: the first waiter holds.
	before = time.Now()
	if _, err := c.Revoke(ctx, s1.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := <-m2done; err != nil {
		t.Fatalf("the waiting Mutex: %v", err)
	}
	after = time.Now()
	l = awaitRecipeLock(t, ctx, ts, "locks/db/", "the handover", func(l *tenurev1.Lease) bool { return waiting(l) == 1 })
	checkHolder(t, l, s2.Lease(), createRevision(t, ctx, c, m2.Key()), before, after, s3.Lease())

	// The new holder's session closes: the Lock call holds.
	before = time.Now()
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	got := <-m3done
	if got.err != nil {
		t.Fatalf("the waiting Lock call: %v", got.err)
	}
	after = time.Now()
	l = awaitRecipeLock(t, ctx, ts, "locks/db/", "the second handover", func(l *tenurev1.Lease) bool { return waiting(l) == 0 })
	checkHolder(t, l, s3.Lease(), createRevision(t, ctx, c, string(got.resp.Key)), before, after)

	// Unlocked, it is gone from the list; its series count three grants,
	// two waits and three holds.
	if _, err := lock.Unlock(ctx, &v3lockpb.UnlockRequest{Key: got.resp.Key}); err != nil {
		t.Fatal(err)
	}
	awaitRecipeLock(t, ctx, ts, "locks/db/", "its end", func(l *tenurev1.Lease) bool { return l == nil })
	labels := map[string]string{"namespace": "(etcd)", "lease": "locks/db"}
	for _, c := range []struct {
		name     string
		expected float64
	}{
		{"tenure_lease_grants_total", 3},
		{"tenure_lease_wait_seconds", 2},
		{"tenure_lease_hold_seconds", 3},
		{"tenure_lease_expirations_total", 0},
	} {
		if got := series(t, ts.cfg.Registry, c.name, labels); got != c.expected {
			t.Errorf("%s of the etcd lock: got = %v, expected: %v", c.name, got, c.expected)
		}
	}
}

// An Election under a name that is not UTF-8 shows its leader's
// proclamation as the value, a second candidate waiting, and passes to
// it when the leader resigns; the name is escaped, the prefix exact.
func TestEtcdElectionShowsAsALease(t *testing.T) {
	ts, c := startEtcdNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s1, err := concurrency.NewSession(c, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(c, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	const name = "el/\xff\x00\\"
	e1 := concurrency.NewElection(s1, name)
	if err := e1.Campaign(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	e2 := concurrency.NewElection(s2, name)
	e2done := make(chan error, 1)
	go func() { e2done <- e2.Campaign(ctx, "v2") }()
	l := awaitRecipeLock(t, ctx, ts, name+"/", "a waiting candidate", func(l *tenurev1.Lease) bool { return waiting(l) == 1 })
	if l.GetName() != `el/\xff\x00\\` || l.GetValue() != "v1" || l.GetHolders()[0].GetEtcdLeaseId() != int64(s1.Lease()) {
		t.Errorf("election: got = name %q, value %q, leader %x, expected: name %q, value v1, leader %x",
			l.GetName(), l.GetValue(), l.GetHolders()[0].GetEtcdLeaseId(), `el/\xff\x00\\`, int64(s1.Lease()))
	}
	since := l.GetAcquireTime().AsTime()
	if err := e1.Proclaim(ctx, "v1b"); err != nil {
		t.Fatal(err)
	}
	l = awaitRecipeLock(t, ctx, ts, name+"/", "the proclamation", func(l *tenurev1.Lease) bool { return l.GetValue() == "v1b" })
	if !l.GetAcquireTime().AsTime().Equal(since) {
		t.Errorf("a proclamation moved since: got = %v, expected: %v", l.GetAcquireTime().AsTime(), since)
	}
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-e2done; err != nil {
		t.Fatal(err)
	}
	l = awaitRecipeLock(t, ctx, ts, name+"/", "the new leader", func(l *tenurev1.Lease) bool { return waiting(l) == 0 && l.GetValue() == "v2" })
	if l.GetHolders()[0].GetEtcdLeaseId() != int64(s2.Lease()) || !bytes.Equal(l.GetKeyPrefix(), []byte(name+"/")) {
		t.Errorf("new leader: got = %x under %q, expected: %x under %q", l.GetHolders()[0].GetEtcdLeaseId(), l.GetKeyPrefix(), int64(s2.Lease()), name+"/")
	}
	if !strings.Contains(metricsText(t, ts), `tenure_lease_grants_total{lease="el/\\xff\\x00\\\\",namespace="(etcd)"} 2`) {
		t.Errorf("/metrics lacks the election's two grants under its escaped name")
	}
}

// recipePolicy: alice reads and writes alice/ only, admin everything;
// each by etcd password and by token.
const recipePolicy = `
principals:
  - name: alice
    roles: [own]
    etcd_password_bcrypt: %q
    tokens: [{sha256: %q}]
  - name: admin
    roles: [admin]
    etcd_password_bcrypt: %q
    tokens: [{sha256: %q}]
roles:
  own:
    - keys: [alice/]
      verbs: [read, write]
    - namespaces: [alice]
      verbs: [read, lock]
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
`

// A principal sees an etcd lock only where it may read the keys: alice,
// who reads alice/, sees her own lock and not admin's, through the
// native API; admin sees both. Neither is listed for a namespace.
func TestEtcdRecipeLocksFollowThePolicy(t *testing.T) {
	dir := t.TempDir()
	aliceToken, adminToken := auth.NewToken(), auth.NewToken()
	policyFile := filepath.Join(dir, "policy.yaml")
	body := fmt.Sprintf(recipePolicy, bcryptOf(t, "alice-pw"), auth.HashToken(aliceToken), bcryptOf(t, "admin-pw"), auth.HashToken(adminToken))
	if err := os.WriteFile(policyFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := auth.Load(policyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	etcdLn := testnet.Listen(t)
	srv, err := Open(Config{
		Listener: testnet.Listen(t),
		Auth:     &auth.Authenticator{Policy: src},
		Limits:   testLimits(),
		Logger:   slog.New(slog.DiscardHandler),
		Etcd:     EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String()},
		Raft:     oneNodeRaft(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	etcdClient := func(user, password string) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{
			Endpoints: []string{etcdLn.Addr().String()}, Username: user, Password: password,
			DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		})
		if err != nil {
			t.Fatalf("etcd client (%s): %v", user, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	native := func(token string) tenurev1connect.LeaseServiceClient {
		hc := h2cClient(t)
		tr := hc.Transport
		hc.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token)
			return tr.RoundTrip(r)
		})
		return tenurev1connect.NewLeaseServiceClient(hc, "http://"+srv.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lock := func(c *clientv3.Client, name string) {
		t.Helper()
		for {
			s, err := concurrency.NewSession(c, concurrency.WithTTL(60))
			if err == nil {
				t.Cleanup(func() { _ = s.Close() })
				if err = concurrency.NewMutex(s, name).Lock(ctx); err == nil {
					return
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("lock %s: %v", name, err)
			}
			time.Sleep(20 * time.Millisecond) // not ready yet
		}
	}
	lock(etcdClient("alice", "alice-pw"), "alice/lock")
	lock(etcdClient("admin", "admin-pw"), "admin/lock")

	alice, admin := native(aliceToken), native(adminToken)
	l := recipeLock(t, ctx, alice, "alice/lock/")
	if l == nil || l.GetHolderIdentity() != "alice" {
		t.Errorf("alice's own lock: got = %v, expected: listed, held by alice", l)
	}
	if l := recipeLock(t, ctx, alice, "admin/lock/"); l != nil {
		t.Errorf("alice sees admin's etcd lock: %v", l)
	}
	if recipeLock(t, ctx, admin, "admin/lock/") == nil || recipeLock(t, ctx, admin, "alice/lock/") == nil {
		t.Errorf("admin does not see both etcd locks")
	}
	resp, err := alice.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{Namespace: "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range resp.Msg.GetLeases() {
		if l.GetKind() != "" {
			t.Errorf("a list of namespace alice holds an etcd lock: %v", l)
		}
	}

	// The page's watch, as alice, from the start: the etcd-lock events of
	// her keys, up to her last lock, and none of admin's.
	lock(etcdClient("alice", "alice-pw"), "alice/end")
	watch := func(query string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+srv.Addr()+"/v1/watch/leases?"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	w := watch("all_namespaces=true&etcd_locks=true&start_revision=1")
	if w.StatusCode != http.StatusOK {
		t.Fatalf("watch with etcd_locks: got = %s, expected: 200", w.Status)
	}
	seen := map[string]int{}
	lines := bufio.NewScanner(w.Body)
	for seen["alice/end/"] == 0 && lines.Scan() {
		var ev struct {
			Type      string `json:"type"`
			Kind      string `json:"kind"`
			Name      string `json:"name"`
			KeyPrefix []byte `json:"keyPrefix"`
		}
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		if ev.Type == "LEASE_EVENT_TYPE_ETCD_LOCK" {
			if ev.Kind != nativeapi.RecipeKind || ev.Name+"/" != string(ev.KeyPrefix) {
				t.Errorf("etcd-lock event: got = %q, expected: kind etcd-lock, name its prefix without the /", lines.Text())
			}
			seen[string(ev.KeyPrefix)]++
		}
	}
	if seen["alice/lock/"] == 0 || seen["alice/end/"] == 0 || seen["admin/lock/"] != 0 {
		t.Errorf("alice's etcd-lock events by prefix: got = %v, expected: alice/lock/ and alice/end/, no admin/lock/", seen)
	}
	if w := watch("namespace=alice&etcd_locks=true"); w.StatusCode != http.StatusBadRequest {
		t.Errorf("etcd_locks on a watch of one namespace: got = %s, expected: 400", w.Status)
	}
}

// The tracker, driven by a state machine's events as the FSM goroutine
// drives it: a lock it first sees already held (a restart) has an
// unknown since, and no hold is counted when that holder goes; the
// handover it sees has the event's time, the wait of the next holder is
// counted from its key's creation, and a holder whose session expired
// counts as an expiry. A snapshot restore forgets every time.
func TestRecipeTrackerTimesAndCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	lm := newLeaseMetrics(reg, 10)
	rt := newRecipeTracker(lm)
	m := statemachine.New()
	now := time.Now().UnixNano()
	apply := func(cmd statemachine.Command) statemachine.Result {
		t.Helper()
		now += int64(time.Second)
		res := m.Apply(now, cmd)
		if res.Err != nil {
			t.Fatalf("Apply(%#v): %v", cmd, res.Err)
		}
		if len(res.Events) > 0 {
			rt.observe(m, res.Events)
		}
		return res
	}
	put := func(s *statemachine.Session) {
		apply(statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: fmt.Sprintf("l/%x", s.EtcdLeaseID()), Lease: s.EtcdLeaseID()}}})
	}
	lock := func() statemachine.RecipeLock {
		t.Helper()
		locks := m.RecipeLocks()
		if len(locks) != 1 {
			t.Fatalf("locks: got = %d, expected: 1", len(locks))
		}
		return locks[0]
	}
	apply(statemachine.SetVersion{Version: statemachine.BinaryVersion})
	a := apply(statemachine.OpenSession{Identity: "a", TTL: int64(time.Minute)}).Session
	put(a)
	b := apply(statemachine.OpenSession{Identity: "b", TTL: int64(time.Minute)}).Session
	c := apply(statemachine.OpenSession{Identity: "c", TTL: int64(time.Minute)}).Session
	put(b)
	bJoined := now
	put(c)
	if since, joined := rt.times(lock()); since == 0 || joined[1] != bJoined || joined[2] != now {
		t.Errorf("times seen from the start: got = %d, %v, expected: a since, b joined at %d, c at %d", since, joined, bJoined, now)
	}

	// A restore: the index starts again from the state restored, every
	// time unknown, and still unknown after an unrelated command.
	rt.reset(m)
	apply(statemachine.Put{Key: "other", Value: "x"})
	if since, joined := rt.times(lock()); since != 0 || joined[0] != 0 || joined[1] != 0 {
		t.Errorf("times after a restore: got = %d, %v, expected: all unknown", since, joined)
	}
	labels := map[string]string{"namespace": recipeNamespace, "lease": "l"}
	grants := series(t, reg, "tenure_lease_grants_total", labels)

	// a's session expires: b holds from that moment, having waited since
	// an unknown time; a's hold, begun unseen, is not observed.
	apply(statemachine.ExpireSessions{Epoch: m.Epoch(), IDs: []int64{a.ID}})
	expiredAt := now
	if since, _ := rt.times(lock()); since != expiredAt {
		t.Errorf("since after the expiry: got = %d, expected: %d", since, expiredAt)
	}
	if got := series(t, reg, "tenure_lease_expirations_total", labels); got != 1 {
		t.Errorf("expirations: got = %v, expected: 1", got)
	}
	if got := series(t, reg, "tenure_lease_grants_total", labels); got != grants+1 {
		t.Errorf("grants: got = %v, expected: %v", got, grants+1)
	}
	if got := series(t, reg, "tenure_lease_hold_seconds", labels) + series(t, reg, "tenure_lease_wait_seconds", labels); got != 0 {
		t.Errorf("holds and waits of unknown start: got = %v observed, expected: none", got)
	}

	// b unlocks: c, whose join was not seen either, holds; b's hold of
	// one second is observed.
	apply(statemachine.Delete{Key: fmt.Sprintf("l/%x", b.EtcdLeaseID())})
	if got := series(t, reg, "tenure_lease_hold_seconds", labels); got != 1 {
		t.Errorf("holds observed: got = %v, expected: 1", got)
	}
	// A new waiter joins and is handed the lock: its wait is observed.
	d := apply(statemachine.OpenSession{Identity: "d", TTL: int64(time.Minute)}).Session
	put(d)
	apply(statemachine.CloseSession{SessionID: c.ID})
	if got := series(t, reg, "tenure_lease_wait_seconds", labels); got != 1 {
		t.Errorf("waits observed: got = %v, expected: 1", got)
	}
	apply(statemachine.CloseSession{SessionID: d.ID})
	if len(m.RecipeLocks()) != 0 || len(rt.locks) != 0 {
		t.Errorf("after the last contender left: locks %v, tracked %v, expected: none", m.RecipeLocks(), rt.locks)
	}

	// A restore, and the very first command after it hands the lock
	// over: the handover's time is known. (Seeding the index at the first
	// command after a restore, from the state it left, once lost it.)
	e := apply(statemachine.OpenSession{Identity: "e", TTL: int64(time.Minute)}).Session
	f := apply(statemachine.OpenSession{Identity: "f", TTL: int64(time.Minute)}).Session
	put(e)
	put(f)
	rt.reset(m)
	apply(statemachine.CloseSession{SessionID: e.ID})
	if since, _ := rt.times(lock()); since != now {
		t.Errorf("since after a handover right after a restore: got = %d, expected: %d", since, now)
	}
}

// After a restart from a snapshot taken while an etcd lock was held, the
// node does not know since when its holder holds, nor since when its
// waiter waits: it says so (no acquire_time, no since) rather than
// guess. At the next handover it knows again. (The keys are put through
// the native API, bound to their sessions: the same recipe keys a
// Mutex writes, as a session is an etcd lease.)
func TestEtcdLockSinceIsUnknownAfterARestartUntilTheNextHandover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	limits := testLimits()
	snapshots := func(rc *raftnode.Config) { rc.SnapshotThreshold = 16 }
	ts := startServer(t, dir, limits, snapshots)
	put := func(ts *testServer, session int64) string {
		key := fmt.Sprintf("locks/x/%x", session)
		if _, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: key, SessionId: session})); err != nil {
			t.Fatal(err)
		}
		return key
	}
	s1 := openSession(t, ts, "one", time.Hour).Id
	s2 := openSession(t, ts, "two", time.Hour).Id
	k1 := put(ts, s1)
	put(ts, s2)
	if l := recipeLock(t, ctxT(t), ts.Leases, "locks/x/"); l == nil || l.GetAcquireTime() == nil || l.GetWaiters()[0].GetSince() == nil {
		t.Fatalf("before the restart: got = %v, expected: held with a since, one waiter with a since", l)
	}
	padLog(t, ts, 100) // a snapshot after the lock's keys
	for deadline := time.Now().Add(10 * time.Second); ; {
		snaps, _ := os.ReadDir(filepath.Join(dir, "raft", "snapshots"))
		if slices.ContainsFunc(snaps, func(e os.DirEntry) bool { return !strings.HasSuffix(e.Name(), ".tmp") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot in %s after 100 entries", filepath.Join(dir, "raft", "snapshots"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}

	ts = startServer(t, dir, limits, snapshots)
	l := recipeLock(t, ctxT(t), ts.Leases, "locks/x/")
	if l == nil || l.GetHolders()[0].GetSessionId() != s1 || len(l.GetWaiters()) != 1 {
		t.Fatalf("after the restart: got = %v, expected: held by session %d, one waiter", l, s1)
	}
	if l.GetAcquireTime() != nil || l.GetHolders()[0].GetAcquireTime() != nil || l.GetWaiters()[0].GetSince() != nil {
		t.Errorf("after the restart: got = since %v, waiter since %v, expected: both unknown", l.GetAcquireTime(), l.GetWaiters()[0].GetSince())
	}

	before := time.Now()
	if _, err := ts.KV.Delete(ctxT(t), connect.NewRequest(&tenurev1.DeleteRequest{Key: k1})); err != nil {
		t.Fatal(err)
	}
	l = recipeLock(t, ctxT(t), ts.Leases, "locks/x/")
	if l == nil || l.GetHolders()[0].GetSessionId() != s2 || l.GetAcquireTime() == nil || l.GetAcquireTime().AsTime().Before(before.Add(-time.Second)) {
		t.Errorf("after the handover: got = %v, expected: held by session %d since the delete", l, s2)
	}
}

// An etcd lock's series share --metrics-lease-names with the leases
// ((other) past it), stay while it is gone for less than recipeKeep (a
// lock taken and let go between two scrapes is still counted), and are
// deleted after, which frees the name's slot.
func TestEtcdLockSeriesShareTheCapAndGoAfterTheirKeep(t *testing.T) {
	reg := prometheus.NewRegistry()
	lm := newLeaseMetrics(reg, 1)
	lm.recipeKeep = time.Hour
	now := time.Now()
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	gauges := func(when time.Duration, recipes ...recipeGauge) {
		ch := make(chan prometheus.Metric, 100)
		lm.collectGauges(nil, recipes, now.Add(when), ch)
		close(ch)
		for range ch {
		}
	}
	grants := func(name string) float64 {
		return series(t, reg, "tenure_lease_grants_total", map[string]string{"namespace": recipeNamespace, "lease": name})
	}
	lm.recipeHandover("a/", recipeChange{time: at(time.Second), granted: true})
	lm.recipeHandover("b/", recipeChange{time: at(time.Second), granted: true}) // past the cap of 1
	if grants("a") != 1 || grants("(other)") != 1 {
		t.Fatalf("grants: got = a %v, (other) %v, expected: 1 each", grants("a"), grants("(other)"))
	}
	lm.recipeHandover("a/", recipeChange{time: at(2 * time.Second), ended: true, idle: true})
	gauges(30*time.Minute, recipeGauge{id: statemachine.LeaseID{Namespace: recipeNamespace, Name: "b"}, holders: 1})
	if grants("a") != 1 {
		t.Errorf("a gone for 30m of its 1h keep: got = %v grants, expected: its series kept", grants("a"))
	}
	gauges(2 * time.Hour) // b is gone too
	if grants("a") != 0 {
		t.Errorf("a gone for 2h: got = %v grants, expected: its series deleted", grants("a"))
	}
	lm.recipeHandover("c/", recipeChange{time: at(3 * time.Hour), granted: true})
	if grants("c") != 1 {
		t.Errorf("c after a's slot was freed: got = %v grants, expected: a series of its own", grants("c"))
	}
}
