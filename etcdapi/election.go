package etcdapi

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// electionServer serves etcd's v3election service: concurrency.Election,
// run on the server. The leader of name is the key of prefix name/ with
// the lowest create revision; its value is what the leader proclaims.
type electionServer struct {
	v3electionpb.UnimplementedElectionServer
	recipes
}

// Campaign puts the lease's key under name and waits, in create-revision
// order, until every earlier candidate's key is gone: it returns once the
// caller leads, or with ctx's error, resigning the candidacy then. A
// lease already campaigning keeps its place and proclaims the new value.
// The header is the one of the Txn that entered the campaign, as etcd's.
func (es *electionServer) Campaign(ctx context.Context, req *v3electionpb.CampaignRequest) (*v3electionpb.CampaignResponse, error) {
	ctx, cancel := es.untilStopped(ctx)
	defer cancel()
	release, err := es.holdWait(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	pfx := string(req.Name) + "/"
	end := recipeRangeEnd(pfx)
	lease, err := es.session(ctx, req.Lease)
	if err != nil {
		return nil, err
	}
	key, val := recipeKey(pfx, lease), string(req.Value)
	if err := es.authorize(ctx,
		recipeCheck{VerbRead, key, ""}, recipeCheck{VerbWrite, key, ""}, recipeCheck{VerbRead, pfx, end},
	); err != nil {
		return nil, err
	}
	resp, rev, err := es.txn(ctx, statemachine.Txn{
		Compares: []statemachine.TxnCompare{{Key: key, Target: statemachine.TargetCreate, Op: statemachine.CmpEqual, Number: 0}},
		Success:  []statemachine.TxnOp{{Type: statemachine.OpPut, Key: key, Value: val, Lease: lease}},
		Failure:  []statemachine.TxnOp{{Type: statemachine.OpRange, Key: key}},
	})
	if err != nil {
		return nil, err
	}
	leaderRev := rev
	if !resp.Succeeded {
		kv := resp.Ops[0].KVs[0]
		leaderRev = kv.CreateRevision
		if kv.Value != val {
			if _, err := es.proclaim(ctx, key, leaderRev, lease, val); err != nil {
				es.cleanup(ctx, resignTxn(key, leaderRev))
				return nil, err
			}
		}
	}
	if _, err := es.waitDeletes(ctx, pfx, leaderRev-1); err != nil {
		if ctx.Err() != nil {
			es.cleanup(ctx, resignTxn(key, leaderRev))
		}
		return nil, err
	}
	return &v3electionpb.CampaignResponse{
		Header: header(es.b, rev),
		Leader: &v3electionpb.LeaderKey{Name: req.Name, Key: []byte(key), Rev: leaderRev, Lease: lease},
	}, nil
}

// Proclaim sets the leader's value, if the leader key still is the one
// created at its revision: "election: not leader" otherwise. A leader
// key with lease 0 gets a new lease, as etcd's server gives it one.
func (es *electionServer) Proclaim(ctx context.Context, req *v3electionpb.ProclaimRequest) (*v3electionpb.ProclaimResponse, error) {
	if req.Leader == nil {
		return nil, es.fail(errMissingLeaderKey)
	}
	key := string(req.Leader.Key)
	if err := es.authorize(ctx, recipeCheck{VerbRead, key, ""}, recipeCheck{VerbWrite, key, ""}); err != nil {
		return nil, err
	}
	lease, err := es.session(ctx, req.Leader.Lease)
	if err != nil {
		return nil, err
	}
	rev, err := es.proclaim(ctx, key, req.Leader.Rev, lease, string(req.Value))
	if err != nil {
		return nil, err
	}
	return &v3electionpb.ProclaimResponse{Header: header(es.b, rev)}, nil
}

func (es *electionServer) proclaim(ctx context.Context, key string, leaderRev, lease int64, val string) (int64, error) {
	resp, rev, err := es.txn(ctx, statemachine.Txn{
		Compares: []statemachine.TxnCompare{{Key: key, Target: statemachine.TargetCreate, Op: statemachine.CmpEqual, Number: leaderRev}},
		Success:  []statemachine.TxnOp{{Type: statemachine.OpPut, Key: key, Value: val, Lease: lease}},
	})
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, es.fail(errElectionNotLeader)
	}
	return rev, nil
}

// resignTxn deletes the leader key if it still is the one created at
// leaderRev.
func resignTxn(key string, leaderRev int64) statemachine.Txn {
	return statemachine.Txn{
		Compares: []statemachine.TxnCompare{{Key: key, Target: statemachine.TargetCreate, Op: statemachine.CmpEqual, Number: leaderRev}},
		Success:  []statemachine.TxnOp{{Type: statemachine.OpDelete, Key: key}},
	}
}

