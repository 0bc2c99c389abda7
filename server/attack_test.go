package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/attack"
	"github.com/tenurehq/tenure/internal/certs"
)

// The attacks of issue 21 on one node: another principal aims its calls
// at the IDs and tokens the victim is about to get, from many
// goroutines, while the victim works. Ownership is decided when each
// command is applied, so nothing of the victim's is touched, and each
// refusal is audited.

func (as *authServer) party(t *testing.T, credentials string) attack.Party {
	return attack.NewParty(as.http(t, credentials), as.url)
}

func TestNoPrincipalWinsARaceForAnotherPrincipalsNextSession(t *testing.T) {
	t.Parallel()
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var atApply atomic.Int64
	for _, attacker := range []string{"team-b", "reader"} {
		t.Run(attacker, func(t *testing.T) {
			rep, err := attack.Race{
				Victim: as.party(t, "token:team-a"), Attacker: as.party(t, "token:"+attacker), Observer: as.party(t, "token:admin"),
				SharedNamespace: "shared", AttackerNamespace: "team-b", AttackerKeys: "team-b/",
				Sessions: 40, Goroutines: 8, Ahead: 4,
			}.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Empty() {
				t.Errorf("what %s did to team-a's sessions and grants: got = %s, expected: nothing", attacker, rep)
			}
			t.Logf("%s: %s", attacker, rep)
			atApply.Add(rep.RefusedAtApply)
			if rep.Refused == 0 {
				t.Errorf("refused calls of %s: got = 0 of %d, expected: some (the race never reached a victim ID)", attacker, rep.Salvos)
			}
		})
	}
	// Whether a call wins the race past the edge is up to the scheduler;
	// each one that did is refused by the state machine and audited.
	// Refusals beyond 100 a second from one host and principal are
	// folded into a count (auth/auditfold.go): then the fold names them,
	// in a line written when its window (auth.FoldWindow) ends.
	if n := atApply.Load(); n > 0 {
		waitFor(t, fmt.Sprintf("an audit line for the %d refused at apply", n), func() bool {
			logs := as.logs.String()
			return strings.Contains(logs, "not owner") || strings.Contains(logs, "folded")
		})
	}
}

