package etcdapi

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The KV requests' checks, etcd's checkPutRequest, checkTxnRequest and
// their kin: what a request must be before anything is proposed or read,
// refused with etcd's errors.

// checkPut is etcd's checkPutRequest. A key and a value have no bound
// of their own, as in etcd: the request that carries them has
// (ServerOptions).
func checkPut(r *pb.PutRequest) error {
	switch {
	case len(r.Key) == 0:
		return rpctypes.ErrGRPCEmptyKey
	case r.IgnoreValue && len(r.Value) != 0:
		return rpctypes.ErrGRPCValueProvided
	case r.IgnoreLease && r.Lease != 0:
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

// checkTxn is etcd's checkTxnRequest, but for how operations count: no
// more than max compares and operations over every level of the Txn
// (txnOps), where etcd bounds each level alone.
func checkTxn(r *pb.TxnRequest, max int) error {
	if txnOps(r, max) > max {
		return rpctypes.ErrGRPCTooManyOps
	}
	return checkTxnFields(r)
}

// checkTxnFields checks what etcd's checkTxnRequest checks of each
// compare and operation, nested ones included.
func checkTxnFields(r *pb.TxnRequest) error {
	for _, c := range r.Compare {
		if len(c.Key) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
		if _, ok := cmpOps[c.Result]; !ok {
			return status.Errorf(codes.InvalidArgument, "etcdserver: unknown compare result %d", c.Result)
		}
		if _, ok := cmpTargets[c.Target]; !ok {
			return status.Errorf(codes.InvalidArgument, "etcdserver: unknown compare target %d", c.Target)
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if err := checkOp(op); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOp is etcd's checkRequestOp: an operation that is none of the
// four is answered "key not found", as etcd answers it.
func checkOp(op *pb.RequestOp) error {
	switch u := op.GetRequest().(type) {
	case *pb.RequestOp_RequestRange:
		if len(u.RequestRange.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	case *pb.RequestOp_RequestPut:
		if u.RequestPut == nil {
			return rpctypes.ErrGRPCEmptyKey
		}
		return checkPut(u.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		if len(u.RequestDeleteRange.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	case *pb.RequestOp_RequestTxn:
		if u.RequestTxn == nil {
			return rpctypes.ErrGRPCKeyNotFound
		}
		return checkTxnFields(u.RequestTxn)
	default:
		return rpctypes.ErrGRPCKeyNotFound
	}
	return nil
}

// interval is a deleted range as etcd's checkIntervals sees it:
// [begin, end), compared as plain strings, so that a range end of "\x00"
// (every key from begin on) covers no key there, as in etcd.
type interval struct{ begin, end string }

type intervals []interval

func (ivs intervals) contains(key string) bool {
	for _, iv := range ivs {
		if iv.begin <= key && key < iv.end {
			return true
		}
	}
	return false
}

// checkIntervals is etcd's rule against duplicate keys in a Txn, ported
// from its v3rpc/key.go: within one list of operations, and the branches
// of the Txns nested in it, a key may not be put twice, nor put and
// deleted; the two branches of one nested Txn may put the same key, as
// only one of them runs. It returns the keys put and ranges deleted, for
// the level above.
func checkIntervals(ops []*pb.RequestOp) (map[string]struct{}, intervals, error) {
	var dels intervals
	for _, op := range ops {
		d := op.GetRequestDeleteRange()
		if d == nil {
			continue
		}
		if len(d.RangeEnd) != 0 {
			dels = append(dels, interval{string(d.Key), string(d.RangeEnd)})
		} else {
			dels = append(dels, interval{string(d.Key), string(d.Key) + "\x00"})
		}
	}
	puts := map[string]struct{}{}
	for _, op := range ops {
		t := op.GetRequestTxn()
		if t == nil {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.Success)
		if err != nil {
			return nil, dels, err
		}
		putsElse, delsElse, err := checkIntervals(t.Failure)
		if err != nil {
			return nil, dels, err
		}
		for k := range putsThen {
			if _, ok := puts[k]; ok || dels.contains(k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range putsElse {
			if _, ok := puts[k]; ok {
				if _, inThen := putsThen[k]; !inThen {
					return nil, dels, rpctypes.ErrGRPCDuplicateKey
				}
			}
			if dels.contains(k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels = append(append(dels, delsThen...), delsElse...)
	}
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if _, ok := puts[k]; ok || dels.contains(k) {
			return nil, dels, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}

// txnSerializable is etcd's isTxnSerializable: every operation of both
// branches is a serializable range (a nested Txn makes it linearizable).
func txnSerializable(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if rr := op.GetRequestRange(); rr == nil || !rr.Serializable {
				return false
			}
		}
	}
	return true
}
