package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/lessor"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// frontNode is the node as every API sees it (frontend.Node): each rule
// of who may do what and how much of the node a caller may hold is
// written here once, and the native and etcd APIs both go through it.
// Its errors are the node's: the state machine's own, and frontend's
// sentinels for the rest (nodeError).
type frontNode struct{ s *Server }

var _ frontend.Node = frontNode{}

// Propose proposes cmd for the caller (Server.propose: its actor, its
// sessions quota) and writes a refusal the state machine makes at apply
// for want of ownership to the audit log: the edge let such a command
// through as a fast path, so only its outcome says it was refused.
func (f frontNode) Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	res, err := f.s.propose(ctx, cmd)
	if refusedAtApply(err) {
		f.Audit(ctx, actionOf(ctx, cmd), commandTarget(cmd), err)
	}
	return res, proposeError(err)
}

func (f frontNode) Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error {
	return nodeError(f.s.read(ctx, serializable, fn))
}

func (f frontNode) Sync(ctx context.Context) { f.s.syncLocal(ctx) }

// syncWait bounds how long syncLocal waits for the leader to say how far
// the log is committed: about an election, as a forwarded call waits.
const syncWait = leaderWait

// syncLocal brings this node's own state up to every write acknowledged
// before the call, for a read that is served here but must not miss one
// (a watch from a revision, whose history the leader may have compacted
// a moment ago). A promoted leader has applied all of them already; a
// follower asks the leader (raftnode.Node.Sync). When no leader answers
// within syncWait the state stays as it is, and the caller serves from
// it, as an etcd member cut off from its leader serves watches.
func (s *Server) syncLocal(ctx context.Context) {
	if s.leading.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, syncWait)
	defer cancel()
	if err := s.node.Sync(ctx); err != nil {
		s.log.Debug("serving from this node's state, not brought up to the leader's", "err", err)
	}
}

// Renew is the one heartbeat of both APIs: the caller must own the
// session (ownHeartbeat, audited when it does not), and a session this
// leader does not know is answered as gone without renewing an ID that
// may become somebody else's session a moment later.
func (f frontNode) Renew(ctx context.Context, id int64) (time.Duration, error) {
	s := f.s
	known, err := s.ownHeartbeat(ctx, id)
	if err != nil {
		f.Audit(ctx, actionOf(ctx, nil), fmt.Sprintf("session %d", id), err)
		return 0, s.refusal(ctx, err)
	}
	if !known {
		if !s.lessor.Leading(id) {
			return 0, nodeError(s.notLeader())
		}
		return 0, fmt.Errorf("%w: %d", statemachine.ErrSessionNotFound, id)
	}
	ttl, err := s.lessor.Heartbeat(id)
	if errors.Is(err, lessor.ErrSessionExpired) {
		return 0, fmt.Errorf("%w: %d expired", statemachine.ErrSessionNotFound, id)
	}
	return ttl, nodeError(err)
}

func (f frontNode) Remaining(ctx context.Context, id int64) (time.Duration, error) {
	s := f.s
	if !s.leading.Load() {
		return 0, nodeError(s.notLeader())
	}
	left, ok := s.lessor.Remaining(id)
	if !ok {
		if !s.lessor.Leading(id) {
			return 0, nodeError(s.notLeader())
		}
		return 0, fmt.Errorf("%w: %d", statemachine.ErrSessionNotFound, id)
	}
	return left, nil
}

// MaySee: a principal sees its own sessions, and every session when it
// reads every namespace (the native API's showSession, before it trims
// what a session holds to what the caller reads).
func (f frontNode) MaySee(ctx context.Context, sess statemachine.Session) bool {
	if !f.s.policyOn() {
		return true
	}
	g, err := f.s.grants(ctx, false)
	if err != nil {
		return false
	}
	return g == nil || g.Identity(sess.Identity) || g.AllNamespaces(auth.Read)
}

func (f frontNode) Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error) {
	return f.s.hub.Watch(start, filter)
}

// Authorize checks a key range against the policy in force: one rule
// must cover the range (auth.Grants.KeyRange).
func (f frontNode) Authorize(ctx context.Context, verb frontend.Verb, key, end string) error {
	s := f.s
	if !s.policyOn() {
		return nil
	}
	target := keyRangeName(key, end)
	g, err := s.grants(ctx, false)
	if err != nil {
		f.Audit(ctx, actionOf(ctx, nil), target, err)
		return s.refusal(ctx, err)
	}
	if g == nil {
		return nil
	}
	var v auth.Verb
	switch verb {
	case frontend.VerbRead:
		v = auth.Read
	case frontend.VerbWrite:
		v = auth.Write
	default:
		err = deny("verb %d has no rule", verb)
	}
	if err == nil && !g.KeyRange(v, key, end) {
		err = deny("%s may not %s %s", g.Principal, v, target)
	}
	if err != nil {
		f.Audit(ctx, actionOf(ctx, nil), target, err)
		return s.refusal(ctx, err)
	}
	return nil
}

func (f frontNode) HoldWait(ctx context.Context) (func(), error)  { return f.s.holdWait(ctx) }
func (f frontNode) HoldWatch(ctx context.Context) (func(), error) { return f.s.holdWatch(ctx) }

func (f frontNode) Audit(ctx context.Context, action, target string, err error) {
	f.s.audit(ctx, action, target, "", err)
}

func (f frontNode) Done() <-chan struct{} { return f.s.stopC }

