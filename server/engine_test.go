package server

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// The way across that every refusal of a node of the other engine names.
var wayAcross = []string{"tenure snapshot save", "tenure snapshot restore", "--raft-engine", "Moving to another consensus engine"}

func withEngine(engine string) func(*raftnode.Config) {
	return func(rc *raftnode.Config) { rc.Engine = engine }
}

func otherEngineOf(engine string) string {
	if engine == raftnode.EngineEtcd {
		return raftnode.EngineHashicorp
	}
	return raftnode.EngineEtcd
}

func memberIDs(t *testing.T, cluster tenurev1connect.ClusterServiceClient) []string {
	t.Helper()
	res, err := cluster.Members(ctxT(t), connect.NewRequest(&tenurev1.MembersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range res.Msg.GetMembers() {
		ids = append(ids, m.GetId())
	}
	return ids
}

// A leader refuses a JoinRequest from a node of the other engine, before
// it changes anything, naming the way across. A request that names no
// engine comes from a build before the etcd engine, which runs
// hashicorp/raft: an etcd-engine leader refuses it too.
func TestALeaderRefusesANodeOfTheOtherEngine(t *testing.T) {
	tests := []struct {
		name, leader, joiner string
	}{
		{"an etcd-engine node is refused by a hashicorp-engine leader", raftnode.EngineHashicorp, raftnode.EngineEtcd},
		{"a hashicorp-engine node is refused by an etcd-engine leader", raftnode.EngineEtcd, raftnode.EngineHashicorp},
		{"a node that names no engine (an older build) is refused by an etcd-engine leader", raftnode.EngineEtcd, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t, t.TempDir(), testLimits(), withEngine(tt.leader))
			cluster := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
			before := memberIDs(t, cluster)
			_, err := cluster.Join(ctxT(t), connect.NewRequest(&tenurev1.JoinRequest{
				Id: "other", PeerAddress: testnet.Free(t), ApiAddress: testnet.Free(t), Version: statemachine.Version, Engine: tt.joiner,
			}))
			wantCode(t, err, connect.CodeFailedPrecondition, "peer protocols differ")
			for _, w := range wayAcross {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal: got = %q, expected: it names %q", err, w)
				}
			}
			if after := memberIDs(t, cluster); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Fatalf("members after the refused join: got = %v, expected: %v", after, before)
			}
			// The same node on the leader's engine is let in.
			if _, err := cluster.Join(ctxT(t), connect.NewRequest(&tenurev1.JoinRequest{
				Id: "same", PeerAddress: testnet.Free(t), ApiAddress: testnet.Free(t), Version: statemachine.Version, Engine: tt.leader,
			})); err != nil {
				t.Fatalf("join of a node on the leader's engine: got = %v, expected: nil", err)
			}
			if st := clusterStatus(t, ts); st.GetEngine() != tt.leader {
				t.Fatalf("status engine: got = %q, expected: %q", st.GetEngine(), tt.leader)
			}
		})
	}
}

// A node forming a cluster (--bootstrap-expect) does not count a node of
// the other engine that introduces itself.
func TestAnIntroductionFromTheOtherEngineIsRefused(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits(), withEngine(raftnode.EngineEtcd))
	cluster := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	_, err := cluster.Introduce(ctxT(t), connect.NewRequest(&tenurev1.IntroduceRequest{
		Node: &tenurev1.NodeInfo{Id: "old", PeerAddress: testnet.Free(t), ApiAddress: testnet.Free(t)}, Expect: 3,
	}))
	wantCode(t, err, connect.CodeFailedPrecondition, "node old runs the hashicorp engine and node node1 the etcd engine")
}

// syncBuffer is a log destination a test reads while the server writes.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// openJoiner starts a node of engine on ln that joins (or, with expect,
// forms a cluster with) the nodes at join, and returns it with its log.
func openJoiner(t *testing.T, ln net.Listener, engine string, expect int, join ...string) (*Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	srv, err := Open(Config{
		Listener:        ln,
		Join:            join,
		BootstrapExpect: expect,
		Limits:          testLimits(),
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
		Raft: raftnode.Config{
			NodeID: "joiner-" + engine, DataDir: t.TempDir(), PeerAddr: "127.0.0.1:0", Engine: engine,
			HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 100 * time.Millisecond,
		},
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, logs
}

const refusalLine = `level=ERROR msg="not joining: a node it was told to join runs another consensus engine`

// refusalLogged checks that a node logged the error it logs when it will
// not join a node of the other engine, naming the way across.
func refusalLogged(t *testing.T, logs *syncBuffer) {
	t.Helper()
	if !strings.Contains(logs.String(), refusalLine) {
		t.Fatalf("joiner's log: got = %q, expected: a line %s", logs, refusalLine)
	}
	for _, w := range wayAcross {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("joiner's log: got = %q, expected: it names %q", logs, w)
		}
	}
}

func notReady(t *testing.T, srv *Server) {
	t.Helper()
	resp, err := http.Get("http://" + srv.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || srv.node.Formed() {
		t.Fatalf("joiner: got = /readyz %d, formed %v, expected: unready and in no cluster", resp.StatusCode, srv.node.Formed())
	}
}

// A node told to join a cluster of the other engine learns the engine
// first and does not ask: it logs why, naming the way across, and stays
// unready; the cluster's configuration is unchanged.
func TestANodeDoesNotJoinAClusterOfTheOtherEngine(t *testing.T) {
	for _, engine := range []string{raftnode.EngineHashicorp, raftnode.EngineEtcd} {
		t.Run("cluster on "+engine, func(t *testing.T) {
			ts := startServer(t, t.TempDir(), testLimits(), withEngine(engine))
			cluster := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
			before := memberIDs(t, cluster)
			joiner, logs := openJoiner(t, testnet.Listen(t), otherEngineOf(engine), 0, ts.Addr())
			var after []string
			waitFor(t, "the joiner to refuse, or to be let in", func() bool {
				after = memberIDs(t, cluster)
				return strings.Contains(logs.String(), refusalLine) || len(after) != len(before)
			})
			if strings.Join(after, ",") != strings.Join(before, ",") {
				t.Fatalf("members: got = %v, expected: %v", after, before)
			}
			refusalLogged(t, logs)
			notReady(t, joiner)
		})
	}
}

// Two nodes of different engines told to form a cluster of two never do.
func TestNodesOfTwoEnginesDoNotFormACluster(t *testing.T) {
	lnA, lnB := testnet.Listen(t), testnet.Listen(t)
	a, logsA := openJoiner(t, lnA, raftnode.EngineHashicorp, 2, lnB.Addr().String())
	b, logsB := openJoiner(t, lnB, raftnode.EngineEtcd, 2, lnA.Addr().String())
	waitFor(t, "both nodes to refuse, or a cluster to form", func() bool {
		return a.node.Formed() || b.node.Formed() || strings.Contains(logsA.String(), refusalLine) && strings.Contains(logsB.String(), refusalLine)
	})
	notReady(t, a)
	notReady(t, b)
	refusalLogged(t, logsA)
	refusalLogged(t, logsB)
}
