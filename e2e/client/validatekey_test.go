package client_test

import (
	"errors"
	"testing"

	"github.com/tenurehq/tenure/client"
)

// TestValidateKeyFollowsTheHolderOfAnEtcdStyleLock holds a lock the way
// etcd's recipes do — a key bound to the holder's lease (a session),
// made through the native API on the same KV clock — and checks it with
// ValidateKey while it is held, after the holder's session ends, and for
// the next holder who makes the same key again.
func TestValidateKeyFollowsTheHolderOfAnEtcdStyleLock(t *testing.T) {
	c := newClient(t, startServer(t))
	ctx := testCtx(t)
	kv := c.KV()
	const key = "locks/db/1a"
	hold := func(s *client.Session) int64 {
		t.Helper()
		if _, err := kv.Put(ctx, key, "", client.WithSession(s)); err != nil {
			t.Fatal(err)
		}
		got, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return got.CreateRevision
	}

	first := newSession(t, c)
	rev := hold(first)
	got, err := c.ValidateKey(ctx, key, rev)
	if err != nil || !got.Valid || got.CreateRevision != rev || got.KVRevision < rev {
		t.Fatalf("the holder: got = %+v, %v, expected: valid, created at %d, KV revision at least that", got, err, rev)
	}

	// The holder's lease ends: its key goes with it.
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, err = c.ValidateKey(ctx, key, rev)
	if err != nil || got.Valid || got.CreateRevision != 0 {
		t.Fatalf("after the holder's session closed: got = %+v, %v, expected: not valid, no key", got, err)
	}

	next := hold(newSession(t, c))
	if got, err = c.ValidateKey(ctx, key, rev); err != nil || got.Valid || got.CreateRevision != next || next <= rev {
		t.Fatalf("the first holder after the next made the key again: got = %+v, %v, expected: not valid, created at %d (above %d)", got, err, next, rev)
	}
	if got, err = c.ValidateKey(ctx, key, next); err != nil || !got.Valid {
		t.Fatalf("the next holder: got = %+v, %v, expected: valid", got, err)
	}
}

func TestValidateKeyRefusesBadInput(t *testing.T) {
	c := newClient(t, startServer(t))
	ctx := testCtx(t)
	for _, tc := range []struct {
		key string
		rev int64
	}{{"", 1}, {"locks/db", 0}, {"locks/db", -1}} {
		if _, err := c.ValidateKey(ctx, tc.key, tc.rev); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("ValidateKey(%q, %d): got = %v, expected: ErrInvalidArgument", tc.key, tc.rev, err)
		}
	}
}
