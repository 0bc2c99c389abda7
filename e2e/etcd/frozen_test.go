//go:build linux

package etcd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/proccluster"
	"github.com/tenurehq/tenure/internal/testnet"
)

// A leader frozen (SIGSTOP) for TTL − 1.5 s must not cost clientv3
// holders their leases, through Tenure's etcd API as through etcd's: a
// three-node Tenure cluster and a three-member etcd cluster of real
// processes run the same scenario side by side. Each holds leases kept
// alive by clientv3's own KeepAlive, a key attached to each, from two
// kinds of client:
//
//   - on all endpoints: the client knows every member; its keep-alive
//     stream was opened on member i%3 (so a third sit on the leader, as
//     a round-robin balancer places them) before it learnt the others;
//   - on one follower only: the client knows a single follower, which
//     must get its keep-alives to whichever member leads.
//
// clientv3 closes a keep-alive channel when no answer comes within the
// TTL of the last one (its deadlineLoop), and the server deletes the key
// when the lease expires. A lease is kept when, a TTL after the leader
// resumed, its channel is open, answers still arrive, and its key is
// there.
//
// A stream that sits on the frozen leader gets nothing while it is
// frozen, in either system: whether its client's deadline outlasts the
// freeze depends only on when its last answer before the freeze came.
// Once resumed, that leader must not answer from its own lessor (its
// successor times the lease now, and would expire it under the client):
// Tenure's refuses after a stop and the stream moves to the new leader.
// Those leases (on the leader, with less than a second between the
// resumption and their client's deadline) are decided by timing alone,
// and are the tolerance: Tenure must keep every other lease, so it keeps
// at least as many as etcd kept minus those. Keep-alive rounds are
// started at offsets spread over clientv3's keep-alive period, so that
// every run covers every phase of the freeze rather than one by luck.
//
// TTL 10 s (the case the issue measured) takes about 30 s and runs by
// default; TTL 5 s, about 20 s more, runs with TENURE_E2E_FROZEN_TTL=all
// (or =5 alone), as the README's long runs do.
func TestFrozenLeaderKeepsEtcdLeases(t *testing.T) {
	only := os.Getenv("TENURE_E2E_FROZEN_TTL")
	for _, ttl := range []int64{5, 10} {
		switch {
		case only == "all", only == fmt.Sprint(ttl), only == "" && ttl == 10:
		default:
			continue
		}
		t.Run(fmt.Sprintf("TTL%ds", ttl), func(t *testing.T) { testFrozenLeader(t, ttl) })
	}
}

func testFrozenLeader(t *testing.T, ttl int64) {
	var ref, sut frozenOutcome
	t.Run("side by side", func(t *testing.T) {
		t.Run("etcd", func(t *testing.T) {
			t.Parallel()
			ref = runFrozenLeader(t, startEtcdCluster(t, 3), ttl)
		})
		t.Run("tenure", func(t *testing.T) {
			t.Parallel()
			sut = runFrozenLeader(t, startTenureCluster(t), ttl)
		})
	})
	if t.Failed() {
		return
	}
	t.Logf("TTL %ds, leader stopped %v: etcd kept %s; tenure kept %s", ttl, freezeFor(ttl), ref.summary(), sut.summary())
	for _, placement := range []string{placeAll, placeFollower} {
		refKept, _, _ := ref.count(placement)
		kept, total, byTiming := sut.count(placement)
		if kept < refKept-byTiming {
			t.Errorf("clients on %s: tenure kept %d of %d, expected: at least etcd's %d minus the %d its timing decided", placement, kept, total, refKept, byTiming)
		}
	}
	for _, l := range sut.leases {
		if !l.kept && !l.decidedByTiming() {
			t.Errorf("tenure lost %s", l)
		}
	}
}

// Placements of a client.
const (
	placeAll      = "all endpoints"
	placeFollower = "one follower"
)

// clientsPerPlacement is how many clients, each with a lease of its own,
// each placement has in one run.
const clientsPerPlacement = 6