// TestAHeartbeatForAnIDNotYetOpenedNeverKeepsItsSessionAlive: team-b
// beats for the next IDs before team-a opens them, on a stream that
// reopens whenever it is ended. team-a's session, never heartbeated by
// team-a, expires after its TTL all the same, and team-b's streams are
// refused once the session exists.
func TestAHeartbeatForAnIDNotYetOpenedNeverKeepsItsSessionAlive(t *testing.T) {
	t.Parallel()
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	victim, attacker, admin := as.party(t, "token:team-a"), as.party(t, "token:team-b"), as.party(t, "token:admin")
	rev := as.revision(t, ctx)
	var denied atomic.Int64
	beatCtx, stopBeating := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		denied.Store(attack.Heartbeats(beatCtx, attacker, func() []int64 { return []int64{rev + 1, rev + 2, rev + 3} }, 50*time.Millisecond))
	}()
	defer func() { stopBeating(); <-done }()
	time.Sleep(200 * time.Millisecond) // the attacker beats before the session exists
	open, err := victim.Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	id := open.Msg.GetSession().GetId()
	if id > rev+3 {
		t.Fatalf("victim's session ID: got = %d, expected: one the attacker aims at (%d..%d)", id, rev+1, rev+3)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := admin.Sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("team-a's session %d (TTL 1s) 10s later: got = still open (%v), expected: expired: team-b's heartbeats kept it alive", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopBeating()
	<-done
	if denied.Load() == 0 {
		t.Errorf("team-b's heartbeat streams refused: got = 0, expected: at least one once the session existed")
	}
	if want := "principal=team-b action=/tenure.v1.SessionService/KeepAlive target=\"session " + fmt.Sprint(id) + "\" outcome=denied"; !strings.Contains(as.logs.String(), want) {
		t.Errorf("audit log lacks %q", want)
	}
}

// TestCompareAndSwapBindsKeysOnlyToTheCallersSessions: CompareAndSwap
// checks the session it binds to as Put does, on a unary call and on
// both pipeline transports.
func TestCompareAndSwapBindsKeysOnlyToTheCallersSessions(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := as.clients(t, "token:team-a")
	victim := a.openSession(t, ctx)
	cas := func(key string) *tenurev1.CompareAndSwapRequest {
		return &tenurev1.CompareAndSwapRequest{Key: key, Value: "b", SessionId: victim, Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Absent{Absent: true}}}
	}
	b := as.clients(t, "token:team-b")
	_, err := b.kv.CompareAndSwap(ctx, connect.NewRequest(cas("team-b/unary")))
	expect(t, "unary CompareAndSwap binding team-b/unary to team-a's session", connect.CodeOf(err), connect.CodePermissionDenied)

	stream := b.sessions.Pipeline(ctx)
	if err := stream.Send(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: cas("team-b/stream")}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Receive()
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "pipelined (Connect stream) CompareAndSwap binding to team-a's session", connect.Code(resp.GetError().GetCode()), connect.CodePermissionDenied)
	_ = stream.CloseRequest()
	_ = stream.CloseResponse()

	framed := as.dialPipeline(t, as.tokens["team-b"])
	if err := framed.send(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: cas("team-b/framed")}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = framed.receive(); err != nil {
		t.Fatal(err)
	}
	expect(t, "pipelined (upgraded connection) CompareAndSwap binding to team-a's session", connect.Code(resp.GetError().GetCode()), connect.CodePermissionDenied)
	all := as.clients(t, "token:admin")
	for _, k := range []string{"team-b/unary", "team-b/stream", "team-b/framed"} {
		if _, err := all.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: k})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("key %s after the refused compare-and-swap: got = %v, expected: not found", k, err)
		}
	}
}

// dialPipeline upgrades a TLS connection with token by hand, as the Go
// client does.
func (as *authServer) dialPipeline(t *testing.T, token string) *upgradePipe {
	t.Helper()
	cfg, err := certs.ClientConfig(filepath.Join(as.dir, "ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", as.Addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: tenure\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", framing.Path, token, framing.Protocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: got = %s, expected: 101 Switching Protocols", resp.Status)
	}
	return &upgradePipe{conn: conn, r: framing.NewReader(br, 1<<20), w: framing.NewWriter(conn)}
}

func expect[T comparable](t *testing.T, what string, got, expected T) {
	t.Helper()
	if got != expected {
		t.Errorf("%s: got = %v, expected: %v", what, got, expected)
	}
}

