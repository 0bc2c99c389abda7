package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

func registerRecipes(gs *grpc.Server, b Backend) {
	v3lockpb.RegisterLockServer(gs, &lockServer{recipes: recipes{b: b}})
	v3electionpb.RegisterElectionServer(gs, &electionServer{recipes: recipes{b: b}})
}

// Errors of etcd's concurrency package, which etcd's Lock and Election
// services return as they are: clients see them as codes.Unknown with
// these texts, and so they do here.
var (
	errSessionExpired    = errors.New("mutex: session is expired")
	errElectionNotLeader = errors.New("election: not leader")
	errElectionNoLeader  = errors.New("election: no leader")
	errMissingLeaderKey  = errors.New(`"leader" field must be provided`)
)

// recipeSessionTTL is the TTL in seconds of the lease a Lock or Campaign
// without one gets: etcd's server runs them on a concurrency.Session,
// which grants a lease of its default TTL and then stops renewing it.
const recipeSessionTTL = 60

// recipes runs etcd's concurrency recipes (client/v3/concurrency's Mutex
// and Election) over the Backend, as etcd's server runs them on a client
// of itself: the same keys (name/<lease in hex>), bound to the lease,
// ordered by create revision, each waiter waiting for the deletion of
// the last key created before its own. A clientv3/concurrency user of
// the same name therefore takes turns with callers of these services.
type recipes struct {
	b Backend
}

// session is the lease a recipe binds its key to: lease, or a new one of
// recipeSessionTTL seconds when lease is 0, as etcd's server does.
func (r recipes) session(ctx context.Context, lease int64) (int64, error) {
	if lease != 0 {
		return lease, nil
	}
	id, _, _, err := grantLease(ctx, r.b, recipeSessionTTL, 0)
	if err != nil {
		return 0, r.fail(err)
	}
	return id, nil
}

// recipeKey is the key of lease in the recipe of prefix pfx.
func recipeKey(pfx string, lease int64) string { return fmt.Sprintf("%s%x", pfx, lease) }

// recipeRangeEnd is the end of the range of keys with prefix pfx, as
// clientv3.GetPrefixRangeEnd computes it; "\x00" (every key from pfx on)
// when no such end exists.
func recipeRangeEnd(pfx string) string {
	end := []byte(pfx)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return string(end[:i+1])
		}
	}
	return "\x00"
}

func inRecipeRange(k, key, end string) bool {
	return k >= key && (end == "\x00" || k < end)
}

// txn proposes t and returns its result and the KV revision after it.
func (r recipes) txn(ctx context.Context, t statemachine.Txn) (*statemachine.TxnResponse, int64, error) {
	res, err := r.b.Propose(ctx, t)
	if err != nil {
		return nil, 0, r.fail(err)
	}
	return res.Txn, res.KVRevision, nil
}

// authorize runs the Backend's check of each verb on its keys, as
// etcd's auth store checks each compare and operation of a Txn.
func (r recipes) authorize(ctx context.Context, checks ...recipeCheck) error {
	for _, c := range checks {
		if err := r.b.Authorize(ctx, c.verb, c.key, c.end); err != nil {
			return r.fail(err)
		}
	}
	return nil
}

type recipeCheck struct {
	verb     Verb
	key, end string
}

