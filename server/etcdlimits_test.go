package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/etcdapi"
)

// randomBytes is n bytes from r, most of them not UTF-8.
func randomBytes(r *rand.ChaCha8, n int) string {
	b := make([]byte, n)
	_, _ = r.Read(b)
	return string(b)
}

// valueOfEntry is the value that makes a put of key an entry of size
// bytes, as etcd counts it (etcdapi.EntrySize).
func valueOfEntry(r *rand.ChaCha8, key string, size int) string {
	n := size
	for {
		got, _ := etcdapi.EntrySize(&pb.PutRequest{Key: []byte(key), Value: make([]byte, n)})
		if got == size {
			return randomBytes(r, n)
		}
		n -= got - size
	}
}

// The etcd API bounds a request as etcd does, and nothing else: a
// Kubernetes key of 2 KB and a ConfigMap of 300 KB store and come back
// byte for byte, in reads, watch events and after a restart from a
// snapshot; a request at etcd's 1.5 MiB is taken and one a byte larger
// refused with etcd's error, changing nothing; a Range answers several
// values of a megabyte at once; and the native API reads what the etcd
// API wrote.
func TestEtcdKeysAndValuesAsLargeAsARequest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts, c := etcdNode(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := rand.NewChaCha8([32]byte{28, 5})
	want := map[string]string{}
	put := func(key, value string) int64 {
		t.Helper()
		resp, err := c.Put(ctx, key, value)
		if err != nil {
			t.Fatalf("put of a %d-byte key and a %d-byte value: %v", len(key), len(value), err)
		}
		want[key] = value
		return resp.Header.Revision
	}
	check := func(when string) {
		t.Helper()
		for key, value := range want {
			got := mustGet(t, c, key)
			if len(got.Kvs) != 1 || string(got.Kvs[0].Key) != key || string(got.Kvs[0].Value) != value {
				t.Fatalf("%s: the %d-byte key with a %d-byte value did not read back byte for byte", when, len(key), len(value))
			}
		}
	}

	w := c.Watch(ctx, "/registry/", clientv3.WithPrefix())
	key, value := "/registry/configmaps/"+randomBytes(r, 2048), randomBytes(r, 300_000)
	put(key, value)
	check("a 2 KB key and a 300 KB value")
	select {
	case wr := <-w:
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != key || string(wr.Events[0].Kv.Value) != value {
			t.Fatalf("watch event: got %d events, expected: the put of the 2 KB key byte for byte", len(wr.Events))
		}
	case <-ctx.Done():
		t.Fatal("no watch event for the 2 KB key")
	}

	// etcd's limit, 1.5 MiB counted as etcd counts its raft entry: at
	// it a put is taken; a byte over, refused with etcd's code and text.
	limit := DefaultLimits().EtcdMaxRequestBytes
	put("/at", valueOfEntry(r, "/at", limit))
	rev := put("/rev", "x")
	_, err := c.Put(ctx, "/over", valueOfEntry(r, "/over", limit+1))
	var ee rpctypes.EtcdError
	if !errors.Is(err, rpctypes.ErrRequestTooLarge) || !errors.As(err, &ee) || ee.Code() != codes.InvalidArgument {
		t.Fatalf("a put a byte over the limit: got = %v, expected: %v (InvalidArgument)", err, rpctypes.ErrRequestTooLarge)
	}
	// A Txn's puts share one request.
	_, err = c.Txn(ctx).Then(clientv3.OpPut("/t1", randomBytes(r, 800<<10)), clientv3.OpPut("/t2", randomBytes(r, 800<<10))).Commit()
	if !errors.Is(err, rpctypes.ErrRequestTooLarge) {
		t.Fatalf("a txn of two 800 KiB puts: got = %v, expected: %v", err, rpctypes.ErrRequestTooLarge)
	}
	if got := mustGet(t, c, "/", clientv3.WithPrefix(), clientv3.WithCountOnly()); got.Header.Revision != rev {
		t.Fatalf("refused requests moved the revision from %d to %d", rev, got.Header.Revision)
	}
	for _, k := range []string{"/over", "/t1", "/t2"} {
		if got := mustGet(t, c, k); len(got.Kvs) != 0 {
			t.Fatalf("%s exists after its write was refused", k)
		}
	}

	// An answer of more than gRPC's default 4 MiB: five values of 1 MiB.
	for i := range 5 {
		put(fmt.Sprintf("/many/%d", i), randomBytes(r, 1<<20))
	}
	got := mustGet(t, c, "/many/", clientv3.WithPrefix())
	if len(got.Kvs) != 5 {
		t.Fatalf("a range of five 1 MiB values: got %d, expected: 5", len(got.Kvs))
	}
	for _, kv := range got.Kvs {
		if string(kv.Value) != want[string(kv.Key)] {
			t.Fatalf("a range of five 1 MiB values: %s did not read back byte for byte", kv.Key)
		}
	}

	// The native API reads, watches and deletes a key longer than its
	// own --max-name-bytes, with a value larger than its
	// --max-value-bytes. (UTF-8 here: how the native API carries bytes
	// that are not is etcdbytes_test.go's.)
	long, text := "/native/"+strings.Repeat("k", 2048), strings.Repeat("0123456789", 30_000)
	rev = put(long, text)
	g, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: long}))
	if err != nil || g.Msg.GetKv().GetValue() != text {
		t.Fatalf("native Get of a 2 KB key: got = %v, expected: its 300 KB value", err)
	}
	rg, err := ts.KV.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: long}))
	if err != nil || len(rg.Msg.GetKvs()) != 1 || rg.Msg.GetKvs()[0].GetValue() != text {
		t.Fatalf("native Range of a 2 KB prefix: got = %v, %v, expected: the key and its value", rg, err)
	}
	stream, err := ts.KV.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: long, StartRevision: rev}))
	if err != nil || !stream.Receive() || stream.Msg().GetKv().GetValue() != text {
		t.Fatalf("native Watch of a 2 KB key from its put: got = %v, %v, expected: the put", err, stream.Err())
	}
	stream.Close()

	// Enough entries past the snapshot threshold (16 on this node) that
	// a snapshot holds these values; a restart reads it and the log
	// after it.
	for i := range 20 {
		put(fmt.Sprintf("/fill/%d", i), randomBytes(r, 1000))
	}
	waitSnapshot(t, dir, 7<<20)
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	ts, c = etcdNode(t, dir)
	check("after a restart")

	if _, err := ts.KV.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: long})); err != nil {
		t.Fatalf("native Delete of a 2 KB key: %v", err)
	}
	if got := mustGet(t, c, long); len(got.Kvs) != 0 {
		t.Fatal("the 2 KB key is still there after the native API deleted it")
	}
}

// waitSnapshot waits for a snapshot of at least size bytes in the node's
// data dir.
func waitSnapshot(t *testing.T, dir string, size int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		snaps, _ := filepath.Glob(filepath.Join(dir, "raft", "snapshots", "*", "state.bin"))
		for _, s := range snaps {
			if fi, err := os.Stat(s); err == nil && fi.Size() >= size {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot of %d bytes or more in %s: %v", size, dir, snaps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
