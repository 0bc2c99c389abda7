package etcdapi

import (
	"bytes"
	"context"
	"hash/crc32"
	"io"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/statemachine"
)

func TestSnapshotStreamsWhatEtcdctlSavesAndRestoreReads(t *testing.T) {
	f := newFakeBackend(t)
	put(t, f, "a")
	put(t, f, "b")
	c := serve(t, f)
	rc, err := c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	// etcdctl snapshot save's check (clientv3/snapshot hasChecksum).
	if len(data)%512 != 32 {
		t.Fatalf("stream length %d: got = %d mod 512, expected: 32 (a sha256 after whole pages)", len(data), len(data)%512)
	}
	state, err := OpenSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	m := statemachine.New()
	if err := m.Restore(bytes.NewReader(state)); err != nil {
		t.Fatal(err)
	}
	var keys []string
	_ = m.RangeKeys("", "\x00", 0, func(kv statemachine.KeyValue) bool { keys = append(keys, kv.Key); return true })
	if len(keys) != 2 || keys[0] != "a" || keys[1] != "b" {
		t.Errorf("restored keys: got = %v, expected: [a b]", keys)
	}
	data[100] ^= 1
	if _, err := OpenSnapshot(data); err == nil {
		t.Errorf("a damaged stream: got = no error, expected: its sha256 refused")
	}
	if got, err := OpenSnapshot(state); err != nil || !bytes.Equal(got, state) {
		t.Errorf("a plain Tenure snapshot: got = %d bytes, %v, expected: itself", len(got), err)
	}
	bolt := make([]byte, 4096)
	copy(bolt[16:], []byte{0xed, 0xda, 0x0c, 0xed})
	if _, err := OpenSnapshot(bolt); err != ErrNotTenureSnapshot {
		t.Errorf("an etcd database: got = %v, expected: %v", err, ErrNotTenureSnapshot)
	}
}

func TestHashKVIsEtcdsOverTheKeysHistory(t *testing.T) {
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := context.Background()
	mc := pb.NewMaintenanceClient(c.ActiveConnection())
	hashKV := func(rev int64) (*pb.HashKVResponse, error) {
		return mc.HashKV(ctx, &pb.HashKVRequest{Revision: rev})
	}
	empty, err := hashKV(0)
	if err != nil {
		t.Fatal(err)
	}
	// etcd's hash of a store with no keys: the key bucket's name alone.
	if want := crc32.Checksum([]byte("key"), crc32.MakeTable(crc32.Castagnoli)); empty.Hash != want || empty.CompactRevision != -1 {
		t.Errorf("empty store: got = %d, compact %d, expected: %d, compact -1", empty.Hash, empty.CompactRevision, want)
	}
	for _, k := range []string{"a", "b", "a"} {
		if _, err := c.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	at3, _ := hashKV(3)
	now, _ := hashKV(0)
	if at3.Hash == now.Hash || now.Header.Revision != 4 {
		t.Errorf("hashes at 3 and now (4): got = %d and %d at %d, expected: different, at 4", at3.Hash, now.Hash, now.Header.Revision)
	}
	if _, err := c.Put(ctx, "c", "v"); err != nil {
		t.Fatal(err)
	}
	if again, _ := hashKV(4); again.Hash != now.Hash {
		t.Errorf("hash at 4 after a later write: got = %d, expected: %d", again.Hash, now.Hash)
	}
	if _, err := c.Compact(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := hashKV(2); !errorIs(err, rpctypes.ErrCompacted) {
		t.Errorf("hash below the compact revision: got = %v, expected: %v", err, rpctypes.ErrCompacted)
	}
	if _, err := hashKV(99); !errorIs(err, rpctypes.ErrFutureRev) {
		t.Errorf("hash past the revision: got = %v, expected: %v", err, rpctypes.ErrFutureRev)
	}
	// As etcd's: of the versions up to the compact revision, only those
	// still current at 4 are hashed, so a@2 no longer is.
	if after, _ := hashKV(4); after.Hash == now.Hash || after.CompactRevision != 3 {
		t.Errorf("hash at 4 after compacting at 3: got = %d, compact %d, expected: not %d, compact 3", after.Hash, after.CompactRevision, now.Hash)
	}
	h1, err := mc.Hash(ctx, &pb.HashRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := mc.Hash(ctx, &pb.HashRequest{})
	if _, err := c.Put(ctx, "d", "v"); err != nil {
		t.Fatal(err)
	}
	h3, _ := mc.Hash(ctx, &pb.HashRequest{})
	if h1.Hash != h2.Hash || h3.Hash == h1.Hash {
		t.Errorf("Hash: got = %d, %d, then %d after a write, expected: equal, then different", h1.Hash, h2.Hash, h3.Hash)
	}
}

func errorIs(err, want error) bool { return err != nil && rpctypes.Error(err) == want }

func TestDefragmentSucceedsAndMoveLeaderIsRefusedForNoVoter(t *testing.T) {
	f := newFakeBackend(t)
	c := serve(t, f)
	ctx := context.Background()
	if _, err := c.Defragment(ctx, c.Endpoints()[0]); err != nil {
		t.Errorf("Defragment: got = %v, expected: success", err)
	}
	if _, err := c.MoveLeader(ctx, 2); err != nil {
		t.Errorf("MoveLeader to the leader itself: got = %v, expected: success", err)
	}
	if _, err := c.MoveLeader(ctx, 9); !errorIs(err, rpctypes.ErrBadLeaderTransferee) {
		t.Errorf("MoveLeader to no member: got = %v, expected: %v", err, rpctypes.ErrBadLeaderTransferee)
	}
	var _ clientv3.Maintenance = c
}