// holdWait takes a slot of the caller's and the node's parked waits for
// a call that may wait (Lock, Campaign, Observe), before it changes
// anything, as a native Acquire that may wait takes one: a call refused
// here joins no queue. The caller releases it when the call ends.
func (r recipes) holdWait(ctx context.Context) (release func(), err error) {
	release, err = r.b.HoldWait(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	return release, nil
}

// untilStopped is ctx, also cancelled when the node stops, for the
// recipes' waits. The caller calls the CancelFunc when done.
func (r recipes) untilStopped(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-r.b.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// fail is the error a recipe answers for err as etcd's server answers
// it. There the recipes run on a client of the server, whose errors are
// plain errors by the time the handler returns them: gRPC sends them as
// codes.Unknown with etcd's text ("etcdserver: requested lease not
// found", "etcdserver: no leader"), and a caller's cancelled or expired
// context as its own code. Once the node stops, etcd's "server
// stopped", so that clients go elsewhere. The answer still wraps err,
// so that the server tells a follower's "no leader" (ErrNotLeader),
// which it forwards, from the recipe's own answers.
func (r recipes) fail(err error) error {
	select {
	case <-r.b.Done():
		return rpctypes.ErrGRPCStopped
	default:
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return &statusError{st: status.New(codes.Unknown, status.Convert(toGRPC(err)).Message()), cause: err}
}

// firstCreate reads the key of prefix range [pfx, end) with the lowest
// create revision, at most maxCreate when maxCreate > 0, or the highest
// when last is set; nil when there is none. It returns the KV revision
// and the global revision of the read: a watch of the hub from that
// global revision plus one misses no later change.
func (r recipes) firstCreate(ctx context.Context, pfx, end string, last bool, maxCreate int64) (kv *statemachine.KeyValue, rev, global int64, err error) {
	err = r.b.Read(ctx, false, func(m *statemachine.Machine) error {
		rev, global = m.KVRevision(), m.Revision()
		return m.RangeKeys(pfx, end, 0, func(k statemachine.KeyValue) bool {
			if maxCreate > 0 && k.CreateRevision > maxCreate {
				return true
			}
			if kv == nil || last && k.CreateRevision > kv.CreateRevision || !last && k.CreateRevision < kv.CreateRevision {
				kv = &k
			}
			return true
		})
	})
	if err != nil {
		return nil, 0, 0, r.fail(err)
	}
	return kv, rev, global, nil
}

// waitDeletes waits until no key of prefix pfx was created at or before
// KV revision maxCreate, as concurrency's waitDeletes does: it waits for
// the deletion of the last of them, then looks again. It returns the KV
// revision at which none was left.
func (r recipes) waitDeletes(ctx context.Context, pfx string, maxCreate int64) (int64, error) {
	end := recipeRangeEnd(pfx)
	for {
		kv, rev, global, err := r.firstCreate(ctx, pfx, end, true, maxCreate)
		if err != nil {
			return 0, err
		}
		if kv == nil {
			return rev, nil
		}
		key := kv.Key
		if err := r.waitKeyEvent(ctx, global, key, func(e *statemachine.Event) bool {
			return e.Type == statemachine.EventKeyDeleted && e.KV != nil && e.KV.Key == key
		}); err != nil {
			return 0, err
		}
	}
}

// waitKeyEvent waits for an event of key that filter accepts after
// global revision global. It also returns, with no error, when the hub
// can no longer tell (the watcher lagged, or the history was reset): the
// caller reads the state again either way. The hub watcher is keyed
// (watch.Watcher.WantKey): a lock's waiters, one a key, cost the writes
// of other keys nothing while they wait.
func (r recipes) waitKeyEvent(ctx context.Context, global int64, key string, filter func(*statemachine.Event) bool) error {
	w, err := r.b.Watch(global+1, filter)
	if errors.Is(err, watch.ErrCompacted) {
		return nil
	}
	if err != nil {
		return r.fail(err)
	}
	defer w.Close()
	w.WantKey(watch.KVKey(key))
	_, err = w.Next(ctx)
	if err != nil && !errors.Is(err, watch.ErrLagged) {
		return r.fail(err)
	}
	return nil
}

// cleanup runs a recipe's clean-up after its caller gave up: on a
// context of its own, since the caller's is done.
func (r recipes) cleanup(ctx context.Context, t statemachine.Txn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = r.b.Propose(ctx, t)
}

// deleteKey is a DeleteRange of key alone.
func deleteKey(key string) statemachine.Txn {
	return statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpDelete, Key: key}}}
}