// goClient is the Go client (the upgraded pipeline) with a token.
func (as *authServer) goClient(t *testing.T, ctx context.Context, token string) *client.Client {
	t.Helper()
	cfg, err := certs.ClientConfig(filepath.Join(as.dir, "ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(ctx, []string{as.Addr()}, client.WithTLS(cfg), client.WithToken(token),
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestACredentialIsCheckedForAsLongAsItIsUsed: streams and pipelines
// opened with team-a's token stop working the moment the token leaves
// the policy, as a unary call does, and are ended unauthenticated.
func TestACredentialIsCheckedForAsLongAsItIsUsed(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := as.clients(t, "token:team-a")
	sid := a.openSession(t, ctx)

	heartbeats := a.sessions.KeepAlive(ctx)
	beat := func() error {
		if err := heartbeats.Send(&tenurev1.KeepAliveRequest{SessionId: sid}); err != nil {
			_, err = heartbeats.Receive()
			return err
		}
		_, err := heartbeats.Receive()
		return err
	}
	pipe := a.sessions.Pipeline(ctx)
	put := func(id uint64) error {
		req := &tenurev1.PipelineRequest{Id: id, Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: "team-a/k", Value: fmt.Sprint(id)}}}
		if err := pipe.Send(req); err != nil {
			_, err = pipe.Receive()
			return err
		}
		resp, err := pipe.Receive()
		if err != nil {
			return err
		}
		if e := resp.GetError(); e != nil {
			return connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage()))
		}
		return nil
	}
	goClient := as.goClient(t, ctx, as.tokens["team-a"])
	if err := beat(); err != nil {
		t.Fatalf("heartbeat before the change: %v", err)
	}
	if err := put(1); err != nil {
		t.Fatalf("pipelined put before the change: %v", err)
	}
	// From revision 1, so that its first event (the put) is there at once.
	watch, err := a.kv.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: "team-a/k", StartRevision: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if !watch.Receive() {
		t.Fatalf("watch before the change: %v", watch.Err())
	}
	if _, err := goClient.KV().Put(ctx, "team-a/g", "1"); err != nil {
		t.Fatalf("Go client put before the change: %v", err)
	}

	// team-a's token leaves the policy: it is given a new one.
	as.tokens["team-a"] = auth.NewToken()
	writePolicy(t, as.policy.Path(), as.tokens, testPolicy)
	if err := as.policy.Reload(); err != nil {
		t.Fatal(err)
	}

	expect(t, "heartbeat on the stream opened before", connect.CodeOf(beat()), connect.CodeUnauthenticated)
	expect(t, "put on the pipeline opened before", connect.CodeOf(put(2)), connect.CodeUnauthenticated)
	expect(t, "the pipeline after its credential failed", connect.CodeOf(put(3)), connect.CodeUnauthenticated)
	if _, err := as.clients(t, "token:admin").kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "team-a/k", Value: "by admin"})); err != nil {
		t.Fatal(err)
	}
	for watch.Receive() {
		t.Errorf("watch opened before the change: got event %v, expected: none, the stream ended", watch.Msg())
	}
	expect(t, "watch stream's end", connect.CodeOf(watch.Err()), connect.CodeUnauthenticated)
	if _, err := goClient.KV().Put(ctx, "team-a/g", "2"); !errors.Is(err, client.ErrUnauthenticated) {
		t.Errorf("Go client put on its pipeline after the change: got = %v, expected: ErrUnauthenticated", err)
	}
	kv, err := as.clients(t, "token:admin").kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/g"}))
	if err != nil || kv.Msg.GetKv().GetValue() != "1" {
		t.Errorf("team-a/g after the change: got = %v, %v, expected: 1", kv, err)
	}
}

// TestAnExpiredTokenStopsWorkingOnAnOpenStream: the token's expiry, not
// only its removal, ends what it opened.
func TestAnExpiredTokenStopsWorkingOnAnOpenStream(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	expires := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339)
	body := strings.Replace(testPolicy, "roles: [team-a]\n    tokens: [{sha256: \"%s\"}]", "roles: [team-a]\n    tokens: [{sha256: \"%s\", expires: \""+expires+"\"}]", 1)
	writePolicy(t, as.policy.Path(), as.tokens, body)
	if err := as.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	a := as.clients(t, "token:team-a")
	sid := a.openSession(t, ctx)
	heartbeats := a.sessions.KeepAlive(ctx)
	var last error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := heartbeats.Send(&tenurev1.KeepAliveRequest{SessionId: sid}); err != nil {
			_, last = heartbeats.Receive()
			break
		}
		if _, last = heartbeats.Receive(); last != nil {
			break
		}
	}
	expect(t, "heartbeats on a stream whose token expired", connect.CodeOf(last), connect.CodeUnauthenticated)
}

