package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/statemachine"
)

// The rules of who may do what, and how much of a node a caller may
// hold, are the node's (frontend.Node), not an API's. Each rule below is
// written once, against ruleAPI, and runs through the native API and
// through etcd's with the same principals and the same expectations: a
// rule that held on one API only fails here. These are the rules an
// outside attack run found on the native API only.

// rulesPolicy: every principal has a token, which both APIs take.
// owner and thief may write the same keys and lock in the same
// namespace; thief may do nothing to owner's sessions. waiter may park
// two waits, opener open one session; hog sets no watches, so it gets
// the default share of the node's. watcher reads w/ until the policy
// is rewritten without it (rulesPolicyRevoked).
const rulesPolicy = `
principals:
  - name: owner
    roles: [shared]
    tokens: [{sha256: "%[1]s"}]
  - name: thief
    roles: [shared]
    tokens: [{sha256: "%[2]s"}]
  - name: waiter
    roles: [shared]
    tokens: [{sha256: "%[3]s"}]
    limits: {waits: 2}
  - name: opener
    roles: [shared]
    tokens: [{sha256: "%[4]s"}]
    limits: {sessions: 1}
  - name: hog
    roles: [shared]
    tokens: [{sha256: "%[5]s"}]
  - name: watcher
    roles: [%[7]s]
    tokens: [{sha256: "%[6]s"}]
roles:
  shared:
    - namespaces: [s]
      verbs: [read, lock]
    - keys: [s/]
      verbs: [read, write]
  watcher:
    - keys: [w/]
      verbs: [read]
  none:
    - keys: [nothing/]
      verbs: [read]
`

var rulesPrincipals = []string{"owner", "thief", "waiter", "opener", "hog", "watcher"}

// rulesMaxWatches is the node's --max-watches: hog, without a limit of
// its own, may hold half of it.
const rulesMaxWatches = 4

type rulesNode struct {
	*Server
	policyFile string
	policy     *auth.Source
	tokens     map[string]string
	logs       *lockedBuffer
	native     string // the native API's URL
	etcd       string // the etcd API's address
}

