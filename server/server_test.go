package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openSession(t *testing.T, ts *testServer, identity string, ttl time.Duration) *tenurev1.Session {
	t.Helper()
	resp, err := ts.Sessions.Open(ctxT(t), connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: identity, Ttl: durationpb.New(ttl)}))
	if err != nil {
		t.Fatalf("open session: %v", err)
	}
	return resp.Msg.Session
}

// keepAlive heartbeats a session until the test ends.
func keepAlive(t *testing.T, ts *testServer, id int64, every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = ts.Sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: id}))
			}
		}
	}()
}

func acquire(t *testing.T, ts *testServer, sid int64, name string, wait bool) *tenurev1.AcquireResponse {
	t.Helper()
	resp, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sid, Name: name, Wait: wait}))
	if err != nil {
		t.Fatalf("acquire %s by session %d: %v", name, sid, err)
	}
	return resp.Msg
}

func wantCode(t *testing.T, err error, code connect.Code, contains string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got = nil error, expected: %v containing %q", code, contains)
	}
	if connect.CodeOf(err) != code || !strings.Contains(err.Error(), contains) {
		t.Fatalf("got = %v (%v), expected: %v containing %q", err, connect.CodeOf(err), code, contains)
	}
}

// postJSON calls a unary method the way curl does.
func postJSON(t *testing.T, url, method, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/"+method, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s: response %q is not JSON: %v", method, data, err)
	}
	return resp.StatusCode, out
}

func TestJSONQuickstartFlow(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	code, out := postJSON(t, ts.URL, "tenure.v1.SessionService/Open", `{"identity":"alice","ttl":"10s"}`)
	if code != 200 {
		t.Fatalf("open: got = %d %v, expected: 200", code, out)
	}
	sid := out["session"].(map[string]any)["id"].(string)

	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Acquire", `{"sessionId":"`+sid+`","name":"nightly-report"}`)
	if code != 200 || out["acquired"] != true {
		t.Fatalf("acquire: got = %d %v, expected: acquired", code, out)
	}
	token := out["token"].(string)

	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Validate", `{"name":"nightly-report","token":"`+token+`"}`)
	if code != 200 || out["valid"] != true || out["holderIdentity"] != "alice" {
		t.Fatalf("validate: got = %d %v, expected: valid, held by alice", code, out)
	}

	_, out = postJSON(t, ts.URL, "tenure.v1.SessionService/Open", `{"identity":"bob","ttl":"10s"}`)
	bob := out["session"].(map[string]any)["id"].(string)
	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Acquire", `{"sessionId":"`+bob+`","name":"nightly-report"}`)
	if code != 200 || out["acquired"] != false || out["token"] != "0" {
		t.Fatalf("acquire of a held lease: got = %d %v, expected: \"acquired\":false,\"token\":\"0\"", code, out)
	}

	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Release", `{"name":"nightly-report","token":"999"}`)
	if code != http.StatusBadRequest || out["code"] != "failed_precondition" || !strings.Contains(out["message"].(string), "not holder") {
		t.Fatalf("release with wrong token: got = %d %v, expected: 400 failed_precondition not holder", code, out)
	}

	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Release", `{"name":"nightly-report","token":"`+token+`"}`)
	if code != 200 {
		t.Fatalf("release: got = %d %v, expected: 200", code, out)
	}
	code, out = postJSON(t, ts.URL, "tenure.v1.LeaseService/Validate", `{"name":"nightly-report","token":"`+token+`"}`)
	// A false answer is spelled out, not left to protobuf's convention
	// that an absent field is false.
	if code != 200 || out["valid"] != false {
		t.Fatalf("validate after release: got = %d %v, expected: \"valid\":false", code, out)
	}
	code, out = postJSON(t, ts.URL, "tenure.v1.KVService/Delete", `{"key":"absent"}`)
	if code != 200 || out["deleted"] != "0" {
		t.Fatalf("delete of an absent key: got = %d %v, expected: \"deleted\":\"0\"", code, out)
	}

	// The NDJSON watch replays the acquire and the release.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/v1/watch/leases?start_revision=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var types []string
	for len(types) < 2 && sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", sc.Text(), err)
		}
		types = append(types, ev["type"].(string))
	}
	want := []string{"LEASE_EVENT_TYPE_ACQUIRED", "LEASE_EVENT_TYPE_RELEASED"}
	if strings.Join(types, ",") != strings.Join(want, ",") {
		t.Fatalf("watch: got = %v, expected: %v", types, want)
	}
}