// freezeFor is how long the leader stays stopped: 1.5 s less than the
// TTL, so a client whose last answer came just before the freeze could
// still be answered by the leader once it resumes, and one answered
// earlier only by a new leader.
func freezeFor(ttl int64) time.Duration {
	return time.Duration(ttl)*time.Second - 1500*time.Millisecond
}

// keepAlivePeriod is how often clientv3 keeps a lease alive: it sends
// once a third of the TTL has passed since the last answer, checking
// every 500 ms (lease.go's sendKeepAliveLoop, retryConnWait).
func keepAlivePeriod(ttl int64) time.Duration {
	const tick = 500 * time.Millisecond
	third := time.Duration(ttl) * time.Second / 3
	return (third + tick - 1) / tick * tick
}

// frozenCluster is what the scenario needs of a three-member cluster.
type frozenCluster struct {
	name      string
	endpoints []string                  // each member's etcd API
	leader    func(context.Context) int // the index of the member that leads
	pause     func(i int)               // SIGSTOP
	resume    func(i int)               // SIGCONT
}

// startTenureCluster is three `tenure serve` processes (proccluster).
func startTenureCluster(t *testing.T) frozenCluster {
	c := proccluster.Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitEtcdWrites(ctx, t, c)
	return frozenCluster{
		name:      "tenure",
		endpoints: c.EtcdEndpoints(0),
		leader:    func(ctx context.Context) int { return c.WaitLeader(ctx) },
		pause:     func(i int) { c.Nodes[i].Pause() },
		resume:    func(i int) { c.Nodes[i].Resume() },
	}
}

// startEtcdCluster is an etcd cluster of n members on free loopback
// ports, with etcd's default heartbeat and election timeout, once every
// member answers /health (which needs a leader).
func startEtcdCluster(t *testing.T, n int) frozenCluster {
	t.Helper()
	bin := requireEtcd(t)
	addrs := testnet.FreeN(t, 2*n)
	dir := t.TempDir()
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("m%d=http://%s", i, addrs[2*i+1]))
	}
	procs := make([]*proc, n)
	fc := frozenCluster{name: "etcd"}
	for i := range n {
		client, peer := "http://"+addrs[2*i], "http://"+addrs[2*i+1]
		args := []string{
			"--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("m%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "frozen-leader",
		}
		procs[i] = startProc(t, fmt.Sprintf("etcd m%d", i), bin, args, filepath.Join(dir, fmt.Sprintf("m%d.log", i)))
		fc.endpoints = append(fc.endpoints, addrs[2*i])
	}
	for i, p := range procs {
		p.waitFor(t, etcdReady(addrs[2*i]))
	}
	signal := func(i int, sig syscall.Signal) {
		if err := procs[i].cmd.Process.Signal(sig); err != nil {
			t.Errorf("signal %v to etcd m%d: %v", sig, i, err)
		}
	}
	fc.pause = func(i int) { signal(i, syscall.SIGSTOP) }
	fc.resume = func(i int) { signal(i, syscall.SIGCONT) }
	fc.leader = func(ctx context.Context) int { return etcdLeader(ctx, t, fc.endpoints) }
	return fc
}

// etcdLeader polls the members' Status until one says it leads, and
// returns its index.
func etcdLeader(ctx context.Context, t *testing.T, endpoints []string) int {
	t.Helper()
	cli := newEtcdClient(t, endpoints...)
	defer cli.Close()
	for {
		for i, ep := range endpoints {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := cli.Status(sctx, ep)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no etcd member leads: %v", ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// memberIndexes maps each member's etcd member ID to its index in
// endpoints.
func memberIndexes(ctx context.Context, t *testing.T, endpoints []string) map[uint64]int {
	t.Helper()
	cli := newEtcdClient(t, endpoints...)
	defer cli.Close()
	out := map[uint64]int{}
	for i, ep := range endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			t.Fatalf("status of %s: %v", ep, err)
		}
		out[st.Header.MemberId] = i
	}
	return out
}

func newEtcdClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3 on %v: %v", endpoints, err)
	}
	return cli
}