func (n *rulesNode) writePolicy(t *testing.T, watcherRole string) {
	t.Helper()
	args := make([]any, 0, len(rulesPrincipals)+1)
	for _, p := range rulesPrincipals {
		args = append(args, auth.HashToken(n.tokens[p]))
	}
	args = append(args, watcherRole)
	if err := os.WriteFile(n.policyFile, []byte(fmt.Sprintf(rulesPolicy, args...)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func startRulesNode(t *testing.T) *rulesNode {
	t.Helper()
	dir := t.TempDir()
	n := &rulesNode{policyFile: filepath.Join(dir, "policy.yaml"), tokens: map[string]string{}, logs: &lockedBuffer{}}
	for _, p := range rulesPrincipals {
		n.tokens[p] = auth.NewToken()
	}
	n.writePolicy(t, "watcher")
	src, err := auth.Load(n.policyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.policy = src
	lim := testLimits()
	lim.MaxWatches = rulesMaxWatches
	etcdLn := testnet.Listen(t)
	srv, err := Open(Config{
		Listener: testnet.Listen(t),
		Auth:     &auth.Authenticator{Policy: src},
		Limits:   lim,
		Logger:   slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Etcd:     EtcdConfig{Listener: etcdLn, Advertise: etcdLn.Addr().String()},
		Raft:     oneNodeRaft(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	n.Server, n.native, n.etcd = srv, "http://"+srv.Addr(), etcdLn.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for n.read(ctx, false, func(*statemachine.Machine) error { return nil }) != nil {
		if ctx.Err() != nil {
			t.Fatal("the node never led")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// ruleAPI is what a rule does, as one API does it; who is a principal
// of rulesPolicy. Errors are the API's own, which refusal classifies.
type ruleAPI interface {
	// OpenSession opens a session (an etcd lease) of who's.
	OpenSession(ctx context.Context, who string) (int64, error)
	// CloseSession closes (revokes) session id as who.
	CloseSession(ctx context.Context, who string, id int64) error
	// PutBound writes key bound to session id, as who.
	PutBound(ctx context.Context, who, key string, id int64) error
	// Put writes key, as who.
	Put(ctx context.Context, who, key, value string) error
	// Hold takes lock name for who at once, in session id.
	Hold(ctx context.Context, who, name string, id int64) error
	// Wait parks a wait of who's for lock name, in session id, until
	// ctx ends; it returns the refusal when the wait is refused.
	Wait(ctx context.Context, who, name string, id int64) error
	// Watch watches the keys under prefix as who: each value put, until
	// the watch ends, then its error (nil: it ended without one).
	Watch(ctx context.Context, who, prefix string) (values <-chan string, ended <-chan error, err error)
	// Sees reports whether who is shown session id, by itself and in
	// the list of sessions.
	Sees(ctx context.Context, who string, id int64) (alone, listed bool, err error)
	// PutMethod is the method label Put's calls have in the metrics.
	PutMethod() string
}

// refusal names what kind of refusal err is, on either API.
func refusal(err error) string {
	if err == nil {
		return "none"
	}
	var (
		code     = codes.Unknown
		ce       *connect.Error
		ee       rpctypes.EtcdError
		canceled *watchCanceled
	)
	switch {
	case errors.As(err, &ce):
		code = codes.Code(ce.Code())
	case errors.As(err, &ee):
		code = ee.Code()
	case errors.As(err, &canceled):
		// etcd's protocol says why a watch is cancelled in words only.
		switch {
		case strings.Contains(canceled.reason, rpctypes.ErrPermissionDenied.Error()):
			code = codes.PermissionDenied
		case strings.Contains(canceled.reason, "too many"):
			code = codes.ResourceExhausted
		}
	default:
		code = status.Code(err) // etcd's Lock and Election answer plain statuses
	}
	switch code {
	case codes.PermissionDenied:
		return "permission denied"
	case codes.ResourceExhausted:
		return "resource exhausted"
	case codes.NotFound:
		return "not found"
	}
	return fmt.Sprintf("other (%v)", err)
}

// watchCanceled is an etcd watch the server cancelled, with its reason.
type watchCanceled struct{ reason string }

func (w *watchCanceled) Error() string { return "watch cancelled: " + w.reason }

func TestEveryRuleHoldsOnBothAPIs(t *testing.T) {
	t.Parallel()
	rules := []struct {
		name string
		run  func(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI)
	}{
		{"parked waits count against the policy's waits", ruleParkedWaitsAreCounted},
		{"sessions count against the policy's sessions", ruleSessionsAreCounted},
		{"an open watch stops when read is revoked", ruleWatchStopsWhenReadIsRevoked},
		{"ownership refusals at apply are audited", ruleOwnershipRefusalsAreAudited},
		{"another principal's sessions are hidden", ruleOthersSessionsAreHidden},
		{"no principal takes every watch slot", ruleNoPrincipalTakesEveryWatch},
		{"every call is in the request metrics", ruleCallsAreCounted},
	}
	apis := []struct {
		name string
		api  func(t *testing.T, n *rulesNode) ruleAPI
	}{
		{"native", newNativeRuleAPI},
		{"etcd", newEtcdRuleAPI},
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			for _, api := range apis {
				t.Run(api.name, func(t *testing.T) {
					n := startRulesNode(t)
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					r.run(t, ctx, n, api.api(t, n))
				})
			}
		})
	}
}

func ruleParkedWaitsAreCounted(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	owner, err := a.OpenSession(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := a.OpenSession(ctx, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"s/j1", "s/j2", "s/j3"}
	for _, name := range names {
		if err := a.Hold(ctx, "owner", name, owner); err != nil {
			t.Fatalf("owner takes %s: %v", name, err)
		}
	}
	// Three waits race for two slots: two park, one is refused.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	ended := make(chan error, len(names))
	for _, name := range names {
		go func() { ended <- a.Wait(waitCtx, "waiter", name, waiter) }()
	}
	select {
	case err := <-ended:
		if refusal(err) != "resource exhausted" {
			t.Fatalf("of three racing waits of a principal with waits: 2, one ended with %v, expected: refused as resource exhausted", err)
		}
	case <-ctx.Done():
		t.Fatal("three waits of a principal with waits: 2 all parked")
	}
	waitFor(t, "waiter's two other waits parked", func() bool { return n.quota.waits.count("waiter") == 2 })
	select {
	case err := <-ended:
		t.Fatalf("one of the two waits within the limit ended: %v", err)
	default:
	}
	stopWaiting()
	waitFor(t, "the waits' slots given back", func() bool { return n.quota.waits.count("waiter") == 0 })
}

func ruleSessionsAreCounted(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	// Eight opens at once: the count and the open are one step, so
	// exactly one wins whichever order they reach the leader in.
	const racers = 8
	errs := make(chan error, racers)
	for range racers {
		go func() {
			_, err := a.OpenSession(ctx, "opener")
			errs <- err
		}()
	}
	opened := 0
	for range racers {
		switch err := <-errs; refusal(err) {
		case "none":
			opened++
		case "resource exhausted":
		default:
			t.Errorf("an open racing seven others: got %v, expected: opened or refused as resource exhausted", err)
		}
	}
	if opened != 1 {
		t.Fatalf("opener, with sessions: 1, opened %d of %d racing sessions", opened, racers)
	}
	if _, err := a.OpenSession(ctx, "opener"); refusal(err) != "resource exhausted" {
		t.Fatalf("opener's session past sessions: 1: got %v, expected: refused as resource exhausted", err)
	}
}

func ruleWatchStopsWhenReadIsRevoked(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	values, ended, err := a.Watch(ctx, "watcher", "w/")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "owner", "w/1", "before"); err == nil {
		t.Fatal("owner wrote w/, which it may not")
	}
	// The node itself writes w/: no principal but the watcher's read
	// is involved.
	if err := n.putAsNode(ctx, "w/1", "before"); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-values:
		if v != "before" {
			t.Fatalf("got %q, expected: before", v)
		}
	case err := <-ended:
		t.Fatalf("the watch ended before the revocation: %v", err)
	case <-ctx.Done():
		t.Fatal("the watch never delivered w/1")
	}
	n.writePolicy(t, "none")
	if err := n.policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := n.putAsNode(ctx, "w/2", "after"); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-values:
		t.Fatalf("the watch delivered %q after watcher lost read", v)
	case err := <-ended:
		if got := refusal(err); got != "permission denied" {
			t.Fatalf("the watch ended with %v (%s), expected: permission denied", err, got)
		}
	case <-ctx.Done():
		t.Fatal("the watch went on after watcher lost read")
	}
}

func ruleOwnershipRefusalsAreAudited(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	id, err := a.OpenSession(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	before := n.logs.String()
	if err := a.PutBound(ctx, "thief", "s/stolen", id); refusal(err) != "permission denied" {
		t.Fatalf("thief binds a key to owner's session: got %v, expected: permission denied", err)
	}
	if err := a.CloseSession(ctx, "thief", id); refusal(err) != "permission denied" {
		t.Fatalf("thief closes owner's session: got %v, expected: permission denied", err)
	}
	lines := strings.Split(strings.TrimPrefix(n.logs.String(), before), "\n")
	denied := 0
	for _, l := range lines {
		if strings.Contains(l, "principal=thief") && strings.Contains(l, "outcome=denied") && strings.Contains(l, fmt.Sprint(id)) {
			denied++
		}
	}
	if denied < 2 {
		t.Fatalf("thief's two refused calls left %d denied audit lines naming session %d; log:\n%s", denied, id, strings.Join(lines, "\n"))
	}
	if _, listed, err := a.Sees(ctx, "owner", id); err != nil || !listed {
		t.Fatalf("owner's session after thief's attempts: listed %v, %v", listed, err)
	}
}

func ruleOthersSessionsAreHidden(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	id, err := a.OpenSession(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	if alone, listed, err := a.Sees(ctx, "owner", id); err != nil || !alone || !listed {
		t.Fatalf("owner sees its own session: alone %v, listed %v, %v", alone, listed, err)
	}
	if alone, listed, err := a.Sees(ctx, "thief", id); err != nil || alone || listed {
		t.Fatalf("thief sees owner's session: alone %v, listed %v, %v; expected: neither", alone, listed, err)
	}
}

func ruleNoPrincipalTakesEveryWatch(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	share := defaultShare(rulesMaxWatches)
	for i := range share {
		if _, _, err := a.Watch(ctx, "hog", "s/"); err != nil {
			t.Fatalf("hog's watch %d of its share of %d: %v", i+1, share, err)
		}
	}
	waitFor(t, "hog's watches open", func() bool { return n.quota.watches.count("hog") == share })
	_, ended, err := a.Watch(ctx, "hog", "s/")
	if err == nil {
		select {
		case err = <-ended:
		case <-ctx.Done():
		}
	}
	if refusal(err) != "resource exhausted" {
		t.Fatalf("hog's watch past half of --max-watches %d: got %v, expected: refused as resource exhausted", rulesMaxWatches, err)
	}
	if _, _, err := a.Watch(ctx, "owner", "s/"); err != nil {
		t.Fatalf("owner's watch beside hog's: %v", err)
	}
}

func ruleCallsAreCounted(t *testing.T, ctx context.Context, n *rulesNode, a ruleAPI) {
	reg := n.cfg.Registry
	count := func(code string) float64 {
		return series(t, reg, "tenure_requests_total", map[string]string{"method": a.PutMethod(), "code": code})
	}
	okBefore, deniedBefore := count("ok"), count("permission_denied")
	if err := a.Put(ctx, "owner", "s/counted", "v"); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "owner", "w/refused", "v"); refusal(err) != "permission denied" {
		t.Fatalf("owner writes w/: got %v, expected: permission denied", err)
	}
	if got := count("ok") - okBefore; got != 1 {
		t.Errorf("tenure_requests_total{method=%q,code=ok} rose by %v, expected: 1", a.PutMethod(), got)
	}
	if got := count("permission_denied") - deniedBefore; got != 1 {
		t.Errorf("tenure_requests_total{method=%q,code=permission_denied} rose by %v, expected: 1", a.PutMethod(), got)
	}
	if got := series(t, reg, "tenure_request_duration_seconds", map[string]string{"method": a.PutMethod()}); got < 2 {
		t.Errorf("tenure_request_duration_seconds{method=%q} counts %v calls, expected: 2", a.PutMethod(), got)
	}
}