// nodeError turns what raft, the lessor and the server answer into the
// node's errors (frontend's sentinels, wrapping the cause); the state
// machine's own pass as they are.
func nodeError(err error) error {
	var nl *notLeaderError
	var raftNL *raftnode.NotLeaderError
	switch {
	case err == nil, isNodeError(err):
		return err
	case errors.As(err, &nl):
		return fmt.Errorf("%w: %w", frontend.ErrNotLeader, err)
	case errors.As(err, &raftNL):
		// Raft's own, from a call the server makes of the engine
		// directly (membership).
		return fmt.Errorf("%w: %w", frontend.ErrNotLeader, raftNotLeader{raftNL})
	case errors.Is(err, raftnode.ErrNotLeader), errors.Is(err, lessor.ErrNotLeader):
		return fmt.Errorf("%w: %w", frontend.ErrNotLeader, err)
	case errors.Is(err, raftnode.ErrLeadershipLost):
		return fmt.Errorf("%w: %w", frontend.ErrLeaderChanged, err)
	case errors.Is(err, raftnode.ErrDiskFull):
		return fmt.Errorf("%w: %w", frontend.ErrNoSpace, err)
	case errors.Is(err, raftnode.ErrClosed):
		return fmt.Errorf("%w: %w", frontend.ErrStopped, err)
	}
	return err
}

// isNodeError reports whether err is already the node's: one of
// frontend's sentinels wraps it.
func isNodeError(err error) bool {
	for _, sentinel := range nodeSentinels {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// nodeSentinels are the sentinels nodeError wraps errors in.
var nodeSentinels = []error{frontend.ErrNotLeader, frontend.ErrLeaderChanged, frontend.ErrLeaderFailed, frontend.ErrNoSpace, frontend.ErrStopped}

// raftNotLeader is raft's not-leader error in the words a client reads.
type raftNotLeader struct{ *raftnode.NotLeaderError }

func (e raftNotLeader) Error() string {
	if e.Leader == "" {
		return "not leader: no leader is known yet; retry shortly"
	}
	return "not leader: the leader's peer address is " + e.Leader
}

func (e raftNotLeader) Unwrap() error { return e.NotLeaderError }

// proposeError is nodeError for a proposal: one in flight when its
// leader stepped down may still commit, which is not a read's "leader
// changed".
func proposeError(err error) error {
	if errors.Is(err, raftnode.ErrLeadershipLost) {
		return fmt.Errorf("%w: %w", frontend.ErrLeaderFailed, err)
	}
	return nodeError(err)
}

// refusal is the node's error for a caller refused by the policy, why:
// frontend's sentinel for what went wrong, which each API answers in
// its own words (etcd's "user name is empty" and "invalid auth token"
// make its clients log in again).
func (s *Server) refusal(ctx context.Context, why error) error {
	c, ok := callerOf(ctx)
	switch {
	case errors.Is(why, errRateLimited), errors.Is(why, errPermissionDenied), errors.Is(why, statemachine.ErrNotOwner):
		return why
	case !ok, errors.Is(c.Err, auth.ErrNoCredentials):
		return fmt.Errorf("%w: %w", frontend.ErrNoCredentials, why)
	case errors.Is(c.Err, auth.ErrInvalidToken), c.Err == nil && (c.By == auth.ByToken || c.By == auth.ByEtcdToken):
		return fmt.Errorf("%w: %w", frontend.ErrInvalidToken, why)
	}
	return fmt.Errorf("%w: %w", frontend.ErrPermissionDenied, why)
}

// actionOf names the call of ctx for the audit log: its procedure or
// gRPC method, or else the command it proposes.
func actionOf(ctx context.Context, cmd statemachine.Command) string {
	if a, ok := frontend.ActionOf(ctx); ok {
		return a
	}
	if m, ok := grpc.Method(ctx); ok {
		return m
	}
	if cmd != nil {
		return fmt.Sprintf("%T", cmd)
	}
	return "(unknown call)"
}

// commandTarget names what cmd acts on, for the audit log.
func commandTarget(cmd statemachine.Command) string {
	switch c := cmd.(type) {
	case statemachine.CloseSession:
		return fmt.Sprintf("session %d", c.SessionID)
	case statemachine.Put:
		if c.SessionID != 0 {
			return fmt.Sprintf("key %q bound to session %d", c.Key, c.SessionID)
		}
		return fmt.Sprintf("key %q", c.Key)
	case statemachine.Txn:
		return txnTarget(c)
	case statemachine.Acquire:
		return fmt.Sprintf("%s for session %d", c.Lease, c.SessionID)
	case statemachine.SetValue:
		return c.Lease.String()
	case statemachine.Release:
		return c.Lease.String()
	case statemachine.Revoke:
		return c.Lease.String()
	}
	return fmt.Sprintf("%T", cmd)
}

// txnTarget names the first put of t bound to a session, which is what
// an ownership refusal of a Txn is about.
func txnTarget(t statemachine.Txn) string {
	for _, ops := range [][]statemachine.TxnOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.Type == statemachine.OpPut && op.Lease != 0 {
				return fmt.Sprintf("key %q bound to lease %d", op.Key, op.Lease)
			}
			if op.Type == statemachine.OpTxn && op.Txn != nil {
				if s := txnTarget(*op.Txn); s != "a transaction" {
					return s
				}
			}
		}
	}
	return "a transaction"
}

// keyRangeName names [key, end) for messages and the audit log.
func keyRangeName(key, end string) string {
	switch {
	case end == "":
		return fmt.Sprintf("key %q", key)
	case end == "\x00" && key == "\x00":
		return "every key"
	case end == "\x00":
		return fmt.Sprintf("every key from %q on", key)
	}
	return fmt.Sprintf("the keys in [%q, %q)", key, end)
}
