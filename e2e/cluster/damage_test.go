package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/proccluster"
)

// A follower whose newest log batch is damaged on disk — a synced,
// acknowledged write — starts again without --repair-log: it cuts the
// damage off, neither votes nor campaigns while it owes the entries,
// gets them back from the others, and serves them.
func TestADamagedFollowerRepairsItselfFromItsPeers(t *testing.T) {
	skipShort(t)
	// No snapshot may cover the damaged entries: the log's own repair is
	// what is tested.
	c := proccluster.Start(t, 3, "--snapshot-threshold", "100000")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leader := c.WaitLeader(ctx)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.EtcdEndpoints(leader), DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	value := func(i int) string { return strings.Repeat(fmt.Sprintf("value-%02d|", i), 500) }
	const n = 20
	for i := range n {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%02d", i), value(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	c.WaitCaughtUp(ctx)

	f := c.Nodes[(leader+1)%len(c.Nodes)]
	f.Kill()
	segs, err := filepath.Glob(filepath.Join(f.DataDir(), "raft", "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no log segments in %s: %v", f.DataDir(), err)
	}
	sort.Strings(segs)
	tail := segs[len(segs)-1]
	data, err := os.ReadFile(tail)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.LastIndex(data, []byte(value(n-1)))
	if at < 0 {
		t.Fatalf("the last value is not in %s", tail)
	}
	at += 2000
	fh, err := os.OpenFile(tail, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte{data[at] ^ 0x20}, int64(at)); err != nil {
		t.Fatal(err)
	}
	fh.Close()

	f.Restart(ctx)
	c.WaitCaughtUp(ctx)
	// The member says it holds everything again at the first heartbeat
	// after it caught up, which may come after WaitCaughtUp saw it.
	for _, want := range []string{"cutting the damage off, to catch up on it from the other members", "lost_from=", "holds again every entry it had lost"} {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			log := proccluster.Tail(f.LogPath(), 400)
			if strings.Contains(log, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("got = no %q in the damaged node's log:\n%s", want, log)
			}
		}
	}
	// Its own copy, read locally (serializable): the lost write is back.
	local, err := clientv3.New(clientv3.Config{Endpoints: []string{f.Etcd}, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	for i := range n {
		resp, err := local.Get(ctx, fmt.Sprintf("k%02d", i), clientv3.WithSerializable())
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != value(i) {
			t.Fatalf("k%02d on the repaired node: got = %v, expected: the acknowledged value", i, err)
		}
	}
}
