package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// etcdNode is a single node on dir serving the etcd API, and an etcd
// client of it, ready for writes.
func etcdNode(t *testing.T, dir string, tweaks ...func(*raftnode.Config)) (*testServer, *clientv3.Client) {
	t.Helper()
	tweaks = append([]func(*raftnode.Config){func(rc *raftnode.Config) { rc.SnapshotThreshold = 16 }}, tweaks...)
	ts := startServer(t, dir, testLimits(), tweaks...)
	return ts, serveEtcd(t, ts)
}

// serveEtcd starts ts's etcd API on a free loopback port and returns an
// etcd client of it, closed at cleanup.
func serveEtcd(t *testing.T, ts *testServer) *clientv3.Client {
	t.Helper()
	ln := testnet.Listen(t)
	ts.cfg.Etcd = EtcdConfig{Listener: ln, Advertise: ln.Addr().String()}
	if err := ts.startEtcd(); err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ln.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func keysOf(resp *clientv3.GetResponse) []string {
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// The cases of issue 28, each of which etcd passes: bytes that are not
// UTF-8 come back as they were given, through the log, a snapshot and a
// restart, in reads, compares, prefix deletes and watch events.
func TestEtcdKeysAndValuesKeepEveryByte(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts, c := etcdNode(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := c.Watch(ctx, "/", clientv3.WithPrefix(), clientv3.WithPrevKV())

	// etcdctl put /b $'\xff\xfe' reads back ff fe, not ef bf bd ef bf bd.
	mustPut(t, c, "/b", "\xff\xfe")
	if got := mustGet(t, c, "/b"); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "\xff\xfe" {
		t.Fatalf("value of /b: got = %q, expected: %q", got.Kvs, "\xff\xfe")
	}
	// Two keys that differ in a byte that is not UTF-8 stay two.
	mustPut(t, c, "/c/\xff", "one")
	mustPut(t, c, "/c/\xfe", "two")
	if got := keysOf(mustGet(t, c, "/c/", clientv3.WithPrefix())); strings.Join(got, ",") != "/c/\xfe,/c/\xff" {
		t.Fatalf("keys under /c/: got = %q, expected: [/c/\\xfe /c/\\xff]", got)
	}
	// A compare-and-swap that must fail fails: \xff is not \xfe.
	mustPut(t, c, "/cas", "\xff")
	resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Value("/cas"), "=", "\xfe")).Then(clientv3.OpPut("/cas", "swapped")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("Txn comparing \\xff with \\xfe: got = succeeded %v (%v), expected: failed", resp != nil && resp.Succeeded, err)
	}
	// A prefix whose range end is not UTF-8 (п is d0 bf, its end d0 c0)
	// deletes what it names and nothing else.
	for _, k := range []string{"/u/п", "/u/пример", "/u/рыба", "/u/日本", "/u/zebra"} {
		mustPut(t, c, k, "v")
	}
	del, err := c.Delete(ctx, "/u/п", clientv3.WithPrefix())
	if err != nil || del.Deleted != 2 {
		t.Fatalf("del --prefix /u/п: got = %v deleted (%v), expected: 2", del, err)
	}
	if got := keysOf(mustGet(t, c, "/u/", clientv3.WithPrefix())); strings.Join(got, ",") != "/u/zebra,/u/рыба,/u/日本" {
		t.Fatalf("keys left under /u/: got = %q", got)
	}

	// Watch events carry the bytes, prev_kv too.
	mustPut(t, c, "/c/\xff", "\x00\x80")
	want := []string{"/b=\xff\xfe", "/c/\xff=one", "/c/\xfe=two", "/cas=\xff"}
	var got []string
	for len(got) < 12 {
		select {
		case wr := <-w:
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.PUT {
					got = append(got, string(ev.Kv.Key)+"="+string(ev.Kv.Value))
				} else {
					got = append(got, "-"+string(ev.Kv.Key))
				}
				if string(ev.Kv.Key) == "/c/\xff" && string(ev.Kv.Value) == "\x00\x80" && (ev.PrevKv == nil || string(ev.PrevKv.Value) != "one") {
					t.Fatalf("prev_kv of the second put of /c/\\xff: got = %v, expected: one", ev.PrevKv)
				}
			}
		case <-ctx.Done():
			t.Fatalf("watch events: got = %q, expected: 12", got)
		}
	}
	for i, e := range want {
		if got[i] != e {
			t.Fatalf("watch event %d: got = %q, expected: %q", i, got[i], e)
		}
	}

	// The native API shows what it cannot carry as a string escaped, and
	// gives it exactly in the bytes fields; JSON too.
	r, err := ts.KV.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: "/c/"}))
	if err != nil {
		t.Fatalf("native Range of keys that are not UTF-8: %v", err)
	}
	kvs := r.Msg.GetKvs()
	if len(kvs) != 2 || kvs[0].GetKey() != `/c/\xfe` || string(kvs[0].GetKeyBytes()) != "/c/\xfe" ||
		kvs[1].GetValue() != "\x00\\x80" || string(kvs[1].GetValueBytes()) != "\x00\x80" || kvs[0].GetValueBytes() != nil {
		t.Fatalf("native Range: got = %v", kvs)
	}
	code, out := postJSON(t, ts.URL, "tenure.v1.KVService/Range", `{"prefix":"/c/"}`)
	first, _ := out["kvs"].([]any)
	if code != http.StatusOK || len(first) != 2 || fmt.Sprint(first[0].(map[string]any)["key"]) != `/c/\xfe` ||
		fmt.Sprint(first[0].(map[string]any)["keyBytes"]) != "L2Mv/g==" {
		t.Fatalf("native Range as JSON: got = %d %v, expected: the key escaped and its bytes in base64", code, out)
	}

	// A restart (from a snapshot and the log after it) keeps them.
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	_, c = etcdNode(t, dir)
	if got := keysOf(mustGet(t, c, "/c/", clientv3.WithPrefix())); strings.Join(got, ",") != "/c/\xfe,/c/\xff" {
		t.Fatalf("keys under /c/ after a restart: got = %q", got)
	}
	if got := mustGet(t, c, "/b"); string(got.Kvs[0].Value) != "\xff\xfe" {
		t.Fatalf("value of /b after a restart: got = %q, expected: %q", got.Kvs[0].Value, "\xff\xfe")
	}
}

