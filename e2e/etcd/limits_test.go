//go:build linux

package etcd

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdLimit is etcd's default --max-request-bytes, which Tenure's
// --etcd-max-request-bytes takes as its default.
const etcdLimit = 1572864

// entryOf is the value length that makes a put of key a raft entry of
// size bytes as etcd counts it (its InternalRaftRequest, with a header
// ID of the largest length; etcd's own IDs are a byte or two shorter
// on some members, so the cases below stay 64 bytes from the limit).
func entryOf(key string, size int) int {
	n := size
	for {
		r := pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: math.MaxUint64}, Put: &pb.PutRequest{Key: []byte(key), Value: make([]byte, n)}}
		got := r.Size()
		if got == size {
			return n
		}
		n -= got - size
	}
}

// Sizes on the etcd API against etcd's own: what etcd takes Tenure
// takes, byte for byte (a Kubernetes-long key, a 300 KB ConfigMap, a
// request just under 1.5 MiB, an answer of five 1 MiB values, a watch
// event of 1.4 MiB), and what etcd refuses Tenure refuses with the same
// code and text, changing nothing.
func TestRequestSizesAsEtcds(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	ref, sut, ok := pair(t)
	if !ok {
		t.Skip("no Tenure side")
	}
	// An answer is what was done and how it went: "ok", or the error's
	// code and text.
	run := func(tg target) []string {
		// clientv3 sends 2 MiB at most by default; raised, so that what
		// the server does with more is what is compared.
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{tg.addr}, DialTimeout: 5 * time.Second,
			MaxCallSendMsgSize: 8 << 20, Logger: zap.NewNop()})
		if err != nil {
			t.Fatalf("%s: clientv3: %v", tg.name, err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		r := rand.NewChaCha8([32]byte{28, 5}) // the same bytes for both
		random := func(n int) string {
			b := make([]byte, n)
			_, _ = r.Read(b)
			return string(b)
		}
		var out []string
		record := func(note string, err error) {
			a := note + ": ok"
			if err != nil {
				a = fmt.Sprintf("%s: %v: %s", note, codeOf(err), rpctypes.ErrorDesc(err))
			}
			out = append(out, a)
		}
		w := c.Watch(ctx, "/w/", clientv3.WithPrefix())

		key, value := "/registry/configmaps/"+random(2048), random(300_000)
		_, err = c.Put(ctx, key, value)
		record("a 2 KB key and a 300 KB value", err)
		g, err := c.Get(ctx, key)
		record(fmt.Sprintf("read back byte for byte: %v", err == nil && len(g.Kvs) == 1 && string(g.Kvs[0].Value) == value), err)

		under, over := random(entryOf("/k", etcdLimit-64)), random(entryOf("/k", etcdLimit+64))
		_, err = c.Put(ctx, "/k", under)
		record("a put 64 bytes under the limit", err)
		before, _ := c.Get(ctx, "/k")
		_, err = c.Put(ctx, "/k", over)
		record("a put 64 bytes over the limit", err)
		_, err = c.Txn(ctx).Then(clientv3.OpPut("/t1", random(800<<10)), clientv3.OpPut("/t2", random(800<<10))).Commit()
		record("a txn of two 800 KiB puts", err)
		_, err = c.Put(ctx, "/k", random(etcdLimit+600<<10))
		record("a put past the limit and gRPC's 512 KiB beyond it", err)
		after, err := c.Get(ctx, "/k")
		record(fmt.Sprintf("nothing changed: %v", err == nil && before != nil && after.Header.Revision == before.Header.Revision &&
			len(after.Kvs) == 1 && string(after.Kvs[0].Value) == under), err)

		for i := range 5 {
			_, err = c.Put(ctx, fmt.Sprintf("/m/%d", i), random(1<<20))
			record("a 1 MiB value", err)
		}
		g, err = c.Get(ctx, "/m/", clientv3.WithPrefix())
		record(fmt.Sprintf("a range of five 1 MiB values: %d", len(g.Kvs)), err)

		big := random(1400 << 10)
		_, err = c.Put(ctx, "/w/big", big)
		record("a 1.4 MiB value watched", err)
		select {
		case wr := <-w:
			record(fmt.Sprintf("its watch event byte for byte: %v", len(wr.Events) == 1 && string(wr.Events[0].Kv.Value) == big), wr.Err())
		case <-time.After(20 * time.Second):
			record("its watch event", fmt.Errorf("none in 20s"))
		}
		return out
	}
	want, got := run(ref), run(sut)
	if len(want) != len(got) {
		t.Fatalf("etcd gave %d answers, tenure %d", len(want), len(got))
	}
	for i := range want {
		if want[i] != got[i] {
			t.Errorf("got = %q, expected (etcd): %q", got[i], want[i])
		}
	}
	for _, a := range got {
		t.Logf("%s", a)
	}
}

// codeOf is the gRPC code of an error clientv3 returned.
func codeOf(err error) codes.Code {
	if ee, ok := err.(rpctypes.EtcdError); ok {
		return ee.Code()
	}
	return status.Code(err)
}