// TestAWriteOnlyPrincipalReadsNoValueFromItsWrites: Put's prev_kv and a
// failed compare-and-swap's message and details carry what the key held;
// a principal that may write a key but not read it gets neither, on a
// unary call and on a pipeline, while a reader-writer still does.
func TestAWriteOnlyPrincipalReadsNoValueFromItsWrites(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The validator becomes a principal that may only write team-a/.
	body := strings.Replace(testPolicy, "  validator:\n    - namespaces: [team-a]\n      verbs: [validate]", "  validator:\n    - keys: [team-a/]\n      verbs: [write]", 1)
	writePolicy(t, as.policy.Path(), as.tokens, body)
	if err := as.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	const secret = "s3cret-value"
	admin := as.clients(t, "token:admin")
	if _, err := admin.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "team-a/secret", Value: secret})); err != nil {
		t.Fatal(err)
	}
	w := as.clients(t, "token:validator")
	put, err := w.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "team-a/secret", Value: secret}))
	if err != nil {
		t.Fatal(err)
	}
	if put.Msg.GetPrevKv() != nil {
		t.Errorf("write-only Put's prev_kv: got = %v, expected: none", put.Msg.GetPrevKv())
	}
	_, err = w.kv.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{
		Key: "team-a/secret", Value: "new", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "guess"}},
	}))
	expect(t, "write-only CompareAndSwap with a wrong value", connect.CodeOf(err), connect.CodeFailedPrecondition)
	if strings.Contains(err.Error(), secret) {
		t.Errorf("write-only CompareAndSwap's message: got = %q, expected: no value", err.Error())
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if g, ok := v.(*tenurev1.GetResponse); ok && g.GetKv().GetValue() != "" {
					t.Errorf("write-only CompareAndSwap's detail: got value %q, expected: none", g.GetKv().GetValue())
				}
			}
		}
	}

	stream := w.sessions.Pipeline(ctx)
	defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
	if err := stream.Send(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_Put{Put: &tenurev1.PutRequest{Key: "team-a/secret", Value: secret}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.GetPut().GetPrevKv(); p != nil {
		t.Errorf("write-only pipelined Put's prev_kv: got = %v, expected: none", p)
	}
	if err := stream.Send(&tenurev1.PipelineRequest{Id: 2, Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: &tenurev1.CompareAndSwapRequest{
		Key: "team-a/secret", Value: "new", Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "guess"}},
	}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = stream.Receive(); err != nil {
		t.Fatal(err)
	}
	if e := resp.GetError(); e == nil || strings.Contains(e.GetMessage(), secret) {
		t.Errorf("write-only pipelined CompareAndSwap: got = %v, expected: compare failed without the value", resp)
	}

	rw, err := as.clients(t, "token:team-a").kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "team-a/secret", Value: "v2"}))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "a reader-writer's prev_kv value", rw.Msg.GetPrevKv().GetValue(), secret)
}

// TestGetOfAnotherPrincipalsSessionAnswersAsForNone: no session ID
// oracle. team-b asking for team-a's session, and for an ID that does
// not exist, gets the same answer but for the number.
func TestGetOfAnotherPrincipalsSessionAnswersAsForNone(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := as.clients(t, "token:team-a").openSession(t, ctx)
	b := as.clients(t, "token:team-b")
	_, theirs := b.sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id}))
	_, none := b.sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id + 1000}))
	expect(t, "code for team-a's session", connect.CodeOf(theirs), connect.CodeNotFound)
	expect(t, "code for no session", connect.CodeOf(none), connect.CodeNotFound)
	if theirs != nil && none != nil {
		got := strings.ReplaceAll(theirs.Error(), fmt.Sprint(id), "N")
		expected := strings.ReplaceAll(none.Error(), fmt.Sprint(id+1000), "N")
		expect(t, "message for team-a's session, the ID masked", got, expected)
	}
	if _, err := as.clients(t, "token:team-a").sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id})); err != nil {
		t.Errorf("team-a's Get of its own session: %v", err)
	}
}

// openSession opens a session of a minute for c and returns its ID.
func (c *authClients) openSession(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	open, err := c.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	return open.Msg.GetSession().GetId()
}