func mustPut(t *testing.T, c *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, value); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
}

func mustGet(t *testing.T, c *clientv3.Client, key string, opts ...clientv3.OpOption) *clientv3.GetResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, key, opts...)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return resp
}

// The native watch of keys that are not UTF-8, as newline-delimited JSON,
// shows them escaped with their bytes beside, instead of failing.
func TestNativeKeyWatchShowsKeysThatAreNotUTF8(t *testing.T) {
	ts, c := etcdNode(t, t.TempDir())
	mustPut(t, c, "w/\xff", "\xfe")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/v1/watch/keys?key=w/&prefix=true&start_revision=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadBytes('\n')
	if err != nil {
		t.Fatalf("first event: %v", err)
	}
	for _, part := range [][]byte{[]byte(`"key":"w/\\xff"`), []byte(`"keyBytes":"dy//"`), []byte(`"value":"\\xfe"`), []byte(`"valueBytes":"/g=="`)} {
		if !bytes.Contains(line, part) {
			t.Fatalf("event: got = %s, expected: it to hold %s", line, part)
		}
	}
}

// A principal allowed only the keys under app/п deletes exactly those
// with del --prefix app/п: the range end (app/ then d0 c0, not UTF-8) is
// authorized and applied as the same bytes. Before the binary log, the
// end was rewritten between the check and the apply, and the delete took
// app/рыба too. A range beyond its prefix is refused, changing nothing.
func TestEtcdAuthorizationDecidesOnTheBytesApplied(t *testing.T) {
	es := startEtcdAuthServer(t)
	admin := es.client(t, "admin", "admin-pw")
	policy := `
principals:
  - name: petr
    roles: [cyrillic]
    etcd_password_bcrypt: %q
  - name: admin
    roles: [admin]
    etcd_password_bcrypt: %q
roles:
  cyrillic:
    - keys: [app/п]
      verbs: [read, write]
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
`
	if err := os.WriteFile(es.policyFile, []byte(fmt.Sprintf(policy, bcryptOf(t, "petr-pw"), es.adminHash)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := es.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	petr := es.client(t, "petr", "petr-pw")
	for _, k := range []string{"app/п", "app/пример", "app/рыба", "app/日本", "app/zebra"} {
		mustPut(t, admin, k, "v")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		opts []clientv3.OpOption
		key  string
	}{
		{"a range past app/п's end", []clientv3.OpOption{clientv3.WithRange("app/\xd1")}, "app/п"},
		{"the prefix app/", []clientv3.OpOption{clientv3.WithPrefix()}, "app/"},
		{"every key from app/п on", []clientv3.OpOption{clientv3.WithFromKey()}, "app/п"},
	} {
		if _, err := petr.Delete(ctx, tc.key, tc.opts...); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Fatalf("petr deletes %s: got = %v, expected: %v", tc.name, err, rpctypes.ErrPermissionDenied)
		}
	}
	if n := len(mustGet(t, admin, "app/", clientv3.WithPrefix()).Kvs); n != 5 {
		t.Fatalf("keys after the refusals: got = %d, expected: 5", n)
	}
	del, err := petr.Delete(ctx, "app/п", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil || del.Deleted != 2 {
		t.Fatalf("petr: del --prefix app/п: got = %v (%v), expected: 2 deleted", del, err)
	}
	if got := keysOf(mustGet(t, admin, "app/", clientv3.WithPrefix())); strings.Join(got, ",") != "app/zebra,app/рыба,app/日本" {
		t.Fatalf("keys left: got = %q, expected: app/zebra, app/рыба, app/日本", got)
	}
	// Bytes past the prefix, UTF-8 or not, are its keys.
	mustPut(t, petr, "app/п\xff", "\xff")
	if got := mustGet(t, petr, "app/п\xff"); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "\xff" {
		t.Fatalf("petr's key app/п\\xff: got = %v", got.Kvs)
	}
}

// In a rolling upgrade from the build before the binary log, a member
// that reads only JSON holds the cluster at version 5: a key that is not
// UTF-8 is refused, saying why, and nothing is written. Once the member
// registers this build, the version rises and the same put keeps its
// bytes.
func TestEtcdBytesWaitForEveryMemberToReadTheBinaryLog(t *testing.T) {
	t.Parallel()
	dir, peer := t.TempDir(), testnet.Free(t)
	oldPeer, oldAPI := seedOldMember(t, dir, peer, statemachine.BinaryVersion-1)
	ts, c := etcdNode(t, dir, func(rc *raftnode.Config) { rc.PeerAddr = peer })
	waitFor(t, "the cluster version to reach the old member's", func() bool {
		return nodeStatus(t, ts).GetClusterVersion() == statemachine.BinaryVersion-1
	})
	mustPut(t, c, "/text/п", "日本") // UTF-8 goes as JSON, as the old member reads it
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Put(ctx, "/b", "\xff\xfe")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not UTF-8") || !strings.Contains(err.Error(), "upgrade every member") {
		t.Fatalf("a value that is not UTF-8 at cluster version %d: got = %v, expected: FailedPrecondition naming UTF-8 and the upgrade", statemachine.BinaryVersion-1, err)
	}
	if got := mustGet(t, c, "/b"); len(got.Kvs) != 0 {
		t.Fatalf("/b after the refusal: got = %v, expected: absent", got.Kvs)
	}

	clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	if _, err := clusterSvc.Join(ctx, connect.NewRequest(&tenurev1.JoinRequest{Id: "old", PeerAddress: oldPeer, ApiAddress: oldAPI, Version: statemachine.Version, Engine: raftnode.EngineEtcd})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cluster version to reach this build's", func() bool {
		return nodeStatus(t, ts).GetClusterVersion() == statemachine.Version
	})
	mustPut(t, c, "/b", "\xff\xfe")
	if got := mustGet(t, c, "/b"); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "\xff\xfe" {
		t.Fatalf("/b after the upgrade: got = %v, expected: ff fe", got.Kvs)
	}
	if got := mustGet(t, c, "/text/п"); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "日本" {
		t.Fatalf("/text/п, written as JSON: got = %v", got.Kvs)
	}
}

