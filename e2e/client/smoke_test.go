package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

func TestSmokeMutexAndKV(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx := context.Background()
	a := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("a"))
	b := newSession(t, c, client.WithTTL(2*time.Second), client.WithIdentity("b"))
	ma, mb := a.Mutex("job"), b.Mutex("job")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mb.TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("got = %v, expected: ErrLocked", err)
	}
	got := make(chan error, 1)
	go func() { got <- mb.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond)
	tok := tokenOf(ma)
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if tokenOf(mb) <= tok || !mb.Valid() {
		t.Fatalf("got = token %d valid %v, expected: above %d and valid", tokenOf(mb), mb.Valid(), tok)
	}
	time.Sleep(3 * time.Second) // past the TTL: heartbeats keep it
	if !mb.Valid() {
		t.Fatal("lock not valid after a TTL with heartbeats")
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	kv := c.KV()
	if _, err := kv.Put(ctx, "my-lock", "unlocked"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.CompareAndSwap(ctx, "my-lock", client.ValueIs("unlocked"), "alice"); err != nil {
		t.Fatal(err)
	}
	_, err := kv.CompareAndSwap(ctx, "my-lock", client.ValueIs("unlocked"), "bob")
	var cf *client.CompareFailedError
	if !errors.Is(err, client.ErrCompareFailed) || !errors.As(err, &cf) || cf.Current.Value != "alice" {
		t.Fatalf("got = %v, expected: compare failed, current alice", err)
	}
}
