package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/proccluster"
)

// TestAVoterBackOnAnEmptyDataDirIsRefused: a voter whose data dir is
// emptied and which is started again under its old ID, with --join, is
// still a voter in the others' configuration, and the leader knows how
// far its log went. It cannot go on as that member: its log is gone. It
// was accepted as a non-voter and then panicked in raft ("tocommit(60)
// is out of range [lastIndex(0)]"); now it exits, its log saying why and
// what to do (tenure members remove), and the cluster goes on without
// it. Removed, it joins again as a new member.
func TestAVoterBackOnAnEmptyDataDirIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-node cluster of processes")
	}
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nodes := newClusterNodes(t, bin, 3)
	for _, n := range nodes {
		n.start()
	}
	eps := endpointsOf(nodes)
	_, leader := settled(t, bin, eps, 3, 0, 30*time.Second)
	c := quietClient(t, ctx, eps)
	for i := range 20 {
		if _, err := c.KV().Put(ctx, fmt.Sprint("k", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	var lost *clusterNode
	for _, n := range nodes {
		if n.id != leader {
			lost = n
			break
		}
	}
	lost.kill()
	if err := os.RemoveAll(lost.dataDir); err != nil {
		t.Fatal(err)
	}
	lost.start()
	select {
	case <-lost.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s on an empty data dir: got = still running after 30s, expected: it exits, refused", lost.id)
	}
	code := lost.cmd.ProcessState.ExitCode()
	lost.cmd = nil
	log, err := os.ReadFile(lost.logPath)
	if err != nil {
		t.Fatal(err)
	}
	run := string(log[strings.LastIndex(string(log), "=== start"):])
	want := "tenure members remove " + lost.id
	if code == 0 || strings.Contains(run, "panic") || !strings.Contains(run, want) {
		t.Fatalf("%s on an empty data dir: got = exit code %d, log:\n%s\nexpected: a non-zero exit, no panic, and the log naming %q", lost.id, code, proccluster.Tail(lost.logPath, 30), want)
	}

	for _, line := range strings.Split(run, "\n") {
		if strings.Contains(line, want) {
			t.Logf("%s exited with code %d: %s", lost.id, code, line)
			break
		}
	}

	// The others go on; removed, the node joins again from scratch.
	if _, err := c.KV().Put(ctx, "after", "v"); err != nil {
		t.Fatalf("put after the refusal: %v", err)
	}
	if out, errOut, code := tenureRun(t, bin, "members", "remove", lost.id, "--endpoints", eps); code != 0 {
		t.Fatalf("tenure members remove %s: exit %d\n%s%s", lost.id, code, out, errOut)
	}
	if err := os.RemoveAll(lost.dataDir); err != nil {
		t.Fatal(err)
	}
	lost.start()
	settled(t, bin, eps, 3, 0, 30*time.Second)
}