// heldLease is one client's lease, its key, and what its keep-alive
// channel delivered.
type heldLease struct {
	placement string
	member    int  // where its keep-alive stream was opened
	onLeader  bool // that member was the leader frozen
	id        clientv3.LeaseID
	key       string
	cli       *clientv3.Client

	mu      sync.Mutex // guards answers, from and closed
	answers []time.Time
	from    []uint64  // the member ID in each answer's header
	ttls    []int64   // the TTL each answer gave
	closed  time.Time // zero while the channel is open

	// Filled in once the scenario is over.
	margin time.Duration // last answer before the freeze + TTL − resumption
	kept   bool
	why    string // why it was not kept
	trail  string // when its answers came, and from which member
}

// decidedByTiming: its stream sat on the frozen leader, and its client's
// deadline came less than a second after the leader resumed. Whether an
// answer beats that deadline is a race in either system.
func (l *heldLease) decidedByTiming() bool { return l.onLeader && l.margin < time.Second }

func (l *heldLease) String() string {
	return fmt.Sprintf("lease %x (%s, stream opened on member %d, on the frozen leader %v, deadline %v after the resumption): %s; answers %s",
		int64(l.id), l.placement, l.member, l.onLeader, l.margin.Round(time.Millisecond), l.why, l.trail)
}