// lockServer serves etcd's v3lock service: concurrency.Mutex, run on
// the server.
type lockServer struct {
	v3lockpb.UnimplementedLockServer
	recipes
}

// Lock takes the lock of name for the lease and returns its key, owned
// by the lease: it holds the lock until Unlock deletes that key or the
// lease ends. It waits, in create-revision order, for every earlier
// contender, until ctx ends; a Lock that gives up deletes its key.
func (ls *lockServer) Lock(ctx context.Context, req *v3lockpb.LockRequest) (*v3lockpb.LockResponse, error) {
	ctx, cancel := ls.untilStopped(ctx)
	defer cancel()
	release, err := ls.holdWait(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	pfx := string(req.Name) + "/"
	end := recipeRangeEnd(pfx)
	lease, err := ls.session(ctx, req.Lease)
	if err != nil {
		return nil, err
	}
	myKey := recipeKey(pfx, lease)
	if err := ls.authorize(ctx,
		recipeCheck{VerbRead, myKey, ""}, recipeCheck{VerbWrite, myKey, ""}, recipeCheck{VerbRead, pfx, end},
	); err != nil {
		return nil, err
	}
	// concurrency.Mutex.tryAcquire: join the waiters (or find the key
	// this lease already put there) and read the owner in one Txn.
	resp, rev, err := ls.txn(ctx, statemachine.Txn{
		Compares: []statemachine.TxnCompare{{Key: myKey, Target: statemachine.TargetCreate, Op: statemachine.CmpEqual, Number: 0}},
		Success: []statemachine.TxnOp{
			{Type: statemachine.OpPut, Key: myKey, Lease: lease},
			{Type: statemachine.OpRange, Key: pfx, End: end},
		},
		Failure: []statemachine.TxnOp{
			{Type: statemachine.OpRange, Key: myKey},
			{Type: statemachine.OpRange, Key: pfx, End: end},
		},
	})
	if err != nil {
		return nil, err
	}
	myRev := rev
	if !resp.Succeeded {
		myRev = resp.Ops[0].KVs[0].CreateRevision
	}
	if owner := oldest(resp.Ops[1].KVs); owner == nil || owner.CreateRevision == myRev {
		return &v3lockpb.LockResponse{Header: header(ls.b, rev), Key: []byte(myKey)}, nil
	}
	if _, err := ls.waitDeletes(ctx, pfx, myRev-1); err != nil {
		ls.cleanup(ctx, deleteKey(myKey))
		return nil, err
	}
	// The lease may have ended while waiting, taking the key with it.
	kv, rev, _, err := ls.firstCreate(ctx, myKey, "", false, 0)
	if err != nil {
		ls.cleanup(ctx, deleteKey(myKey))
		return nil, err
	}
	if kv == nil {
		return nil, ls.fail(errSessionExpired)
	}
	return &v3lockpb.LockResponse{Header: header(ls.b, rev), Key: []byte(myKey)}, nil
}

// oldest is the key of kvs with the lowest create revision.
func oldest(kvs []statemachine.KeyValue) *statemachine.KeyValue {
	var first *statemachine.KeyValue
	for i := range kvs {
		if first == nil || kvs[i].CreateRevision < first.CreateRevision {
			first = &kvs[i]
		}
	}
	return first
}

// Unlock deletes the lock's key, whoever holds it, as etcd does.
func (ls *lockServer) Unlock(ctx context.Context, req *v3lockpb.UnlockRequest) (*v3lockpb.UnlockResponse, error) {
	key := string(req.Key)
	if err := ls.authorize(ctx, recipeCheck{VerbWrite, key, ""}); err != nil {
		return nil, err
	}
	_, rev, err := ls.txn(ctx, deleteKey(key))
	if err != nil {
		return nil, err
	}
	return &v3lockpb.UnlockResponse{Header: header(ls.b, rev)}, nil
}
