package etcdapi

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/tenurehq/tenure/statemachine"
)

// A Txn: the state machine's command made of etcd's request, and etcd's
// answer made of its result.

var cmpOps = map[pb.Compare_CompareResult]statemachine.CmpOp{
	pb.Compare_EQUAL:     statemachine.CmpEqual,
	pb.Compare_GREATER:   statemachine.CmpGreater,
	pb.Compare_LESS:      statemachine.CmpLess,
	pb.Compare_NOT_EQUAL: statemachine.CmpNotEqual,
}

var cmpTargets = map[pb.Compare_CompareTarget]statemachine.TxnTarget{
	pb.Compare_VERSION: statemachine.TargetVersion,
	pb.Compare_CREATE:  statemachine.TargetCreate,
	pb.Compare_MOD:     statemachine.TargetMod,
	pb.Compare_VALUE:   statemachine.TargetValue,
	pb.Compare_LEASE:   statemachine.TargetLease,
}

// txnOf converts a checked TxnRequest. A compare's operand is the one of
// its target; another one set in its place counts as zero, as in etcd.
func txnOf(r *pb.TxnRequest) statemachine.Txn {
	t := statemachine.Txn{
		Compares: make([]statemachine.TxnCompare, 0, len(r.Compare)),
		Success:  opsOf(r.Success),
		Failure:  opsOf(r.Failure),
	}
	for _, c := range r.Compare {
		tc := statemachine.TxnCompare{
			Key: string(c.Key), End: string(c.RangeEnd),
			Target: cmpTargets[c.Target], Op: cmpOps[c.Result],
		}
		switch c.Target {
		case pb.Compare_VERSION:
			tc.Number = c.GetVersion()
		case pb.Compare_CREATE:
			tc.Number = c.GetCreateRevision()
		case pb.Compare_MOD:
			tc.Number = c.GetModRevision()
		case pb.Compare_LEASE:
			tc.Number = c.GetLease()
		case pb.Compare_VALUE:
			tc.Value = string(c.GetValue())
		}
		t.Compares = append(t.Compares, tc)
	}
	return t
}

func opsOf(ops []*pb.RequestOp) []statemachine.TxnOp {
	out := make([]statemachine.TxnOp, 0, len(ops))
	for _, op := range ops {
		switch u := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			out = append(out, statemachine.TxnOp{
				Type: statemachine.OpRange, Key: string(u.RequestRange.Key),
				End: string(u.RequestRange.RangeEnd), Revision: u.RequestRange.Revision,
			})
		case *pb.RequestOp_RequestPut:
			out = append(out, putOp(u.RequestPut))
		case *pb.RequestOp_RequestDeleteRange:
			out = append(out, deleteOp(u.RequestDeleteRange))
		case *pb.RequestOp_RequestTxn:
			t := txnOf(u.RequestTxn)
			out = append(out, statemachine.TxnOp{Type: statemachine.OpTxn, Txn: &t})
		}
	}
	return out
}

func putOp(r *pb.PutRequest) statemachine.TxnOp {
	return statemachine.TxnOp{
		Type: statemachine.OpPut, Key: string(r.Key), Value: string(r.Value), Lease: r.Lease,
		IgnoreValue: r.IgnoreValue, IgnoreLease: r.IgnoreLease,
	}
}

func deleteOp(r *pb.DeleteRangeRequest) statemachine.TxnOp {
	return statemachine.TxnOp{Type: statemachine.OpDelete, Key: string(r.Key), End: string(r.RangeEnd)}
}

// deleteResponse answers a DeleteRange; its prev_kvs count against
// budget, and are left out once it is spent.
func deleteResponse(r *pb.DeleteRangeRequest, res *statemachine.TxnOpResult, budget *answerBudget) *pb.DeleteRangeResponse {
	resp := &pb.DeleteRangeResponse{Deleted: int64(len(res.PrevKVs))}
	if !r.PrevKv {
		return resp
	}
	for i := range res.PrevKVs {
		budget.take(&res.PrevKVs[i], false)
	}
	if !budget.building() {
		return resp
	}
	resp.PrevKvs = make([]*mvccpb.KeyValue, len(res.PrevKVs))
	for i := range res.PrevKVs {
		resp.PrevKvs[i] = kvPB(&res.PrevKVs[i])
	}
	return resp
}