// etcd's Lock and Election services keep the bytes of names and values:
// the Python and Node clients' recipes store binary UUIDs as values.
func TestEtcdLockAndElectionKeepEveryByte(t *testing.T) {
	_, c := etcdNode(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	grant, err := c.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	locks := v3lockpb.NewLockClient(c.ActiveConnection())
	lock, err := locks.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("locks/\xff\x00"), Lease: int64(grant.ID)})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(lock.Key, []byte("locks/\xff\x00/")) {
		t.Fatalf("lock key: got = %q, expected: under locks/\\xff\\x00/", lock.Key)
	}
	if got := mustGet(t, c, string(lock.Key)); len(got.Kvs) != 1 {
		t.Fatalf("the lock's key %q: got = %v, expected: it", lock.Key, got.Kvs)
	}

	elections := v3electionpb.NewElectionClient(c.ActiveConnection())
	uuid := []byte{0x9f, 0x1b, 0x00, 0xff, 0xc3, 0x28, 0x80, 0x01}
	camp, err := elections.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte("el/\xfe"), Lease: int64(grant.ID), Value: uuid})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := elections.Leader(ctx, &v3electionpb.LeaderRequest{Name: []byte("el/\xfe")})
	if err != nil || !bytes.Equal(leader.Kv.Value, uuid) || !bytes.Equal(leader.Kv.Key, camp.Leader.Key) {
		t.Fatalf("leader: got = %v (%v), expected: value %q at %q", leader, err, uuid, camp.Leader.Key)
	}
	next := append(bytes.Clone(uuid), 0xfe)
	if _, err := elections.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: camp.Leader, Value: next}); err != nil {
		t.Fatal(err)
	}
	if leader, err := elections.Leader(ctx, &v3electionpb.LeaderRequest{Name: []byte("el/\xfe")}); err != nil || !bytes.Equal(leader.Kv.Value, next) {
		t.Fatalf("leader after Proclaim: got = %v (%v), expected: value %q", leader, err, next)
	}
}