func TestBlockingAcquireIsWokenByRelease(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	a := openSession(t, ts, "a", 5*time.Second)
	b := openSession(t, ts, "b", 5*time.Second)
	first := acquire(t, ts, a.Id, "job", false)

	got := make(chan *tenurev1.AcquireResponse, 1)
	errc := make(chan error, 1)
	go func() {
		resp, err := ts.Leases.Acquire(context.Background(), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.Id, Name: "job", Wait: true}))
		if err != nil {
			errc <- err
			return
		}
		got <- resp.Msg
	}()
	waitForWaiters(t, ts, "job", 1)
	select {
	case r := <-got:
		t.Fatalf("waiter granted while the lease was held: %v", r)
	default:
	}
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: first.Token})); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if !r.Acquired || r.Token <= first.Token || r.Lease.HolderIdentity != "b" {
			t.Fatalf("got = %v, expected: acquired by b with a token above %d", r, first.Token)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken by release")
	}
}

func waitForWaiters(t *testing.T, ts *testServer, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := ts.Leases.Get(ctxT(t), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: name}))
		if err == nil && len(resp.Msg.Lease.Waiters) == n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("lease %s never had %d waiters", name, n)
}

func TestBlockingAcquireIsWokenByExpiryNotBeforeTTL(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	const ttl = 500 * time.Millisecond
	holder := openSession(t, ts, "holder", ttl)
	waiter := openSession(t, ts, "waiter", 5*time.Second)
	keepAlive(t, ts, waiter.Id, time.Second)
	acquire(t, ts, holder.Id, "job", false)
	// The holder's last heartbeat is now; it never sends another. The
	// clock starts before the call: the server renews while handling it.
	lastHeartbeat := time.Now()
	if _, err := ts.Sessions.Refresh(ctxT(t), connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: holder.Id})); err != nil {
		t.Fatal(err)
	}
	resp, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: waiter.Id, Name: "job", Wait: true}))
	granted := time.Since(lastHeartbeat)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Msg.Acquired || resp.Msg.Lease.HolderIdentity != "waiter" {
		t.Fatalf("got = %v, expected: granted to waiter", resp.Msg)
	}
	if granted < ttl {
		t.Fatalf("granted %v after the holder's last heartbeat, expected: not before its TTL %v", granted, ttl)
	}
	_, err = ts.Sessions.Refresh(ctxT(t), connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: holder.Id}))
	wantCode(t, err, connect.CodeNotFound, "expired")
}

func TestHeartbeatsKeepASessionPastItsTTL(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "kept", 300*time.Millisecond)
	keepAlive(t, ts, s.Id, 80*time.Millisecond)
	acquire(t, ts, s.Id, "kept", false)
	time.Sleep(time.Second)
	resp, err := ts.Sessions.Get(ctxT(t), connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: s.Id}))
	if err != nil {
		t.Fatalf("session renewed every 80ms expired within 1s of a 300ms TTL: %v", err)
	}
	if len(resp.Msg.Session.Leases) != 1 {
		t.Fatalf("got = %v, expected: still holding default/kept", resp.Msg.Session.Leases)
	}
}