// txnChanged reports whether the operations of r that ran (res) changed
// a key: a put always does, a delete when it found something.
func txnChanged(r *pb.TxnRequest, res *statemachine.TxnResponse) bool {
	reqs := r.Success
	if !res.Succeeded {
		reqs = r.Failure
	}
	for i, req := range reqs {
		switch u := req.GetRequest().(type) {
		case *pb.RequestOp_RequestPut:
			return true
		case *pb.RequestOp_RequestDeleteRange:
			if len(res.Ops[i].PrevKVs) > 0 {
				return true
			}
		case *pb.RequestOp_RequestTxn:
			if txnChanged(u.RequestTxn, res.Ops[i].Txn) {
				return true
			}
		}
	}
	return false
}

// txnAnswer is the answer of Txn r that ran as res, counted whole before
// any of it is built: its Ranges' keys are converted one Range at a
// time, so a first pass sizes them all, and only an answer within the
// cap is built. Else it is etcd's clients' error for an answer too
// large.
func (s *kvServer) txnAnswer(r *pb.TxnRequest, res *statemachine.TxnResponse, revs txnRevs) (*pb.TxnResponse, error) {
	sizing := &answerBudget{max: s.maxAnswer, sizing: true}
	counted := revs
	txnResponse(r, res, &counted, sizing)
	if sizing.over() {
		return nil, sizing.err()
	}
	return txnResponse(r, res, &revs, newAnswerBudget(s.maxAnswer)), nil
}

// txnRevs follows the revision a Txn's operations see, for the headers of
// their responses: etcd gives each the revision of its write transaction
// at that point — begin until the first change, begin+1 from it on.
type txnRevs struct {
	begin   int64
	changed bool
}

func (v *txnRevs) now() int64 {
	if v.changed {
		return v.begin + 1
	}
	return v.begin
}

// txnResponse builds the response of the branch that ran, each operation
// answered as etcd answers it alone. The operations' headers hold only a
// revision, and a nested Txn's none, as in etcd; the caller sets the
// outer header. Every Range's keys and every prev_kv count against one
// budget; once it is spent the rest is only counted, and the caller
// answers budget.err() instead.
func txnResponse(r *pb.TxnRequest, res *statemachine.TxnResponse, revs *txnRevs, budget *answerBudget) *pb.TxnResponse {
	reqs := r.Success
	if !res.Succeeded {
		reqs = r.Failure
	}
	resp := &pb.TxnResponse{Succeeded: res.Succeeded, Responses: make([]*pb.ResponseOp, len(reqs))}
	for i, req := range reqs {
		op := &res.Ops[i]
		switch u := req.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			c := newRangeCollector(u.RequestRange, budget)
			for _, kv := range op.KVs {
				c.add(kv)
			}
			rr := c.response()
			if rr == nil {
				continue // the budget is spent: only counting
			}
			rr.Header = &pb.ResponseHeader{Revision: revs.now()}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			revs.changed = true
			pr := &pb.PutResponse{Header: &pb.ResponseHeader{Revision: revs.now()}}
			if u.RequestPut.PrevKv && op.PrevKV != nil && budget.take(op.PrevKV, false) && budget.building() {
				pr.PrevKv = kvPB(op.PrevKV)
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case *pb.RequestOp_RequestDeleteRange:
			dr := deleteResponse(u.RequestDeleteRange, op, budget)
			revs.changed = revs.changed || dr.Deleted > 0
			dr.Header = &pb.ResponseHeader{Revision: revs.now()}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		case *pb.RequestOp_RequestTxn:
			tr := txnResponse(u.RequestTxn, op.Txn, revs, budget)
			tr.Header = &pb.ResponseHeader{}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}}
		}
	}
	return resp
}
