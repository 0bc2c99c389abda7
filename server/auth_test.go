package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/certs"
)

// TestNoPrincipalCanActAsAnother: team-a and team-b both lock in the
// "shared" namespace. team-b cannot open a session as team-a, acquire or
// heartbeat with team-a's session, release or set the value of team-a's
// grant, close team-a's session, read team-a's keys, see team-a's
// sessions or lease events, or claim to be admin with the header a
// forwarding node uses; and the same refusals reach a Go client on its
// pipelined connection as ErrPermissionDenied.
func TestNoPrincipalCanActAsAnother(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := as.clients(t, "token:team-a"), as.clients(t, "token:team-b")
	open, err := a.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	sa := open.Msg.Session
	if sa.Identity != "team-a" {
		t.Errorf("identity of a session opened without one: got = %q, expected: the principal, team-a", sa.Identity)
	}
	grant, err := a.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sa.Id, Namespace: "shared", Name: "db-migration"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "team-a/secret", Value: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("team-b %s: got = %v, expected: permission_denied", what, err)
		}
	}
	_, err = b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "team-a"}))
	refused("opens a session as team-a", err)
	_, err = b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "team-a/pod-1"}))
	refused("opens a session as team-a/pod-1", err)
	_, err = b.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sa.Id, Namespace: "shared", Name: "other"}))
	refused("acquires with team-a's session", err)
	_, err = b.sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: sa.Id}))
	refused("heartbeats team-a's session", err)
	_, err = b.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: "shared", Name: "db-migration", Token: grant.Msg.Token}))
	refused("releases team-a's grant", err)
	_, err = b.leases.SetValue(ctx, connect.NewRequest(&tenurev1.SetValueRequest{Namespace: "shared", Name: "db-migration", Token: grant.Msg.Token, Value: "mine"}))
	refused("sets the value of team-a's grant", err)
	_, err = b.sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sa.Id}))
	refused("closes team-a's session", err)
	_, err = b.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/secret"}))
	refused("reads team-a's key", err)
	_, err = b.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: ""}))
	refused("ranges over every key", err)
	refused("watches every key", firstMessage(b.kv.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Prefix: true, StartRevision: 1}))))

	// A caller's claim to be forwarding for admin is dropped: only a
	// node's certificate makes it believed.
	forged := connect.NewRequest(&tenurev1.RevokeRequest{Namespace: "shared", Name: "db-migration", Reason: "forged"})
	forged.Header().Set(auth.ForwardedPrincipalHeader, "admin")
	_, err = b.leases.Revoke(ctx, forged)
	refused("revokes, claiming to forward for admin", err)

	// Lists: team-b sees team-a's session only for what they share, and
	// no event of team-a's own namespace.
	list, err := b.sessions.List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, sess := range list.Msg.Sessions {
		if sess.Id == sa.Id && (len(sess.Leases) != 1 || sess.Leases[0] != "shared/db-migration") {
			t.Errorf("team-a's session as team-b sees it: got = leases %v, expected: only shared/db-migration", sess.Leases)
		}
	}
	if _, err := a.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sa.Id, Namespace: "team-a", Name: "private"})); err != nil {
		t.Fatal(err)
	}
	watch, err := b.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{AllNamespaces: true, StartRevision: 1}))
	if err != nil {
		t.Fatal(err)
	}
	// A marker event team-b may see ends the replay.
	sb, err := b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sb.Msg.Session.Id, Namespace: "team-b", Name: "marker"})); err != nil {
		t.Fatal(err)
	}
	for watch.Receive() {
		ev := watch.Msg()
		if ev.Namespace == "team-a" {
			t.Errorf("team-b's watch of every namespace delivered %s/%s", ev.Namespace, ev.Name)
		}
		if ev.Name == "marker" {
			break
		}
	}
	watch.Close()

	// The Go client, on its pipelined connection.
	cfg, err := certs.ClientConfig(filepath.Join(as.dir, "ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	gc, err := client.New(ctx, []string{as.url}, client.WithTLS(cfg), client.WithToken(as.tokens["team-b"]))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if _, err := gc.KV().Put(ctx, "team-a/secret", "overwritten"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("Go client put of team-a's key: got = %v, expected: ErrPermissionDenied", err)
	}
	s, err := gc.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if s.Identity() != "team-b" {
		t.Errorf("Go client session identity: got = %q, expected: team-b", s.Identity())
	}
	if err := s.Mutex("private", client.WithNamespace("team-a")).TryLock(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("Go client TryLock in team-a: got = %v, expected: ErrPermissionDenied", err)
	}
	if err := s.Mutex("own", client.WithNamespace("team-b")).TryLock(ctx); err != nil {
		t.Errorf("Go client TryLock in its own namespace: got = %v, expected: held", err)
	}

	got, err := a.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/secret"}))
	if err != nil || got.Msg.Kv.Value != "s3cret" {
		t.Errorf("team-a's key after team-b's attempts: got = %v, %v, expected: s3cret", got, err)
	}
	if l, err := a.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: "shared", Name: "db-migration"})); err != nil ||
		len(l.Msg.Lease.Holders) != 1 || l.Msg.Lease.Holders[0].Token != grant.Msg.Token || l.Msg.Lease.Value != "" {
		t.Errorf("team-a's grant after team-b's attempts: got = %v, %v, expected: held as granted", l, err)
	}
}