func TestKeepAliveStreamRenewsManySessions(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	ids := []int64{openSession(t, ts, "s1", 5*time.Second).Id, openSession(t, ts, "s2", 5*time.Second).Id}
	stream := ts.Sessions.KeepAlive(ctxT(t))
	for _, id := range append(ids, 424242) {
		if err := stream.Send(&tenurev1.KeepAliveRequest{SessionId: id}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Receive()
		if err != nil {
			t.Fatal(err)
		}
		wantExpired := id == 424242
		if resp.SessionId != id || resp.Expired != wantExpired {
			t.Fatalf("got = %v, expected: session %d expired=%v", resp, id, wantExpired)
		}
	}
	if err := stream.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Receive(); !errors.Is(err, io.EOF) {
		t.Fatalf("got = %v, expected: EOF after the client closed", err)
	}
	_ = stream.CloseResponse()
}

func TestClosingASessionReleasesAtOnceAndGrantsTheNextWaiter(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	a := openSession(t, ts, "a", 30*time.Second)
	b := openSession(t, ts, "b", 30*time.Second)
	acquire(t, ts, a.Id, "shard-1", false)
	if r := acquire(t, ts, b.Id, "shard-1", false); r.Acquired {
		t.Fatalf("got = acquired, expected: not acquired while a holds it")
	}
	done := make(chan *tenurev1.AcquireResponse, 1)
	go func() {
		resp, err := ts.Leases.Acquire(context.Background(), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.Id, Name: "shard-1", Wait: true}))
		if err == nil {
			done <- resp.Msg
		}
		close(done)
	}()
	waitForWaiters(t, ts, "shard-1", 1)
	start := time.Now()
	if _, err := ts.Sessions.Close(ctxT(t), connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: a.Id})); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r == nil || !r.Acquired {
		t.Fatalf("got = %v, expected: b granted when a closed", r)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("handover took %v, expected: milliseconds, not a TTL", d)
	}
}

func TestAcquireWaitTimeoutLeavesTheQueue(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	a := openSession(t, ts, "a", 30*time.Second)
	b := openSession(t, ts, "b", 30*time.Second)
	acquire(t, ts, a.Id, "job", false)
	resp, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.Id, Name: "job", Wait: true, WaitTimeout: durationpb.New(200 * time.Millisecond)}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.Acquired {
		t.Fatalf("got = acquired, expected: timed out")
	}
	waitForWaiters(t, ts, "job", 0)
}

func TestCancelledWaiterLeavesTheQueueAndIsNeverGranted(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	a := openSession(t, ts, "a", 30*time.Second)
	b := openSession(t, ts, "b", 30*time.Second)
	first := acquire(t, ts, a.Id, "job", false)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.Id, Name: "job", Wait: true}))
		errc <- err
	}()
	waitForWaiters(t, ts, "job", 1)
	cancel()
	wantCode(t, <-errc, connect.CodeCanceled, "")
	waitForWaiters(t, ts, "job", 0)
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: first.Token})); err != nil {
		t.Fatal(err)
	}
	lease, err := ts.Leases.Get(ctxT(t), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(lease.Msg.Lease.Holders) != 0 {
		t.Fatalf("got = %v, expected: no holder after the only waiter left", lease.Msg.Lease.Holders)
	}
}

func TestWaiterWhoseSessionExpiresIsNeverGranted(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	a := openSession(t, ts, "a", 30*time.Second)
	b := openSession(t, ts, "b", 300*time.Millisecond)
	first := acquire(t, ts, a.Id, "job", false)
	_, err := ts.Leases.Acquire(ctxT(t), connect.NewRequest(&tenurev1.AcquireRequest{SessionId: b.Id, Name: "job", Wait: true}))
	wantCode(t, err, connect.CodeNotFound, "session expired")
	if _, err := ts.Leases.Release(ctxT(t), connect.NewRequest(&tenurev1.ReleaseRequest{Name: "job", Token: first.Token})); err != nil {
		t.Fatal(err)
	}
	lease, _ := ts.Leases.Get(ctxT(t), connect.NewRequest(&tenurev1.GetLeaseRequest{Name: "job"}))
	if len(lease.Msg.Lease.Holders) != 0 || len(lease.Msg.Lease.Waiters) != 0 {
		t.Fatalf("got = %v, expected: free, nobody queued", lease.Msg.Lease)
	}
}

