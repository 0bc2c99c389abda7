//go:build linux

package etcd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tenurehq/tenure/internal/testnet"
)

// These tests run etcd's own Go client and its concurrency recipes
// (Mutex, Election, Session, STM) against one Tenure node, as programs
// written for etcd use them: nothing in them knows the server is not etcd
// (TestConcurrency runs them against a real etcd too).

// tenureServer is one Tenure node with fixed ports and data dir, so that
// it can be killed and started again as the same node.
type tenureServer struct {
	t               *testing.T
	api, peer, etcd string
	dir             string
	starts          int
	p               *proc
}

// newTenureServer starts a Tenure node serving the etcd API on free
// loopback ports, killed at cleanup.
func newTenureServer(t *testing.T) *tenureServer {
	t.Helper()
	addrs := testnet.FreeN(t, 3)
	s := &tenureServer{t: t, api: addrs[0], peer: addrs[1], etcd: addrs[2], dir: t.TempDir()}
	s.start()
	return s
}

// start runs the node (again) and returns once its API is ready and its
// etcd listener accepts connections.
func (s *tenureServer) start() {
	t := s.t
	t.Helper()
	s.starts++
	// No automatic compaction, as startTenure: a watch must be able to
	// resume from any revision.
	args := []string{"serve",
		"--listen", s.api, "--peer-listen", s.peer, "--etcd-listen", s.etcd,
		"--data-dir", filepath.Join(s.dir, "data"), "--auto-compaction-retention", "0",
	}
	s.p = startProc(t, "tenure", tenureBinary(t), args, filepath.Join(s.dir, fmt.Sprintf("tenure-%d.log", s.starts)))
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	s.p.waitFor(t, func() bool {
		resp, err := hc.Get("http://" + s.api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		c, err := net.DialTimeout("tcp", s.etcd, 500*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// kill ends the node with SIGKILL and waits for it to be gone.
func (s *tenureServer) kill() {
	_ = s.p.cmd.Process.Kill()
	<-s.p.exited
}

func (s *tenureServer) target() target { return target{name: "tenure", addr: s.etcd} }

// newSession opens a concurrency session of ttl seconds on c.
func newSession(t *testing.T, c *clientv3.Client, ttl int) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatalf("concurrency.NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// keysUnder lists the keys under prefix, oldest creation first.
func keysUnder(t *testing.T, c *clientv3.Client, prefix string) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := c.Get(ctxT(t), prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get %s*: %v", prefix, err)
	}
	return resp.Kvs
}

// TestConcurrency runs the recipes against Tenure and, as a reference
// that keeps the tests honest about etcd's behaviour, against a real etcd
// when TENURE_ETCD_REFERENCE is set (the long run; the README's test
// command leaves it out for time).
func TestConcurrency(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	servers := []string{"tenure"}
	if os.Getenv("TENURE_ETCD_REFERENCE") != "" {
		servers = append(servers, "etcd")
	}
	for _, server := range servers {
		t.Run(server, func(t *testing.T) {
			var tg target
			if server == "tenure" {
				tg = newTenureServer(t).target()
			} else {
				tg = target{name: "etcd", addr: startEtcd(t)}
			}
			t.Run("MutexExclusion", func(t *testing.T) { testMutexExclusion(t, tg) })
			t.Run("TryLock", func(t *testing.T) { testTryLock(t, tg) })
			t.Run("LockCancelled", func(t *testing.T) { testLockCancelled(t, tg) })
			t.Run("Election", func(t *testing.T) { testElection(t, tg) })
			t.Run("SessionExpiry", func(t *testing.T) { testSessionExpiry(t, tg) })
			t.Run("EndedSession", func(t *testing.T) { testEndedSession(t, tg) })
			for _, iso := range []struct {
				name  string
				level concurrency.Isolation
			}{
				{"SerializableSnapshot", concurrency.SerializableSnapshot},
				{"Serializable", concurrency.Serializable},
				{"RepeatableReads", concurrency.RepeatableReads},
				{"ReadCommitted", concurrency.ReadCommitted},
			} {
				t.Run("STM/"+iso.name, func(t *testing.T) { testSTM(t, tg, iso.name, iso.level) })
			}
			t.Run("TxnCAS", func(t *testing.T) { testTxnCAS(t, tg) })
		})
	}
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A watch survives the Tenure process being killed and started again on
// the same data dir: etcd's client resumes it from the revision after the
// last event it delivered, and every event written before and after the
// restart arrives exactly once, in order. A watch opened after the
// restart from a revision before it replays the same history.
func TestConcurrencyWatchResumesAfterRestart(t *testing.T) {
	t.Parallel() // with its own servers; the failover test, not parallel, runs alone before
	const prefix = "resume/"
	s := newTenureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := newClient(t, s.target())

	put := func(i int) int64 {
		t.Helper()
		var lastErr error
		for ctx.Err() == nil {
			// Until the client has found the restarted node a put may fail
			// before it reaches it; none is sent twice once one succeeds.
			pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
			r, err := c.Put(pctx, fmt.Sprintf("%s%02d", prefix, i), strconv.Itoa(i))
			pcancel()
			if err == nil {
				return r.Header.Revision
			}
			lastErr = err
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("put %d: %v", i, lastErr)
		return 0
	}
	var revs []int64
	for i := range 5 {
		revs = append(revs, put(i))
	}
	wch := c.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(revs[0]))
	var got []*clientv3.Event
	receive := func(n int) {
		t.Helper()
		for len(got) < n {
			select {
			case wr, ok := <-wch:
				if !ok {
					t.Fatalf("the watch ended after %d events", len(got))
				}
				if err := wr.Err(); err != nil {
					t.Fatalf("watch: %v", err)
				}
				got = append(got, wr.Events...)
			case <-ctx.Done():
				t.Fatalf("%d events, waiting for %d: %v", len(got), n, ctx.Err())
			}
		}
	}
	receive(5)
	for i := 5; i < 10; i++ {
		revs = append(revs, put(i))
	}
	receive(7)
	s.kill()
	s.start()
	for i := 10; i < 15; i++ {
		revs = append(revs, put(i))
	}
	receive(15)
	// Anything delivered twice would come now.
	select {
	case wr := <-wch:
		got = append(got, wr.Events...)
	case <-time.After(500 * time.Millisecond):
	}
	check := func(what string, evs []*clientv3.Event, from int) {
		t.Helper()
		if len(evs) != len(revs)-from {
			t.Errorf("%s: %d events, expected: %d", what, len(evs), len(revs)-from)
		}
		for j, ev := range evs {
			i := from + j
			if i >= len(revs) {
				break
			}
			want := fmt.Sprintf("%s%02d", prefix, i)
			if ev.Type != clientv3.EventTypePut || string(ev.Kv.Key) != want || ev.Kv.ModRevision != revs[i] {
				t.Errorf("%s: event %d: got = %s %s at %d, expected: PUT %s at %d", what, j, ev.Type, ev.Kv.Key, ev.Kv.ModRevision, want, revs[i])
			}
		}
	}
	check("the watch across the restart", got, 0)
	if revs[10] <= revs[9] {
		t.Errorf("the first write after the restart is at revision %d, not after the last before it (%d)", revs[10], revs[9])
	}

	// A new watch from a revision written before the restart.
	fresh := newClient(t, s.target())
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch = fresh.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(revs[7]))
	got = nil
	receive(len(revs) - 7)
	check("a watch from before the restart", got, 7)
}
