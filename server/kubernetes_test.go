package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protowire"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/kubelease"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// kubeLease is a Lease to store as kube-apiserver stores it.
type kubeLease struct {
	ns, name, holder        string
	seconds, transitions    int32
	acquire, renew          time.Time
	padding                 int // bytes of an unknown metadata field, to make the value large
	otherNamespace, garbled bool
}

// value is l in kube-apiserver's protobuf storage encoding: "k8s\x00"
// and a runtime.Unknown around a coordination.k8s.io/v1 Lease, field by
// field as kubelease's package note (and the golden files, written by
// Kubernetes itself) has it.
func (l kubeLease) value() []byte {
	msg := slices.Concat[[]byte]
	str := func(n protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, n, protowire.BytesType), s)
	}
	sub := func(n protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, n, protowire.BytesType), b)
	}
	num := func(n protowire.Number, v int64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, n, protowire.VarintType), uint64(v))
	}
	micro := func(n protowire.Number, t time.Time) []byte {
		if t.IsZero() {
			return nil
		}
		return sub(n, msg(num(1, t.Unix()), num(2, int64(t.Nanosecond()/1000*1000))))
	}
	ns := l.ns
	if l.otherNamespace {
		ns = "kube-system"
	}
	meta := msg(str(1, l.name), str(3, ns), str(15, strings.Repeat("x", l.padding)))
	var spec []byte
	if l.holder != "" {
		spec = msg(spec, str(1, l.holder))
	}
	spec = msg(spec, num(2, int64(l.seconds)), micro(3, l.acquire), micro(4, l.renew), num(5, int64(l.transitions)))
	lease := msg(sub(1, meta), sub(2, spec))
	if l.garbled {
		lease = lease[:len(lease)-3]
	}
	typeMeta := msg(str(1, "coordination.k8s.io/v1"), str(2, "Lease"))
	return msg([]byte("k8s\x00"), sub(1, typeMeta), sub(2, lease), str(4, "application/vnd.kubernetes.protobuf"))
}

func (l kubeLease) key() string { return "/registry/leases/" + l.ns + "/" + l.name }

// kubernetesLeases are the leases of kind kubernetes in a native list
// across all namespaces, by namespace/name.
func kubernetesLeases(t *testing.T, ctx context.Context, leases tenurev1connect.LeaseServiceClient) map[string]*tenurev1.Lease {
	t.Helper()
	resp, err := leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{AllNamespaces: true}))
	if err != nil {
		t.Fatalf("ListLeases: %v", err)
	}
	out := map[string]*tenurev1.Lease{}
	for _, l := range resp.Msg.GetLeases() {
		if l.GetKind() == nativeapi.KubernetesKind {
			out[l.GetNamespace()+"/"+l.GetName()] = l
		}
	}
	return out
}

func TestKubeLeaseValueDecodes(t *testing.T) {
	// The test's encoder against the decoder: the two agree, and the
	// decoder agrees with Kubernetes' own bytes (package kubelease).
	now := time.Now().UTC().Truncate(time.Microsecond)
	l := kubeLease{ns: "kube-system", name: "kube-scheduler", holder: "a", seconds: 15, transitions: 2, acquire: now, renew: now}
	got, ok := kubelease.Decode(l.value())
	if !ok || got.HolderIdentity != "a" || got.LeaseDurationSeconds != 15 || got.LeaseTransitions != 2 || !got.RenewTime.Equal(now) || got.Name != "kube-scheduler" {
		t.Fatalf("Decode(kubeLease.value()) = %+v, %v", got, ok)
	}
}