// TestPerPrincipalLimitsAnswerResourceExhaustedNamingTheLimit: a
// principal over its open sessions, or over its request rate, is
// refused with resource_exhausted and a message naming the limit, and
// nothing is opened.
func TestPerPrincipalLimitsAnswerResourceExhaustedNamingTheLimit(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := as.clients(t, "token:team-b")
	for i := range 3 {
		if _, err := b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)})); err != nil {
			t.Fatalf("session %d of 3: %v", i+1, err)
		}
	}
	before := as.revision(t, ctx)
	_, err := b.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "team-b has 3 sessions open") {
		t.Errorf("a fourth session: got = %v, expected: resource_exhausted naming the limit of 3", err)
	}
	if after := as.revision(t, ctx); after != before {
		t.Errorf("the refused Open moved the revision from %d to %d", before, after)
	}

	slow := as.clients(t, "token:slow")
	var last error
	for range 10 {
		if _, last = slow.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "team-a/x"})); connect.CodeOf(last) == connect.CodeResourceExhausted {
			break
		}
	}
	if connect.CodeOf(last) != connect.CodeResourceExhausted || !strings.Contains(last.Error(), "slow is over its limit of 0.5 requests per second") {
		t.Errorf("past its burst of 3: got = %v, expected: resource_exhausted naming the rate", last)
	}
}

// TestPolicyReloadAppliesAValidChangeAndKeepsTheOldOnABadFile: a valid
// new policy takes effect without a restart, whether reloaded at once
// (SIGHUP) or noticed on disk; an invalid one is refused, the policy in
// force stays, and the refusal is logged.
func TestPolicyReloadAppliesAValidChangeAndKeepsTheOldOnABadFile(t *testing.T) {
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reader := as.clients(t, "token:reader")
	put := func() error {
		_, err := reader.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "notes/1", Value: "x"}))
		return err
	}
	if err := put(); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("reader puts before the change: got = %v, expected: permission_denied", err)
	}
	file := filepath.Join(as.dir, "policy.yaml")
	writable := strings.Replace(testPolicy, "  reader:\n    - namespaces: [\"*\"]\n      keys: [\"*\"]\n      verbs: [read]",
		"  reader:\n    - namespaces: [\"*\"]\n      keys: [\"*\"]\n      verbs: [read, write]", 1)
	if writable == testPolicy {
		t.Fatal("the test's policy edit matched nothing")
	}
	writePolicy(t, file, as.tokens, writable)
	if err := as.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := put(); err != nil {
		t.Errorf("reader puts after the reload: got = %v, expected: ok", err)
	}

	// A bad file: refused, the policy before it stays.
	if err := os.WriteFile(file, []byte("principals:\n  - name: reader\n    roles: [no-such-role]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := as.policy.Reload(); err == nil || !strings.Contains(err.Error(), `role "no-such-role" is not defined`) {
		t.Errorf("reloading a bad file: got = %v, expected: an error naming the undefined role", err)
	}
	if err := put(); err != nil {
		t.Errorf("reader puts after a bad reload: got = %v, expected: ok, the old policy stays", err)
	}
	if !strings.Contains(as.logs.String(), "no-such-role") {
		t.Error("the refused reload is not in the log")
	}

	// Noticed on disk, without being told.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watching := make(chan struct{})
	defer func() {
		stopWatch()
		<-watching
	}()
	go func() {
		defer close(watching)
		as.policy.Watch(watchCtx, 20*time.Millisecond)
	}()
	writePolicy(t, file, as.tokens, testPolicy)
	deadline := time.Now().Add(10 * time.Second)
	for put() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the policy file's change was not noticed in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
