package server

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/statemachine"
)

// TestValidateKeyAnswersForTheIncarnationOfTheKey holds an etcd-style
// lock key (made through the native API: the create revision is on the
// same KV clock as etcd's) and checks it through ValidateKey while the key
// lives, after it is deleted, and after a newer holder made it again.
func TestValidateKeyAnswersForTheIncarnationOfTheKey(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const key = "locks/db/694d7b3c2a1f0e05"
	create := func() int64 {
		t.Helper()
		if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: "holder"})); err != nil {
			t.Fatal(err)
		}
		got, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: key}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.GetKv().GetCreateRevision()
	}
	validate := func(rev int64) *tenurev1.ValidateKeyResponse {
		t.Helper()
		resp, err := ts.KV.ValidateKey(ctx, connect.NewRequest(&tenurev1.ValidateKeyRequest{Key: key, Revision: rev}))
		if err != nil {
			t.Fatalf("ValidateKey(%d): %v", rev, err)
		}
		return resp.Msg
	}

	first := create()
	// A write that is not the key's moves the clock past its creation.
	if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "other", Value: "x"})); err != nil {
		t.Fatal(err)
	}
	var kvRev int64
	readState(t, ts.Server, func(m *statemachine.Machine) { kvRev = m.KVRevision() })
	if kvRev == 0 || first >= kvRev {
		t.Fatalf("create revision %d and KV revision %d: expected the key made on the KV clock (cluster version 5), before the last write", first, kvRev)
	}

	for _, tc := range []struct {
		name  string
		rev   int64
		valid bool
	}{
		{"the create revision is the holder's", first, true},
		{"a later revision at which the key was held (etcdctl lock's ETCD_LOCK_REV after a wait) is the holder's", kvRev, true},
		{"a revision before the key was made is no holder's", first - 1, false},
		{"a revision the keys have not reached is no holder's", kvRev + 1, false},
	} {
		got := validate(tc.rev)
		if got.GetValid() != tc.valid || got.GetCreateRevision() != first || got.GetKvRevision() != kvRev {
			t.Errorf("%s: got = %v, expected: valid %v, create_revision %d, kv_revision %d", tc.name, got, tc.valid, first, kvRev)
		}
	}

	if _, err := ts.KV.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: key})); err != nil {
		t.Fatal(err)
	}
	if got := validate(first); got.GetValid() || got.GetCreateRevision() != 0 || got.GetKvRevision() != kvRev+1 {
		t.Errorf("after the delete: got = %v, expected: not valid, create_revision 0 (absent), kv_revision %d", got, kvRev+1)
	}

	second := create()
	if second <= first {
		t.Fatalf("the key made again has create revision %d, expected: above %d", second, first)
	}
	if got := validate(first); got.GetValid() || got.GetCreateRevision() != second {
		t.Errorf("the first holder after a newer one made the key: got = %v, expected: not valid, create_revision %d", got, second)
	}
	if got := validate(kvRev); got.GetValid() {
		t.Errorf("a revision the first incarnation was held at, after the key was made again: got = %v, expected: not valid", got)
	}
	if got := validate(second); !got.GetValid() || got.GetCreateRevision() != second {
		t.Errorf("the newer holder: got = %v, expected: valid, create_revision %d", got, second)
	}
}

func TestValidateKeyRefusesBadInput(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		req  *tenurev1.ValidateKeyRequest
	}{
		{"no key", &tenurev1.ValidateKeyRequest{Revision: 2}},
		{"no revision", &tenurev1.ValidateKeyRequest{Key: "locks/db"}},
		{"a negative revision", &tenurev1.ValidateKeyRequest{Key: "locks/db", Revision: -3}},
	} {
		_, err := ts.KV.ValidateKey(ctx, connect.NewRequest(tc.req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: got = %v, expected: invalid_argument", tc.name, err)
		}
	}
}