func TestKeyTTLAndSessionBoundKeysVanish(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	s := openSession(t, ts, "owner", 30*time.Second)
	ctx := ctxT(t)
	// The clock starts before the call: the TTL starts when the put is
	// applied, before the reply.
	put := time.Now()
	if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "ttl-key", Value: "v", Ttl: durationpb.New(300 * time.Millisecond)})); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "bound-key", Value: "v", SessionId: s.Id})); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "ttl-key"})); err != nil {
		t.Fatalf("ttl-key gone at once: %v", err)
	}
	for {
		_, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "ttl-key"}))
		if err != nil {
			wantCode(t, err, connect.CodeNotFound, "ttl-key")
			if d := time.Since(put); d < 300*time.Millisecond {
				t.Fatalf("ttl-key expired after %v, expected: not before its 300ms TTL", d)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := ts.Sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: s.Id})); err != nil {
		t.Fatal(err)
	}
	_, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "bound-key"}))
	wantCode(t, err, connect.CodeNotFound, "bound-key")
}

func TestCompareAndSwapFailureLeavesStateUnchanged(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	ctx := ctxT(t)
	if _, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "my-lock", Value: "unlocked"})); err != nil {
		t.Fatal(err)
	}
	ok, err := ts.KV.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{Key: "my-lock", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "unlocked"}}, Value: "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ts.KV.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{Key: "my-lock", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "unlocked"}}, Value: "bob"}))
	wantCode(t, err, connect.CodeFailedPrecondition, "compare failed")
	var ce *connect.Error
	if !errors.As(err, &ce) || len(ce.Details()) != 1 {
		t.Fatalf("got = %v, expected: one detail with the current key", err)
	}
	detail, _ := ce.Details()[0].Value()
	if cur := detail.(*tenurev1.GetResponse).Kv; cur.Value != "alice" || cur.ModRevision != ok.Msg.Revision {
		t.Fatalf("detail got = %v, expected: alice at revision %d", cur, ok.Msg.Revision)
	}
	got, err := ts.KV.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "my-lock"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Kv.Value != "alice" || got.Msg.Revision != ok.Msg.Revision || got.Msg.Kv.Version != 2 {
		t.Fatalf("got = %v at revision %d, expected: alice, version 2, store still at revision %d", got.Msg.Kv, got.Msg.Revision, ok.Msg.Revision)
	}
}

