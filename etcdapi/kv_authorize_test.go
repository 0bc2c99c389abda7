package etcdapi

import (
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/statemachine"
)

func TestKVAuthorize(t *testing.T) {
	k := newKVTest(t)
	k.put("k", "v")
	k.spy.take()
	_, err := k.c.Txn(k.ctx).If(clientv3.Compare(clientv3.Version("c").WithPrefix(), ">", 0)).Then(
		clientv3.OpGet("g", clientv3.WithRange("h")),
		clientv3.OpPut("p", "v", clientv3.WithPrevKV()),
	).Else(
		clientv3.OpDelete("d", clientv3.WithFromKey(), clientv3.WithPrevKV()),
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value("nc"), "=", "x")}, []clientv3.Op{clientv3.OpPut("np", "v")}, nil),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	_, auths := k.spy.take()
	want := []string{`r "c" "d"`, `r "g" "h"`, `w "p" ""`, `r "p" ""`, `w "d" "\x00"`, `r "d" "\x00"`, `r "nc" ""`, `w "np" ""`}
	if fmt.Sprint(auths) != fmt.Sprint(want) {
		t.Errorf("txn authorized\n%v, want every range of both branches\n%v", auths, want)
	}
	if _, err := k.c.Compact(k.ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, auths := k.spy.take(); fmt.Sprint(auths) != fmt.Sprint([]string{`w "\x00" "\x00"`}) {
		t.Errorf("compact authorized %v, want write on every key", auths)
	}

	// With a policy, attaching a key to a lease needs write on the keys
	// it already has, as etcd's checkLeasePuts: who may not revoke the
	// lease may not attach to it.
	sess := k.f.apply(statemachine.OpenSession{Identity: "etcd", TTL: int64(time.Minute)})
	if sess.Err != nil {
		t.Fatal(sess.Err)
	}
	lease := clientv3.LeaseID(sess.Session.EtcdLeaseID())
	k.put("held/1", "v", clientv3.WithLease(lease))
	k.spy.mu.Lock()
	k.spy.policy = true
	k.spy.mu.Unlock()
	k.spy.take()
	k.put("held/2", "v", clientv3.WithLease(lease))
	if _, auths := k.spy.take(); fmt.Sprint(auths) != fmt.Sprint([]string{`w "held/2" ""`, `w "held/1" ""`}) {
		t.Errorf("put on a lease with a policy authorized %v, want the key and the lease's keys", auths)
	}

	before := k.rev()
	k.spy.deny(true)
	for name, call := range map[string]func() error{
		"range":  func() error { _, err := k.c.Get(k.ctx, "k"); return err },
		"put":    func() error { _, err := k.c.Put(k.ctx, "k", "w"); return err },
		"delete": func() error { _, err := k.c.Delete(k.ctx, "k"); return err },
		"txn": func() error {
			_, err := k.c.Txn(k.ctx).Then(clientv3.OpPut("k", "w")).Commit()
			return err
		},
		"compact": func() error { _, err := k.c.Compact(k.ctx, 2); return err },
	} {
		if err := call(); !sameErr(err, rpctypes.ErrGRPCPermissionDenied) {
			t.Errorf("%s when denied: %v, want %v", name, err, rpctypes.ErrGRPCPermissionDenied)
		}
	}
	k.spy.deny(false)
	if after := k.rev(); after != before {
		t.Errorf("denied requests moved the revision from %d to %d", before, after)
	}
}
