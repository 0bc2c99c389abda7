// Package frontend is the one seam between a Tenure node and the APIs it
// serves: the native API and etcd's v3 API (package etcdapi) both reach
// the node through Node, and nothing else.
//
// Why one seam: the rules that say who may do what, and how much of the
// node a caller may hold, are the product. Written once per API, they
// drift: an outside attack run found that most of the native API's
// fixes had reached one API only (parked waits uncounted, sessions over
// a principal's limit, watches that outlived a revoked read, refusals
// that left no audit line, other principals' sessions shown). So every
// rule an API call meets on its way to the state lives behind Node and
// is written once, in the server; an API only turns its wire messages
// into state machine commands and reads, and the node's errors into its
// wire codes. This is etcd's shape — its v3rpc handlers over RaftKV,
// Lessor and Authenticator — and rqlite's (its HTTP layer over Store).
//
// Errors are the node's, never a wire code: the state machine's own
// (statemachine.ErrNotOwner, ErrSessionNotFound…) and the sentinels
// below, each wrapped with what happened. Each API maps them once, in
// its error table.
package frontend

import (
	"context"
	"errors"
	"time"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// Node is a Tenure node as an API serves it. Every method takes the
// caller from ctx, as the API's authentication put it there, and
// applies the policy in force to it.
type Node interface {
	// Propose applies cmd through the log on the leader, with the
	// caller as its Actor, and returns its result; the error is the
	// command's own (Result.Err) or the node's. A session it opens
	// counts against the caller's sessions in the policy and the
	// node's per-identity limit; a refusal the state machine makes at
	// apply for want of ownership is written to the audit log.
	Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error)
	// Read runs fn on the state: a linearizable read on the leader, or
	// this node's state as it is when serializable. fn must not keep m.
	Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error
	// Sync brings this node's own state up to every write acknowledged
	// before the call, so that a serializable Read after it sees them
	// (a follower learns from the leader how far that is). It gives up,
	// leaving the state as it is, when no leader answers within a bound:
	// a member cut off from its leader serves from its own state.
	Sync(ctx context.Context)
	// Renew renews session id on the leader, as a heartbeat does, and
	// returns its TTL; statemachine.ErrSessionNotFound when it is gone
	// or expired, ErrPermissionDenied when the caller may not renew it.
	Renew(ctx context.Context, id int64) (time.Duration, error)
	// Remaining is how long the leader lets session id live without a
	// renewal; statemachine.ErrSessionNotFound when it is gone, or the
	// caller may not see it.
	Remaining(ctx context.Context, id int64) (time.Duration, error)
	// MaySee reports whether the caller may see session s at all: its
	// own, or any when it reads every namespace. What it may not see
	// it is told does not exist, so that IDs are no oracle.
	MaySee(ctx context.Context, s statemachine.Session) bool
	// Watch follows this node's published events from global revision
	// start on (0: from the next one), those filter accepts (nil: all),
	// as watch.Hub.Watch does. The caller closes it. The events are not
	// checked against the policy: an API checks, with Authorize, that
	// its caller still reads what it is about to send. A key watch is
	// not built on this alone but with package keyfeed, over the Node,
	// which joins the keys' history to these events.
	Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error)
	// Authorize checks that the caller may do verb on the keys in
	// [key, end) (end "" is key alone, "\x00" every key from key on),
	// by the policy in force now; the refusal is audited. A node
	// without a policy allows everything.
	Authorize(ctx context.Context, verb Verb, key, end string) error
	// HoldWait takes one of the caller's and the node's slots for a
	// parked wait (a waiting lock or campaign, an observation), or
	// refuses with ErrLimit naming the limit; release gives it back.
	HoldWait(ctx context.Context) (release func(), err error)
	// HoldWatch is HoldWait for an open watch.
	HoldWatch(ctx context.Context) (release func(), err error)
	// Audit writes one line for the caller's action on target with its
	// outcome (err nil: allowed), when the node keeps an audit log.
	Audit(ctx context.Context, action, target string, err error)
	// Done is closed when the node stops: streams end with it.
	Done() <-chan struct{}
}

// Verb is what a caller does to keys.
type Verb int

const (
	VerbRead Verb = iota + 1
	VerbWrite
)

func (v Verb) String() string {
	switch v {
	case VerbRead:
		return "read"
	case VerbWrite:
		return "write"
	}
	return "verb?"
}

// The node's refusals. Each is wrapped with the reason, which names the
// caller and what it may not do, or the limit it reached.
var (
	// ErrNotLeader: the call needs the leader and this node is not it;
	// the server forwards such calls to the leader. Nothing was done.
	ErrNotLeader = errors.New("not the leader")
	// ErrLeaderChanged: the leader a read ran on stepped down before it
	// could confirm the read.
	ErrLeaderChanged = errors.New("leader changed before the read was confirmed")
	// ErrLeaderFailed: the leader a write was in flight on stepped
	// down; the write may still commit under the next leader, or not.
	ErrLeaderFailed = errors.New("leader stepped down with the write in flight")
	// ErrNoSpace: the node takes no write that adds data (its disk or
	// its storage quota is full); deletes and releases still pass.
	ErrNoSpace = errors.New("no space")
	// ErrStopped: the node is stopping.
	ErrStopped = errors.New("node stopped")
	// ErrUnauthenticated: a policy is in force and the call's
	// credential does not hold (the native API's one word for the two
	// below, which etcd's clients tell apart).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrNoCredentials: a policy is in force and the call carries no
	// credential.
	ErrNoCredentials = errors.New("no credentials")
	// ErrInvalidToken: the call's token does not work, now or any more.
	ErrInvalidToken = errors.New("invalid token")
	// ErrPermissionDenied: the caller may not do this.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrRateLimited: the caller is over its request rate.
	ErrRateLimited = errors.New("rate limited")
	// ErrLimit: the caller or the node holds as many of a thing (waits,
	// watches) as it may.
	ErrLimit = errors.New("limit reached")
)