func TestWatchSeesEveryEventInOrder(t *testing.T) {
	t.Parallel()
	ts := startServer(t, t.TempDir(), testLimits())
	// Nearly 400 writes under -race on a loaded machine can take longer than
	// ctxT's 20 s: the bound here is for a watch that stopped.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "jobs/0", Value: "0"}))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := ts.KV.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: "jobs/", Prefix: true, StartRevision: first.Msg.Revision}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	const n = 200
	// The writer's first failure, so that a watch left waiting for
	// writes that never happened says so.
	wrote := make(chan error, 1)
	go func() {
		var first error
		for i := 1; i < n; i++ {
			key := "jobs/" + string(rune('a'+i%26))
			var err error
			if i%3 == 0 {
				_, err = ts.KV.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: key}))
			} else {
				_, err = ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: "v"}))
			}
			if _, err2 := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "other/" + key, Value: "v"})); err == nil {
				err = err2
			}
			if err != nil && first == nil {
				first = fmt.Errorf("write %d: %w", i, err)
			}
		}
		wrote <- first
	}()
	var last int64
	seen := 0
	for seen < n/2 && stream.Receive() {
		ev := stream.Msg()
		if ev.Revision <= last {
			t.Fatalf("event revision %d after %d, expected: increasing", ev.Revision, last)
		}
		if !strings.HasPrefix(ev.Kv.Key, "jobs/") {
			t.Fatalf("got = event for %q, expected: only jobs/ keys", ev.Kv.Key)
		}
		last = ev.Revision
		seen++
	}
	if err := stream.Err(); err != nil {
		select {
		case werr := <-wrote:
			t.Fatalf("after %d events: %v; the writer: %v", seen, err, werr)
		default:
			t.Fatalf("after %d events: %v; the writer had not finished", seen, err)
		}
	}
	if seen < n/2 {
		t.Fatalf("the watch ended after %d events, expected: %d", seen, n/2)
	}
}

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	ctx := ctxT(t)
	s := openSession(t, ts, "a", 5*time.Second)
	rev := func() int64 {
		r, err := ts.KV.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.Revision
	}
	before := rev()
	long := strings.Repeat("x", 513)
	cases := []struct {
		name     string
		call     func() error
		contains string
	}{
		{"a TTL under the minimum names the limit", func() error {
			_, err := ts.Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Millisecond)}))
			return err
		}, "outside 100ms..24h0m0s"},
		{"a lease name over 512 bytes names the limit", func() error {
			_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id, Name: long}))
			return err
		}, "over the limit of 512 bytes"},
		{"a namespace that is not a DNS label", func() error {
			_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id, Namespace: "Bad_NS", Name: "x"}))
			return err
		}, "must be a DNS label"},
		{"a value over 64 KiB names the limit", func() error {
			_, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: strings.Repeat("v", 64<<10+1)}))
			return err
		}, "over the limit of 65536 bytes"},
		{"an empty key", func() error {
			_, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "", Value: "v"}))
			return err
		}, "key is empty"},
		{"a capacity below one", func() error {
			_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: s.Id, Name: "x", Capacity: -1}))
			return err
		}, "capacity -1 is outside"},
		{"a compare with no target", func() error {
			_, err := ts.KV.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{Key: "k", Value: "v"}))
			return err
		}, "compare must set one of"},
		{"a bad label selector", func() error {
			_, err := ts.Leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{LabelSelector: "a=b,,c"}))
			return err
		}, "empty term"},
		{"a missing session", func() error {
			_, err := ts.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{Name: "x"}))
			return err
		}, "session_id must be a positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(), connect.CodeInvalidArgument, tc.contains)
		})
	}
	if after := rev(); after != before {
		t.Fatalf("revision got = %d, expected: %d (bad input changes nothing)", after, before)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts := startServer(t, dir, testLimits())
	s := openSession(t, ts, "a", 30*time.Second)
	grant := acquire(t, ts, s.Id, "job", false)
	if _, err := ts.KV.Put(ctxT(t), connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "v"})); err != nil {
		t.Fatal(err)
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, dir, testLimits())
	v, err := ts.Leases.Validate(ctxT(t), connect.NewRequest(&tenurev1.ValidateRequest{Name: "job", Token: grant.Token}))
	if err != nil {
		t.Fatal(err)
	}
	if !v.Msg.Valid {
		t.Fatalf("got = %v, expected: the grant survives a restart", v.Msg)
	}
	kv, err := ts.KV.Get(ctxT(t), connect.NewRequest(&tenurev1.GetRequest{Key: "k"}))
	if err != nil || kv.Msg.Kv.Value != "v" {
		t.Fatalf("got = %v %v, expected: k=v after restart", kv, err)
	}
	// A new grant after the restart still gets a higher token.
	s2 := openSession(t, ts, "b", 30*time.Second)
	g2 := acquire(t, ts, s2.Id, "other", false)
	if g2.Token <= grant.Token {
		t.Fatalf("token after restart got = %d, expected: above %d", g2.Token, grant.Token)
	}
}

func TestWebPageIsServedAtTheRoot(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	resp, err := http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("got = %d %s, expected: 200 text/html", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{"<title>Tenure</title>", "LeaseService/List", "SessionService/List", "ClusterService/Members", "/v1/watch/leases"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Only the root is the page; unknown paths stay 404.
	resp2, err := http.Get(ts.URL + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /nope: got = %d, expected: 404", resp2.StatusCode)
	}
}

func TestMembersListsTheSingleVoter(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	clusterSvc := tenurev1connect.NewClusterServiceClient(h2cClient(t), ts.URL)
	resp, err := clusterSvc.Members(ctxT(t), connect.NewRequest(&tenurev1.MembersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ms := resp.Msg.Members
	if len(ms) != 1 || ms[0].Id != "node1" || !ms[0].Voter || !ms[0].Leader || !ms[0].Self || ms[0].PeerAddress == "" {
		t.Fatalf("got = %v, expected: node1, the one voter, leading, answering itself", ms)
	}
	if resp.Msg.AppliedIndex == 0 {
		t.Fatalf("applied index got = 0, expected: above 0 once the node has elected itself")
	}
}