// drain records every answer on ch until it closes.
func (l *heldLease) drain(ch <-chan *clientv3.LeaseKeepAliveResponse) {
	for resp := range ch {
		l.mu.Lock()
		l.answers = append(l.answers, time.Now())
		l.from = append(l.from, resp.MemberId)
		l.ttls = append(l.ttls, resp.TTL)
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.closed = time.Now()
	l.mu.Unlock()
}

// lastBefore is the last answer before at (zero if none), and how many
// answers there were in all.
func (l *heldLease) lastBefore(at time.Time) (time.Time, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for _, a := range l.answers {
		if a.Before(at) {
			last = a
		}
	}
	return last, len(l.answers)
}

// answersSince describes the answers since from: the TTL each gave, when,
// relative to the freeze, and from which member.
func (l *heldLease) answersSince(from, frozen time.Time, members map[uint64]int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for i, a := range l.answers {
		if a.Before(from) {
			continue
		}
		who := fmt.Sprintf("member %x", l.from[i])
		if m, ok := members[l.from[i]]; ok {
			who = fmt.Sprintf("member %d", m)
		}
		out = append(out, fmt.Sprintf("TTL %d at %+.2fs from %s", l.ttls[i], a.Sub(frozen).Seconds(), who))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

type frozenOutcome struct{ leases []*heldLease }

// count is, for placement, how many leases were kept, of how many, and
// how many were decided by timing alone.
func (o frozenOutcome) count(placement string) (kept, total, byTiming int) {
	for _, l := range o.leases {
		if l.placement != placement {
			continue
		}
		total++
		if l.kept {
			kept++
		}
		if l.decidedByTiming() {
			byTiming++
		}
	}
	return kept, total, byTiming
}

func (o frozenOutcome) summary() string {
	var parts []string
	for _, p := range []string{placeAll, placeFollower} {
		kept, total, byTiming := o.count(p)
		parts = append(parts, fmt.Sprintf("%d of %d on %s (%d decided by timing)", kept, total, p, byTiming))
	}
	return strings.Join(parts, ", ")
}

// runFrozenLeader runs the scenario on fc with leases of ttl seconds.
func runFrozenLeader(t *testing.T, fc frozenCluster, ttl int64) frozenOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leader := fc.leader(ctx)
	members := memberIndexes(ctx, t, fc.endpoints)
	var followers []int
	for i := range fc.endpoints {
		if i != leader {
			followers = append(followers, i)
		}
	}

	// Clients of both placements alternate, so that each placement's
	// keep-alives are spread over the whole period.
	var leases []*heldLease
	for i := range clientsPerPlacement {
		leases = append(leases,
			&heldLease{placement: placeAll, member: i % len(fc.endpoints)},
			&heldLease{placement: placeFollower, member: followers[i%len(followers)]})
	}
	var drains sync.WaitGroup
	defer func() {
		for _, l := range leases {
			if l.cli != nil {
				l.cli.Close() // closes its keep-alive channel
			}
		}
		drains.Wait()
	}()
	for i, l := range leases {
		l.onLeader = l.member == leader
		l.cli = newEtcdClient(t, fc.endpoints[l.member])
		grant, err := l.cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatalf("%s: grant on member %d: %v", fc.name, l.member, err)
		}
		l.id, l.key = grant.ID, fmt.Sprintf("frozen/%d", i)
		if _, err := l.cli.Put(ctx, l.key, l.placement, clientv3.WithLease(l.id)); err != nil {
			t.Fatalf("%s: put %s on lease %x: %v", fc.name, l.key, int64(l.id), err)
		}
	}
	period := keepAlivePeriod(ttl)
	start := time.Now()
	for i, l := range leases {
		if d := time.Until(start.Add(time.Duration(i) * period / time.Duration(len(leases)))); d > 0 {
			time.Sleep(d)
		}
		ch, err := l.cli.KeepAlive(ctx, l.id)
		if err != nil {
			t.Fatalf("%s: keep lease %x alive: %v", fc.name, int64(l.id), err)
		}
		drains.Add(1)
		go func() {
			defer drains.Done()
			l.drain(ch)
		}()
		if l.placement == placeAll {
			// It learns the others once its stream is open on its
			// member (clientv3 opens it after KeepAlive returns), to
			// fail over to.
			waitFor(ctx, t, fc.name+"'s first keep-alive answer", func() bool {
				_, n := l.lastBefore(time.Now())
				return n > 0
			})
			l.cli.SetEndpoints(fc.endpoints...)
		}
	}
	// Every stream has answered a round since the last one started.
	waitFor(ctx, t, fc.name+"'s keep-alive answers", func() bool {
		for _, l := range leases {
			if _, n := l.lastBefore(time.Now()); n < 2 {
				return false
			}
		}
		return true
	})

	fc.pause(leader)
	frozen := time.Now()
	paused := true
	defer func() {
		if paused {
			fc.resume(leader)
		}
	}()
	select {
	case <-ctx.Done():
		t.Fatalf("%s: %v", fc.name, ctx.Err())
	case <-time.After(freezeFor(ttl)):
	}
	fc.resume(leader)
	paused = false
	resumed := time.Now()
	t.Logf("%s: member %d led and was stopped for %v", fc.name, leader, resumed.Sub(frozen).Round(time.Millisecond))

	// By a TTL and 2 s after the resumption, clientv3 has closed the
	// channel of every lease not answered since the freeze (its
	// deadlineLoop looks once a second), or answered only once since.
	check := resumed.Add(time.Duration(ttl)*time.Second + 2*time.Second)
	select {
	case <-ctx.Done():
		t.Fatalf("%s: %v", fc.name, ctx.Err())
	case <-time.After(time.Until(check)):
	}
	checker := newEtcdClient(t, fc.endpoints...)
	defer checker.Close()
	for _, l := range leases {
		l.trail = l.answersSince(frozen.Add(-keepAlivePeriod(ttl)), frozen, members)
		last, _ := l.lastBefore(frozen)
		l.margin = last.Add(time.Duration(ttl) * time.Second).Sub(resumed)
		latest, _ := l.lastBefore(time.Now())
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		switch {
		case !closed.IsZero():
			l.why = fmt.Sprintf("its keep-alive channel closed %v after the freeze", closed.Sub(frozen).Round(time.Millisecond))
		case time.Since(latest) > period+time.Second:
			l.why = fmt.Sprintf("its last keep-alive answer came %v after the freeze", latest.Sub(frozen).Round(time.Millisecond))
		default:
			gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := checker.Get(gctx, l.key)
			gcancel()
			switch {
			case err != nil:
				l.why = fmt.Sprintf("get %s: %v", l.key, err)
			case len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != l.id:
				l.why = fmt.Sprintf("its key %s is gone: %v", l.key, resp.Kvs)
			default:
				l.kept, l.why = true, "kept"
			}
		}
		t.Logf("%s: %s", fc.name, l)
	}
	return frozenOutcome{leases: leases}
}