// The Kubernetes Leases kube-apiserver stores show in a native list
// across namespaces as leases of kind kubernetes: holder, duration,
// times, transitions, status held, expired or released, the key and its
// revision. Each holder change — and only that, not a renewal — is one
// audit line and counts in the per-lease metrics; a Tenure lease of the
// same name is another lease, whose calls leave the key alone; keys that
// hold no Lease, or one naming another key, are not listed; names that
// are not UTF-8 are escaped; a 1 MiB value changes nothing.
func TestKubernetesLeasesShowAsLeases(t *testing.T) {
	logs := &lockedBuffer{}
	etcdLn := testnet.Listen(t)
	srv, err := Open(Config{
		Listener:         testnet.Listen(t),
		Limits:           testLimits(),
		Logger:           slog.New(slog.NewTextHandler(logs, nil)),
		Etcd:             EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String()},
		Raft:             oneNodeRaft(t),
		KubernetesPrefix: "/registry",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	url := "http://" + srv.Addr()
	waitReady(t, url)
	ts := &testServer{Server: srv, URL: url, Leases: tenurev1connect.NewLeaseServiceClient(h2cClient(t), url), Sessions: tenurev1connect.NewSessionServiceClient(h2cClient(t), url)}
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdLn.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(key string, value []byte) int64 {
		t.Helper()
		resp, err := ec.Put(ctx, key, string(value))
		if err != nil {
			t.Fatalf("put %q: %v", key, err)
		}
		return resp.Header.Revision
	}

	// The page's watch, from now on.
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/watch/leases?all_namespaces=true&kubernetes_leases=true", nil)
	w, err := http.DefaultClient.Do(req)
	if err != nil || w.StatusCode != http.StatusOK {
		t.Fatalf("watch with kubernetes_leases: %v %v", w.Status, err)
	}
	defer w.Body.Close()

	now := time.Now().UTC().Truncate(time.Microsecond)
	sched := kubeLease{ns: "kube-system", name: "kube-scheduler", holder: "node-1_a", seconds: 15, acquire: now, renew: now}
	rev := put(sched.key(), sched.value())
	l := kubernetesLeases(t, ctx, ts.Leases)["kube-system/kube-scheduler"]
	if l == nil {
		t.Fatalf("kube-system/kube-scheduler is not listed")
	}
	if l.GetHolderIdentity() != "node-1_a" || l.GetLeaseDuration().AsDuration() != 15*time.Second || l.GetStatus() != "held" ||
		!l.GetAcquireTime().AsTime().Equal(now) || !l.GetRenewTime().AsTime().Equal(now) || l.GetLeaseTransitions() != 0 ||
		string(l.GetKey()) != sched.key() || l.GetResourceVersion() != rev || l.GetFencingToken() != 0 || len(l.GetHolders()) != 0 {
		t.Errorf("kube-scheduler: got = %v, expected: held by node-1_a for 15s since %v, no token, key %s at %d", l, now, sched.key(), rev)
	}

	// Renewed: no holder change. Handed over to node-2_b, then released.
	sched.renew = now.Add(2 * time.Second)
	put(sched.key(), sched.value())
	sched.holder, sched.transitions, sched.acquire, sched.renew = "node-2_b", 1, now.Add(3*time.Second), now.Add(3*time.Second)
	handover := put(sched.key(), sched.value())
	sched.holder = ""
	release := put(sched.key(), sched.value())
	if l := kubernetesLeases(t, ctx, ts.Leases)["kube-system/kube-scheduler"]; l.GetStatus() != "released" || l.GetHolderIdentity() != "" || l.GetLeaseTransitions() != 1 {
		t.Errorf("released kube-scheduler: got = %v, expected: released, no holder, 1 transition", l)
	}

	// A node that stopped renewing 60s ago with a 40s lease.
	node := kubeLease{ns: "kube-node-lease", name: "node-3", holder: "node-3", seconds: 40, renew: now.Add(-time.Minute)}
	put(node.key(), node.value())
	if l := kubernetesLeases(t, ctx, ts.Leases)["kube-node-lease/node-3"]; l.GetStatus() != "expired" {
		t.Errorf("node-3: got = %v, expected: expired", l)
	}

	// What is not listed, and what is, escaped, or large.
	put("/registry/leases/x/garbage", []byte("\x00\xffgarbage"))
	put("/registry/leases/x/truncated", kubeLease{ns: "x", name: "truncated", holder: "h", garbled: true}.value())
	put("/registry/leases/x/liar", kubeLease{ns: "x", name: "liar", holder: "h", otherNamespace: true}.value())
	put("/registry/leases/x/huge-garbage", make([]byte, 1<<20))
	put("/registry/leases/x/huge", kubeLease{ns: "x", name: "huge", holder: "h", seconds: 10, renew: now, padding: 1 << 20}.value())
	odd := kubeLease{ns: "n\xff", name: "m\x01\\", holder: "h\xfe", seconds: 10, renew: now}
	put(odd.key(), odd.value())
	got := kubernetesLeases(t, ctx, ts.Leases)
	for _, name := range []string{"x/garbage", "x/truncated", "x/liar", "x/huge-garbage", "kube-system/liar"} {
		if got[name] != nil {
			t.Errorf("%s is listed: %v", name, got[name])
		}
	}
	if l := got["x/huge"]; l.GetHolderIdentity() != "h" {
		t.Errorf("x/huge (a 1 MiB Lease): got = %v, expected: held by h", l)
	}
	if l := got[`n\xff/m\x01\\`]; l.GetHolderIdentity() != `h\xfe` || string(l.GetKey()) != odd.key() {
		t.Errorf("a Lease under names that are not UTF-8: got = %v (all: %v), expected: escaped names and holder, the key's bytes", l, got)
	}

	// A Tenure lease of the same name is another lease; releasing it or
	// revoking it leaves the key as it was.
	sess, err := ts.Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "tenure-client"}))
	if err != nil {
		t.Fatal(err)
	}
	acq, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sess.Msg.GetSession().GetId(), Namespace: "kube-system", Name: "kube-scheduler"}))
	if err != nil || !acq.Msg.GetAcquired() {
		t.Fatalf("acquire the Tenure kube-system/kube-scheduler: %v", err)
	}
	if _, err := ts.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: "kube-system", Name: "kube-scheduler", Token: acq.Msg.GetToken()})); err != nil {
		t.Fatal(err)
	}
	kv, err := ec.Get(ctx, sched.key())
	if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].ModRevision != release {
		t.Errorf("the Kubernetes key after a Tenure release of the same name: %v, %v; expected: untouched since revision %d", kv, err, release)
	}
	resp, err := ts.Leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{AllNamespaces: true}))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, l := range resp.Msg.GetLeases() {
		if l.GetNamespace() == "kube-system" && l.GetName() == "kube-scheduler" {
			kinds[l.GetKind()]++
		}
	}
	if kinds[""] != 1 || kinds[nativeapi.KubernetesKind] != 1 {
		t.Errorf("kube-system/kube-scheduler by kind: got = %v, expected: one Tenure lease, one Kubernetes Lease", kinds)
	}
	one, err := ts.Leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{Namespace: "kube-system"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range one.Msg.GetLeases() {
		if l.GetKind() != "" {
			t.Errorf("a list of the Tenure namespace kube-system holds a %s lease: %v", l.GetKind(), l)
		}
	}

	// One audit line per holder change, in order, none for the renewal.
	var audited []string
	for _, a := range auditLines(t, logs.String(), func(f map[string]string) bool { return f["target"] == "(kubernetes)/kube-system/kube-scheduler" }) {
		audited = append(audited, a["action"]+": "+a["reason"]+" by "+a["principal"])
	}
	expected := []string{
		fmt.Sprintf(`kubernetes.lease.acquire: holder "" -> "node-1_a" at revision %d; transitions 0 by (server)`, rev),
		fmt.Sprintf(`kubernetes.lease.handover: holder "node-1_a" -> "node-2_b" at revision %d; transitions 1 by (server)`, handover),
		fmt.Sprintf(`kubernetes.lease.release: holder "node-2_b" -> "" at revision %d; transitions 1 by (server)`, release),
	}
	if strings.Join(audited, "\n") != strings.Join(expected, "\n") {
		t.Errorf("audit lines:\ngot      = %q\nexpected: %q", audited, expected)
	}
	metrics := metricsText(t, ts)
	for _, s := range []string{
		`tenure_lease_grants_total{lease="kube-scheduler",namespace="(kubernetes)/kube-system"} 2`,
		`tenure_lease_hold_seconds_count{lease="kube-scheduler",namespace="(kubernetes)/kube-system"} 2`,
		`tenure_lease_holders{lease="kube-scheduler",namespace="(kubernetes)/kube-system"} 0`,
		`tenure_lease_holders{lease="node-3",namespace="(kubernetes)/kube-node-lease"} 0`,
		`tenure_lease_holders{lease="huge",namespace="(kubernetes)/x"} 1`,
	} {
		if !strings.Contains(metrics, s) {
			t.Errorf("/metrics lacks %s", s)
		}
	}

	// The watch saw each put of kube-scheduler's key as a Kubernetes
	// Lease event.
	seen := 0
	lines := bufio.NewScanner(w.Body)
	lines.Buffer(nil, 4<<20)
	for seen < 4 && lines.Scan() {
		var ev struct {
			Type, Kind, Namespace, Name string
			Key                         []byte
		}
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		if ev.Type == "LEASE_EVENT_TYPE_KUBERNETES_LEASE" && ev.Namespace == "kube-system" && ev.Name == "kube-scheduler" {
			if ev.Kind != nativeapi.KubernetesKind || string(ev.Key) != sched.key() {
				t.Errorf("event: got = %s, expected: kind kubernetes, key %s", lines.Text(), sched.key())
			}
			seen++
		}
	}
	if seen != 4 {
		t.Errorf("kube-scheduler events: got = %d, expected: 4 (%v)", seen, lines.Err())
	}
}

