package client_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// Keys and values written through the etcd API may be any bytes; the Go
// client reads them exactly (KeyValue holds the bytes, from the native
// API's bytes fields), in Range, Get's neighbours and Watch, and refuses
// to send a key it cannot carry, naming the way that can.
func TestKVReadsKeysAndValuesThatAreNotUTF8(t *testing.T) {
	ln, etcdLn := testnet.Listen(t), testnet.Listen(t)
	srv, err := server.Open(server.Config{
		Listener: ln, Limits: testserver.Limits(), Logger: slog.New(slog.DiscardHandler),
		Etcd: server.EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String()},
		Raft: raftnode.Config{DataDir: t.TempDir(), PeerAddr: "127.0.0.1:0", Bootstrap: true, ElectionTimeout: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdLn.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	kv := newClient(t, srv.Addr()).KV()
	ctx := testCtx(t)
	watch := kv.Watch(ctx, "bin/", client.WithPrefix())
	var put error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, put = etcd.Put(ctx, "bin/\xff", "\x00\xfe\\"); put == nil {
			break
		}
	}
	if put != nil {
		t.Fatal(put)
	}
	kvs, _, _, err := kv.Range(ctx, "bin/", 0)
	if err != nil || len(kvs) != 1 || kvs[0].Key != "bin/\xff" || kvs[0].Value != "\x00\xfe\\" {
		t.Fatalf("Range: got = %+v (%v), expected: bin/\\xff = \\x00\\xfe\\\\", kvs, err)
	}
	select {
	case ev := <-watch:
		if ev.Err != nil || ev.KV.Key != "bin/\xff" || ev.KV.Value != "\x00\xfe\\" {
			t.Fatalf("watch event: got = %+v, expected: bin/\\xff = \\x00\\xfe\\\\", ev)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	// A UTF-8 key is untouched by any of it.
	if _, err := kv.Put(ctx, `bin/\xff`, "text"); err != nil {
		t.Fatal(err)
	}
	if got, err := kv.Get(ctx, `bin/\xff`); err != nil || got.Key != `bin/\xff` || got.Value != "text" {
		t.Fatalf(`Get of the UTF-8 key bin/\xff: got = %+v (%v)`, got, err)
	}

	for name, call := range map[string]func() error{
		"Put key":   func() error { _, err := kv.Put(ctx, "bin/\xfe", "v"); return err },
		"Put value": func() error { _, err := kv.Put(ctx, "bin/v", "\xfe"); return err },
		"Get":       func() error { _, err := kv.Get(ctx, "bin/\xfe"); return err },
		"Delete":    func() error { _, err := kv.Delete(ctx, "bin/\xff"); return err },
		"CAS":       func() error { _, err := kv.CompareAndSwap(ctx, "bin/v", client.ValueIs("\xfe"), "v"); return err },
		"Watch":     func() error { return (<-kv.Watch(ctx, "bin/\xfe")).Err },
	} {
		err := call()
		if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "not UTF-8") || !strings.Contains(err.Error(), "etcd API") {
			t.Errorf("%s of bytes that are not UTF-8: got = %v, expected: %v naming UTF-8 and the etcd API", name, err, client.ErrInvalidArgument)
		}
	}
	if resp, err := etcd.Get(ctx, "bin/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 2 {
		t.Fatalf("keys after the refusals: got = %v (%v), expected: 2", resp, err)
	}
}
