package server

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
var wayAcross = []string{"tenure snapshot save", "tenure snapshot restore", "Moving to another consensus engine"}

func memberIDs(t *testing.T, clusterSvc tenurev1connect.ClusterServiceClient) []string {
	t.Helper()
	res, err := clusterSvc.Members(ctxT(t), connect.NewRequest(&tenurev1.MembersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range res.Msg.GetMembers() {
		ids = append(ids, m.GetId())
	}
	return ids
}

// A leader refuses a JoinRequest from a node of the other engine
// (hashicorp/raft, which Tenure ran before), before it changes anything,
// naming the way across. A request that names no engine comes from a
// build before the etcd raft engine, which runs hashicorp/raft: refused
// too.
func TestALeaderRefusesANodeOfTheOtherEngine(t *testing.T) {
	for _, joiner := range []string{raftnode.EngineHashicorp, ""} {
		t.Run("engine "+strconv.Quote(joiner), func(t *testing.T) {
			ts := startServer(t, t.TempDir(), testLimits())
			clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
			before := memberIDs(t, clusterSvc)
			_, err := clusterSvc.Join(ctxT(t), connect.NewRequest(&tenurev1.JoinRequest{
				Id: "other", PeerAddress: testnet.Free(t), ApiAddress: testnet.Free(t), Version: statemachine.Version, Engine: joiner,
			}))
			wantCode(t, err, connect.CodeFailedPrecondition, "peer protocols differ")
			for _, w := range wayAcross {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal: got = %q, expected: it names %q", err, w)
				}
			}
			if after := memberIDs(t, clusterSvc); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Fatalf("members after the refused join: got = %v, expected: %v", after, before)
			}
			// The same node on the leader's engine is let in.
			if _, err := clusterSvc.Join(ctxT(t), connect.NewRequest(&tenurev1.JoinRequest{
				Id: "same", PeerAddress: testnet.Free(t), ApiAddress: testnet.Free(t), Version: statemachine.Version, Engine: raftnode.EngineEtcd,
			})); err != nil {
				t.Fatalf("join of a node on the leader's engine: got = %v, expected: nil", err)
			}
			if st := nodeStatus(t, ts); st.GetEngine() != raftnode.EngineEtcd {
				t.Fatalf("status engine: got = %q, expected: %q", st.GetEngine(), raftnode.EngineEtcd)
			}
		})
	}
}

// A node forming a cluster (--bootstrap-expect) does not count a node of
// the other engine that introduces itself.
func TestAnIntroductionFromTheOtherEngineIsRefused(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	_, err := clusterSvc.Introduce(ctxT(t), connect.NewRequest(&tenurev1.IntroduceRequest{
		Node: &tenurev1.NodeInfo{Id: "old", PeerAddress: testnet.Free(t), ApiAddress: testnet.Free(t)}, Expect: 3,
	}))
	wantCode(t, err, connect.CodeFailedPrecondition, "node old runs the hashicorp raft engine and node node1 the etcd raft engine")
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

// openJoiner starts a node on ln that joins (or, with expect, forms a
// cluster with) the nodes at join, and returns it with its log.
func openJoiner(t *testing.T, ln net.Listener, expect int, join ...string) (*Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	srv, err := Open(Config{
		Listener:        ln,
		Join:            join,
		BootstrapExpect: expect,
		Limits:          testLimits(),
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
		Raft: raftnode.Config{
			NodeID: "joiner", DataDir: t.TempDir(), PeerAddr: "127.0.0.1:0",
			ElectionTimeout: 100 * time.Millisecond,
		},
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, logs
}

// olderBuild is the ClusterService of a node of a build before the etcd
// raft engine, as far as a joining node sees it: it names no engine, and
// would add anyone who asked (it counts who does).
type olderBuild struct {
	tenurev1connect.UnimplementedClusterServiceHandler
	asked atomic.Int32
}

func (o *olderBuild) Status(context.Context, *connect.Request[tenurev1.StatusRequest]) (*connect.Response[tenurev1.StatusResponse], error) {
	return connect.NewResponse(&tenurev1.StatusResponse{Id: "old", Role: "leader"}), nil
}

func (o *olderBuild) Join(context.Context, *connect.Request[tenurev1.JoinRequest]) (*connect.Response[tenurev1.JoinResponse], error) {
	o.asked.Add(1)
	return connect.NewResponse(&tenurev1.JoinResponse{}), nil
}

func (o *olderBuild) Introduce(context.Context, *connect.Request[tenurev1.IntroduceRequest]) (*connect.Response[tenurev1.IntroduceResponse], error) {
	o.asked.Add(1)
	return connect.NewResponse(&tenurev1.IntroduceResponse{Node: &tenurev1.NodeInfo{Id: "old", PeerAddress: "127.0.0.1:1", ApiAddress: "127.0.0.1:2"}}), nil
}

// serveOlderBuild serves an olderBuild on a free loopback port.
func serveOlderBuild(t *testing.T) (*olderBuild, string) {
	t.Helper()
	o := &olderBuild{}
	mux := http.NewServeMux()
	mux.Handle(tenurev1connect.NewClusterServiceHandler(o))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln := testnet.Listen(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o, ln.Addr().String()
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

// A node told to join a cluster of the other engine (an older build's)
// learns the engine first and does not ask: it logs why, naming the way
// across, and stays unready.
func TestANodeDoesNotJoinAClusterOfTheOtherEngine(t *testing.T) {
	old, addr := serveOlderBuild(t)
	joiner, logs := openJoiner(t, testnet.Listen(t), 0, addr)
	waitFor(t, "the joiner to refuse", func() bool { return strings.Contains(logs.String(), refusalLine) })
	refusalLogged(t, logs)
	notReady(t, joiner)
	if n := old.asked.Load(); n != 0 {
		t.Errorf("join requests the older build got: %d, expected: none", n)
	}
}

// A node told to form a cluster of two with a node of the other engine
// never introduces itself to it, and never forms one.
func TestNodesOfTwoEnginesDoNotFormACluster(t *testing.T) {
	old, addr := serveOlderBuild(t)
	node, logs := openJoiner(t, testnet.Listen(t), 2, addr)
	waitFor(t, "the node to refuse", func() bool { return strings.Contains(logs.String(), refusalLine) })
	refusalLogged(t, logs)
	notReady(t, node)
	if n := old.asked.Load(); n != 0 {
		t.Errorf("introductions the older build got: %d, expected: none", n)
	}
}