const kubePolicy = `
principals:
  - name: alice
    roles: [alice]
    etcd_password_bcrypt: %q
    tokens: [{sha256: %q}]
  - name: mallory
    roles: [mallory]
    etcd_password_bcrypt: %q
    tokens: [{sha256: %q}]
  - name: apiserver
    roles: [admin]
    etcd_password_bcrypt: %q
    tokens: [{sha256: %q}]
roles:
  alice:
    - keys: [/registry/leases/team-a/]
      verbs: [read]
  mallory:
    - keys: [/registry/leases/mallory/]
      verbs: [read, write]
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
`

// A Kubernetes Lease shows only to who may read its key: alice reads
// team-a's, mallory writes her own key under /registry/leases/ whose
// value claims to be a Lease — shown to her, to nobody who may not read
// it — and the apiserver's principal sees all three.
func TestKubernetesLeasesFollowThePolicy(t *testing.T) {
	dir := t.TempDir()
	tokens := map[string]string{"alice": auth.NewToken(), "mallory": auth.NewToken(), "apiserver": auth.NewToken()}
	policyFile := filepath.Join(dir, "policy.yaml")
	body := fmt.Sprintf(kubePolicy, bcryptOf(t, "alice-pw"), auth.HashToken(tokens["alice"]), bcryptOf(t, "mallory-pw"), auth.HashToken(tokens["mallory"]),
		bcryptOf(t, "apiserver-pw"), auth.HashToken(tokens["apiserver"]))
	if err := os.WriteFile(policyFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := auth.Load(policyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	etcdLn := testnet.Listen(t)
	srv, err := Open(Config{
		Listener:         testnet.Listen(t),
		Auth:             &auth.Authenticator{Policy: src},
		Limits:           testLimits(),
		Logger:           slog.New(slog.DiscardHandler),
		Etcd:             EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String()},
		Raft:             oneNodeRaft(t),
		KubernetesPrefix: "/registry",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(user string, l kubeLease) {
		t.Helper()
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdLn.Addr().String()}, Username: user, Password: user + "-pw", DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatalf("etcd client (%s): %v", user, err)
		}
		defer c.Close()
		for {
			if _, err = c.Put(ctx, l.key(), string(l.value())); err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("put %s as %s: %v", l.key(), user, err)
			}
			time.Sleep(20 * time.Millisecond) // not ready yet
		}
	}
	now := time.Now()
	put("apiserver", kubeLease{ns: "team-a", name: "leader", holder: "a-1", seconds: 15, renew: now})
	put("apiserver", kubeLease{ns: "kube-system", name: "kube-scheduler", holder: "node-1", seconds: 15, renew: now})
	put("mallory", kubeLease{ns: "mallory", name: "kube-scheduler", holder: "mallory", seconds: 15, renew: now})
	native := func(who string) tenurev1connect.LeaseServiceClient {
		hc := h2cClient(t)
		tr := hc.Transport
		hc.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tokens[who])
			return tr.RoundTrip(r)
		})
		return tenurev1connect.NewLeaseServiceClient(hc, "http://"+srv.Addr())
	}
	for _, c := range []struct {
		who      string
		expected string
	}{
		{"alice", "[team-a/leader]"},
		{"mallory", "[mallory/kube-scheduler]"},
		{"apiserver", "[kube-system/kube-scheduler mallory/kube-scheduler team-a/leader]"},
	} {
		var names []string
		for name := range kubernetesLeases(t, ctx, native(c.who)) {
			names = append(names, name)
		}
		slices.Sort(names)
		if got := fmt.Sprint(names); got != c.expected {
			t.Errorf("%s sees: got = %s, expected: %s", c.who, got, c.expected)
		}
	}

	// Alice's watch from the start: the events of team-a's Lease, none
	// of the others'. The apiserver writes team-a's again to end it.
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+srv.Addr()+"/v1/watch/leases?all_namespaces=true&kubernetes_leases=true&start_revision=1", nil)
	req.Header.Set("Authorization", "Bearer "+tokens["alice"])
	w, err := http.DefaultClient.Do(req)
	if err != nil || w.StatusCode != http.StatusOK {
		t.Fatalf("alice's watch: %v, %v", w.Status, err)
	}
	defer w.Body.Close()
	put("apiserver", kubeLease{ns: "team-a", name: "leader", holder: "a-2", seconds: 15, renew: now})
	seen := map[string]int{}
	lines := bufio.NewScanner(w.Body)
	for seen["team-a/leader"] < 2 && lines.Scan() {
		var ev struct{ Type, Namespace, Name string }
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		if ev.Type == "LEASE_EVENT_TYPE_KUBERNETES_LEASE" {
			seen[ev.Namespace+"/"+ev.Name]++
		}
	}
	if fmt.Sprint(seen) != "map[team-a/leader:2]" {
		t.Errorf("alice's Kubernetes Lease events: got = %v, expected: team-a/leader's two, no other", seen)
	}
	req, _ = http.NewRequestWithContext(ctx, "GET", "http://"+srv.Addr()+"/v1/watch/leases?namespace=team-a&kubernetes_leases=true", nil)
	req.Header.Set("Authorization", "Bearer "+tokens["apiserver"])
	if w, err := http.DefaultClient.Do(req); err != nil || w.StatusCode != http.StatusBadRequest {
		t.Errorf("kubernetes_leases on a watch of one namespace: got = %v, %v, expected: 400", w.Status, err)
	} else {
		w.Body.Close()
	}
}

