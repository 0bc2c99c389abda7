package cluster_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitCtx bounds one wait of a test.
func waitCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// whileUnavailable repeats call while it fails as unavailable: a leader
// found a moment ago may lose an election a loaded machine provokes (the
// entry "lost while in flight"), and the node forwards the next try to
// whoever leads now.
func whileUnavailable[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	for {
		v, err := call(ctx)
		if connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func leader(t testing.TB, c *cluster.Cluster) *cluster.Node {
	t.Helper()
	n, err := c.Leader(waitCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// leaderOtherThan waits for a promoted leader that is not old: right
// after old is cut off it may still answer a probe it was verifying.
func leaderOtherThan(t testing.TB, c *cluster.Cluster, old *cluster.Node) *cluster.Node {
	t.Helper()
	ctx := waitCtx(t)
	var next *cluster.Node
	waitFor(t, ctx, "a leader other than "+old.ID(), func() bool {
		n, err := c.Leader(ctx)
		next = n
		return err == nil && n != old
	})
	return next
}

// leaderAndFollowers waits for a promoted leader and returns it and the
// other running nodes.
func leaderAndFollowers(t testing.TB, c *cluster.Cluster) (*cluster.Node, []*cluster.Node) {
	t.Helper()
	followers, err := c.Followers(waitCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return leader(t, c), followers
}

func openSession(t testing.TB, n *cluster.Node, ttl time.Duration) int64 {
	t.Helper()
	resp, err := whileUnavailable(waitCtx(t), func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
		return n.API().Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(ttl)}))
	})
	if err != nil {
		t.Fatalf("open session on %s: %v", n, err)
	}
	return resp.Msg.GetSession().GetId()
}

func acquire(t testing.TB, n *cluster.Node, session int64, name string) int64 {
	t.Helper()
	// Acquire is idempotent for a holder, so a retry cannot grant twice.
	resp, err := whileUnavailable(waitCtx(t), func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
		return n.API().Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: session, Name: name}))
	})
	if err != nil {
		t.Fatalf("acquire %s on %s: %v", name, n, err)
	}
	if !resp.Msg.GetAcquired() {
		t.Fatalf("acquire %s on %s: got = not acquired, expected: a grant", name, n)
	}
	return resp.Msg.GetToken()
}

func validate(t testing.TB, n *cluster.Node, name string, token int64) *tenurev1.ValidateResponse {
	t.Helper()
	resp, err := n.API().Leases.Validate(waitCtx(t), connect.NewRequest(&tenurev1.ValidateRequest{Name: name, Token: token}))
	if err != nil {
		t.Fatalf("validate %s on %s: %v", name, n, err)
	}
	return resp.Msg
}

func members(t testing.TB, n *cluster.Node) *tenurev1.MembersResponse {
	t.Helper()
	resp, err := n.API().Cluster.Members(waitCtx(t), connect.NewRequest(&tenurev1.MembersRequest{}))
	if err != nil {
		t.Fatalf("members on %s: %v", n, err)
	}
	return resp.Msg
}

// waitFor polls cond until it holds or ctx ends: elections and
// replication have no event a test can wait on.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// caughtUp waits until n's revision is the leader's, read from each
// node's own state.
func caughtUp(t testing.TB, lead, n *cluster.Node) {
	t.Helper()
	waitFor(t, waitCtx(t), n.ID()+" to catch up with "+lead.ID(), func() bool {
		return members(t, n).GetRevision() == members(t, lead).GetRevision()
	})
}

// isNotLeader reports whether err is a node's refusal of a call only the
// leader serves.
func isNotLeader(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable && api.Reason(ce.Meta().Get(api.ErrorHeader)) == api.ReasonNotLeader
}

// keeper heartbeats one session as a failing-over client would: every
// interval, to the first of its nodes that accepts, moving on when a node
// says it is not the leader. Its heartbeats are never forwarded, so they
// reach only the node called. It stops at the first sign that the
// session is gone.
type keeper struct {
	cancel  context.CancelFunc
	done    chan struct{}
	beats   atomic.Int64
	expired atomic.Bool
}

func keep(t testing.TB, session int64, every time.Duration, nodes ...*cluster.Node) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			for _, n := range nodes {
				if !n.Running() {
					continue
				}
				cctx, ccancel := context.WithTimeout(ctx, every)
				req := connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: session})
				req.Header().Set(server.ForwardedHeader, "keeper")
				_, err := n.API().Sessions.Refresh(cctx, req)
				ccancel()
				if err == nil {
					k.beats.Add(1)
					break
				}
				if connect.CodeOf(err) == connect.CodeNotFound {
					k.expired.Store(true)
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(k.stop)
	return k
}

// stop ends the heartbeats and waits for the goroutine.
func (k *keeper) stop() {
	k.cancel()
	<-k.done
}

// counter returns a counter's value from n's metrics, summed over label
// values matching labels.
func counter(t testing.TB, n *cluster.Node, name string, labels map[string]string) float64 {
	t.Helper()
	g, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