// Resign deletes the leader key if it still is the one created at its
// revision, and succeeds either way, as etcd's does. (etcd's server
// also grants a lease for a leader key with lease 0, which Resign never
// uses; this one does not.)
func (es *electionServer) Resign(ctx context.Context, req *v3electionpb.ResignRequest) (*v3electionpb.ResignResponse, error) {
	if req.Leader == nil {
		return nil, es.fail(errMissingLeaderKey)
	}
	key := string(req.Leader.Key)
	if err := es.authorize(ctx, recipeCheck{VerbRead, key, ""}, recipeCheck{VerbWrite, key, ""}); err != nil {
		return nil, err
	}
	_, rev, err := es.txn(ctx, resignTxn(key, req.Leader.Rev))
	if err != nil {
		return nil, err
	}
	return &v3electionpb.ResignResponse{Header: header(es.b, rev)}, nil
}

// Leader returns the leader's key: "election: no leader" when there is
// none.
func (es *electionServer) Leader(ctx context.Context, req *v3electionpb.LeaderRequest) (*v3electionpb.LeaderResponse, error) {
	pfx := string(req.Name) + "/"
	end := recipeRangeEnd(pfx)
	if err := es.authorize(ctx, recipeCheck{VerbRead, pfx, end}); err != nil {
		return nil, err
	}
	kv, rev, _, err := es.firstCreate(ctx, pfx, end, false, 0)
	if err != nil {
		return nil, err
	}
	if kv == nil {
		return nil, es.fail(errElectionNoLeader)
	}
	return &v3electionpb.LeaderResponse{Header: header(es.b, rev), Kv: recipeKV(kv)}, nil
}

// Observe streams the leader's key as concurrency.Election.Observe
// does: the current leader (or, with none, the first key put under the
// name), then each new value it proclaims, then, once its key is
// deleted, the next leader. It ends with the client's context or the
// node's stop.
func (es *electionServer) Observe(req *v3electionpb.LeaderRequest, stream v3electionpb.Election_ObserveServer) error {
	ctx, cancel := es.untilStopped(stream.Context())
	defer cancel()
	release, err := es.holdWait(ctx)
	if err != nil {
		return err
	}
	defer release()
	pfx := string(req.Name) + "/"
	end := recipeRangeEnd(pfx)
	if err := es.authorize(ctx, recipeCheck{VerbRead, pfx, end}); err != nil {
		return err
	}
	for {
		kv, rev, global, err := es.firstCreate(ctx, pfx, end, false, 0)
		if err != nil {
			return err
		}
		if err := es.observeTerm(ctx, stream, pfx, end, kv, rev, global); err != nil {
			return err
		}
	}
}

// observeTerm follows one leader, kv as read at KV revision rev and
// global revision global (nil: wait for the first put under the name),
// until its key is deleted. It returns nil for the caller to read the
// leader again, also when the hub can no longer tell what happened.
func (es *electionServer) observeTerm(ctx context.Context, stream v3electionpb.Election_ObserveServer, pfx, end string, kv *statemachine.KeyValue, rev, global int64) error {
	w, err := es.b.Watch(global+1, func(e *statemachine.Event) bool {
		return (e.Type == statemachine.EventKeyPut || e.Type == statemachine.EventKeyDeleted) &&
			e.KV != nil && inRecipeRange(e.KV.Key, pfx, end)
	})
	if errors.Is(err, watch.ErrCompacted) {
		return nil
	}
	if err != nil {
		return es.fail(err)
	}
	defer w.Close()
	for kv == nil {
		e, err := w.Next(ctx)
		if errors.Is(err, watch.ErrLagged) {
			return nil
		}
		if err != nil {
			return es.fail(err)
		}
		if e.Type == statemachine.EventKeyPut {
			kv, rev = e.KV, e.KV.ModRevision
		}
	}
	// The caller's credentials are checked for as long as it observes,
	// before each message: a revoked one ends the stream.
	send := func(kv *statemachine.KeyValue, rev int64) error {
		if err := es.authorize(ctx, recipeCheck{VerbRead, pfx, end}); err != nil {
			return err
		}
		return stream.Send(&v3electionpb.LeaderResponse{Header: header(es.b, rev), Kv: recipeKV(kv)})
	}
	if err := send(kv, rev); err != nil {
		return err
	}
	for {
		e, err := w.Next(ctx)
		if errors.Is(err, watch.ErrLagged) {
			return nil
		}
		if err != nil {
			return es.fail(err)
		}
		if e.KV.Key != kv.Key {
			continue
		}
		if e.Type == statemachine.EventKeyDeleted {
			return nil
		}
		if err := send(e.KV, e.KV.ModRevision); err != nil {
			return err
		}
	}
}

// recipeKV is kv as etcd's messages carry it.
func recipeKV(kv *statemachine.KeyValue) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{
		Key:            []byte(kv.Key),
		CreateRevision: kv.CreateRevision,
		ModRevision:    kv.ModRevision,
		Version:        kv.Version,
		Value:          []byte(kv.Value),
		Lease:          kv.EtcdLease(),
	}
}