// Every node follows the same events, but only the one leading when it
// applies them writes the audit line: a follower counts the handover in
// its metrics and writes nothing. A restore starts again from the
// restored keys, so the next change is judged against them.
func TestKubeTrackerAuditsOnTheLeaderOnly(t *testing.T) {
	lm := newLeaseMetrics(nil, 10)
	var lines []string
	leading := false
	kt := newKubeTracker("/registry", lm, func(e auth.Entry) { lines = append(lines, e.Action+" "+e.Target) }, func() bool { return leading })
	now := time.Now()
	put := func(rev int64, l kubeLease) {
		kt.observe([]statemachine.Event{{Type: statemachine.EventKeyPut, Time: now.UnixNano(), KV: &statemachine.KeyValue{Key: l.key(), Value: string(l.value()), ModRevision: rev}}})
	}
	put(2, kubeLease{ns: "ns", name: "l", holder: "a", seconds: 10, renew: now})
	if len(lines) != 0 {
		t.Errorf("a follower audited: %q", lines)
	}
	leading = true
	put(3, kubeLease{ns: "ns", name: "l", holder: "b", seconds: 10, renew: now})
	kt.observe([]statemachine.Event{{Type: statemachine.EventKeyDeleted, Time: now.UnixNano(), KV: &statemachine.KeyValue{Key: "/registry/leases/ns/l", ModRevision: 4}}})
	if expected := []string{"kubernetes.lease.handover (kubernetes)/ns/l", "kubernetes.lease.release (kubernetes)/ns/l"}; fmt.Sprint(lines) != fmt.Sprint(expected) {
		t.Errorf("the leader's audit lines: got = %q, expected: %q", lines, expected)
	}
	m := statemachine.New()
	m.Apply(1, statemachine.SetVersion{Version: statemachine.BinaryVersion})
	l := kubeLease{ns: "ns", name: "l", holder: "c", seconds: 10, renew: now}
	m.Apply(2, statemachine.Put{Key: l.key(), Value: string(l.value())})
	kt.reset(m)
	lines = nil
	put(6, kubeLease{ns: "ns", name: "l", holder: "c", seconds: 10, renew: now.Add(time.Second)})
	put(7, kubeLease{ns: "ns", name: "l", holder: "d", seconds: 10, renew: now.Add(time.Second)})
	if expected := []string{"kubernetes.lease.handover (kubernetes)/ns/l"}; fmt.Sprint(lines) != fmt.Sprint(expected) {
		t.Errorf("after a restore held by c, c renews and d takes over: got = %q, expected: %q", lines, expected)
	}
}
