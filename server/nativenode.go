package server

import (
	"context"
	"time"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// nativeNode is the node as the native API sees it (nativeapi.Backend):
// the seam every API shares, frontNode, and what only the native API
// asks for — parked acquires, grant watches, the policy's check of its
// messages for the calls it runs without Connect's interceptors.
type nativeNode struct{ frontNode }

var _ nativeapi.Backend = nativeNode{}

// Acquire parks a waiting acquire with the server's waiters, and audits
// a refusal at apply as Propose does: an Acquire naming another's
// session passed the edge's fast path.
func (n nativeNode) Acquire(ctx context.Context, cmd statemachine.Acquire, timeout time.Duration) (int64, *statemachine.Lease, error) {
	got, err := n.s.waiters.acquire(ctx, cmd, timeout)
	if refusedAtApply(err) {
		n.Audit(ctx, actionOf(ctx, cmd), commandTarget(cmd), err)
	}
	return got.token, got.lease, proposeError(err)
}

func (n nativeNode) GrantWatchStart(ctx context.Context, id statemachine.LeaseID, token, start int64) (*statemachine.Event, int64, error) {
	ended, from, err := n.s.grantWatchStart(ctx, id, token, start)
	return ended, from, nodeError(err)
}

func (n nativeNode) LastHeartbeat(id int64) time.Time { return n.s.lessor.LastHeartbeat(id) }

func (n nativeNode) RecipeTimes(l statemachine.RecipeLock) (int64, []int64) {
	return n.s.recipes.times(l)
}

func (n nativeNode) KubernetesPrefix() string { return n.s.cfg.KubernetesPrefix }

func (n nativeNode) MayRead(ctx context.Context, key string) bool { return n.s.mayRead(ctx, key) }

func (n nativeNode) Readable(ctx context.Context, reads func(*auth.Grants) bool) func(*statemachine.Event) (bool, error) {
	return n.s.readable(ctx, reads)
}

// Check is authInterceptor's check, for a pipelined operation or an
// NDJSON watch: the refusal is audited with the code first
// ("permission_denied: ..."), as every other path writes it.
func (n nativeNode) Check(ctx context.Context, procedure string, msg any) error {
	if !n.s.policyOn() {
		return nil
	}
	if _, err := n.s.check(ctx, msg); err != nil {
		err = toConnect(err)
		n.s.record(ctx, procedure, msg, "", err)
		return err
	}
	return nil
}

// Admit checks that the caller is still somebody the policy knows, with
// a credential that holds: a pipeline lives as long as its client, and
// a token that expired or left the policy, or a certificate past its
// NotAfter, must stop working on it as on a unary call.
func (n nativeNode) Admit(ctx context.Context, procedure string) error {
	if !n.s.policyOn() {
		return nil
	}
	if _, err := n.s.grants(ctx, false); err != nil {
		err = toConnect(err)
		n.s.record(ctx, procedure, nil, "", err)
		return err
	}
	return nil
}

func (n nativeNode) Observe(procedure string, start time.Time, err error) {
	(&metricsInterceptor{n.s.metrics}).observe(procedure, start, err)
}

// Serving: only the promoted leader serves pipelines (a follower would
// forward every message), and not once it is closing.
func (n nativeNode) Serving() error {
	switch {
	case n.s.closing.Load():
		return nativeapi.ErrStopping
	case !n.s.leading.Load():
		return nodeError(n.s.notLeader())
	}
	return nil
}

// toConnect is the native API's error table over the node's errors,
// for the server's own Connect handlers and interceptors.
func toConnect(err error) error { return nativeapi.ToConnect(nodeError(err)) }

// invalid is a request validation failure, in the native API's words.
func invalid(format string, args ...any) error { return nativeapi.Invalid(format, args...) }
