package etcdapi

import (
	"context"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tenurehq/tenure/statemachine"
)

// kvServer is etcd's KV service. Every write is a statemachine.Txn (a Put
// or a DeleteRange is a Txn of one operation) proposed through the
// Backend; reads, and Txns that write nothing, run on Backend.Read. It
// validates requests as etcd's v3rpc layer does, before anything reaches
// the log, so that a bad request changes nothing.
type kvServer struct {
	pb.UnimplementedKVServer
	b Backend
	// maxAnswer caps the bytes of one answer's keys and values
	// (answerBudget).
	maxAnswer int64
}

func newKV(b Backend) *kvServer { return &kvServer{b: b, maxAnswer: maxResponseBytes(b)} }

// kvPB is the etcd form of a key. Its lease is the etcd lease ID of the
// session the key is bound to, which a client may have chosen.
func kvPB(kv *statemachine.KeyValue) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{
		Key:            []byte(kv.Key),
		Value:          []byte(kv.Value),
		CreateRevision: kv.CreateRevision,
		ModRevision:    kv.ModRevision,
		Version:        kv.Version,
		Lease:          kv.EtcdLease(),
	}
}

func (s *kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if len(r.Key) == 0 {
		return nil, rpctypes.ErrGRPCEmptyKey
	}
	if err := s.b.Authorize(ctx, VerbRead, string(r.Key), string(r.RangeEnd)); err != nil {
		return nil, toGRPC(err)
	}
	budget := newAnswerBudget(s.maxAnswer)
	c := newRangeCollector(r, budget)
	var rev int64
	err := s.b.Read(ctx, r.Serializable, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		return m.RangeKeys(string(r.Key), string(r.RangeEnd), r.Revision, c.add)
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := c.response()
	if budget.over() {
		return nil, budget.err()
	}
	resp.Header = header(s.b, rev)
	return resp, nil
}

// rangeCollector turns the keys in a RangeRequest's range, given in key
// order, into its response, as etcd's applier does: count is every key in
// the range at the revision, before the min/max filters; with a sort
// order or a filter every key is read and the limit cut after sorting and
// filtering; otherwise only limit+1 keys are kept (the one extra tells
// `more`), and a sort target without an order sorts just those, ascending.
//
// It keeps the state machine's KeyValues, whose bytes it shares, and
// converts only those the answer sends, after counting their bytes
// against the answer's budget: nothing is converted once the budget is
// spent. Without a limit every key kept is sent, so it counts as it
// reads and stops keeping keys once the budget is spent; with one, the
// keys sent are known once sorted, and it counts them then.
type rangeCollector struct {
	r       *pb.RangeRequest
	budget  *answerBudget
	keepAll bool
	kvs     []statemachine.KeyValue
	count   int64
}

func newRangeCollector(r *pb.RangeRequest, budget *answerBudget) *rangeCollector {
	return &rangeCollector{
		r:      r,
		budget: budget,
		keepAll: r.Limit <= 0 || r.SortOrder != pb.RangeRequest_NONE ||
			r.MinModRevision != 0 || r.MaxModRevision != 0 ||
			r.MinCreateRevision != 0 || r.MaxCreateRevision != 0,
	}
}

// add takes the next key of the range; it always returns true, for
// RangeKeys, since every key counts.
func (c *rangeCollector) add(kv statemachine.KeyValue) bool {
	c.count++
	r := c.r
	switch {
	case r.CountOnly,
		!c.keepAll && int64(len(c.kvs)) > r.Limit,
		r.MaxModRevision != 0 && kv.ModRevision > r.MaxModRevision,
		r.MinModRevision != 0 && kv.ModRevision < r.MinModRevision,
		r.MaxCreateRevision != 0 && kv.CreateRevision > r.MaxCreateRevision,
		r.MinCreateRevision != 0 && kv.CreateRevision < r.MinCreateRevision:
		return true
	}
	if r.Limit <= 0 {
		// Sent, whatever the order: counted now, and kept only
		// while the answer may still be built.
		c.budget.take(&kv, r.KeysOnly)
		if !c.budget.building() {
			c.kvs = nil
			return true
		}
	}
	c.kvs = append(c.kvs, kv)
	return true
}

// response is the RangeResponse, without its header, or nil when the
// budget is spent (then the caller answers budget.err()) or only sizing.
func (c *rangeCollector) response() *pb.RangeResponse {
	r := c.r
	kvs := c.kvs
	order := r.SortOrder
	if order == pb.RangeRequest_NONE && r.SortTarget != pb.RangeRequest_KEY {
		order = pb.RangeRequest_ASCEND
	}
	// Past the budget the keys are only counted, and those sent
	// without a limit are all of them, in any order.
	if less := kvLess(r.SortTarget); order != pb.RangeRequest_NONE && less != nil && (r.Limit > 0 || c.budget.building()) {
		// sort.Sort with etcd's Less, not a stable sort: keys that tie
		// come out in the order etcd gives them.
		var sorter sort.Interface = kvSorter{kvs, less}
		if order == pb.RangeRequest_DESCEND {
			sorter = sort.Reverse(sorter)
		}
		sort.Sort(sorter)
	}
	resp := &pb.RangeResponse{Count: c.count}
	if r.Limit > 0 && int64(len(kvs)) > r.Limit {
		kvs, resp.More = kvs[:r.Limit], true
	}
	if r.Limit > 0 {
		for i := range kvs {
			c.budget.take(&kvs[i], r.KeysOnly)
		}
	}
	if !c.budget.building() {
		return nil
	}
	resp.Kvs = make([]*mvccpb.KeyValue, len(kvs))
	for i := range kvs {
		kv := kvs[i]
		if r.KeysOnly {
			kv.Value = "" // not copied to be dropped
		}
		resp.Kvs[i] = kvPB(&kv)
		if r.KeysOnly {
			resp.Kvs[i].Value = nil
		}
	}
	return resp
}

func kvLess(t pb.RangeRequest_SortTarget) func(a, b *statemachine.KeyValue) bool {
	switch t {
	case pb.RangeRequest_KEY:
		return func(a, b *statemachine.KeyValue) bool { return a.Key < b.Key }
	case pb.RangeRequest_VERSION:
		return func(a, b *statemachine.KeyValue) bool { return a.Version < b.Version }
	case pb.RangeRequest_CREATE:
		return func(a, b *statemachine.KeyValue) bool { return a.CreateRevision < b.CreateRevision }
	case pb.RangeRequest_MOD:
		return func(a, b *statemachine.KeyValue) bool { return a.ModRevision < b.ModRevision }
	case pb.RangeRequest_VALUE:
		return func(a, b *statemachine.KeyValue) bool { return a.Value < b.Value }
	}
	return nil
}

type kvSorter struct {
	kvs  []statemachine.KeyValue
	less func(a, b *statemachine.KeyValue) bool
}

func (s kvSorter) Len() int { return len(s.kvs) }

func (s kvSorter) Less(i, j int) bool { return s.less(&s.kvs[i], &s.kvs[j]) }

func (s kvSorter) Swap(i, j int) { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }

func (s *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := checkPut(r); err != nil {
		return nil, err
	}
	if err := s.authorizePut(ctx, r); err != nil {
		return nil, toGRPC(err)
	}
	res, err := s.b.Propose(ctx, statemachine.Txn{Success: []statemachine.TxnOp{putOp(r)}})
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := &pb.PutResponse{Header: header(s.b, res.KVRevision)}
	if prev := res.Txn.Ops[0].PrevKV; r.PrevKv && prev != nil {
		resp.PrevKv = kvPB(prev)
	}
	return resp, nil
}

func (s *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if len(r.Key) == 0 {
		return nil, rpctypes.ErrGRPCEmptyKey
	}
	if err := s.authorizeDelete(ctx, r); err != nil {
		return nil, toGRPC(err)
	}
	res, err := s.b.Propose(ctx, statemachine.Txn{Success: []statemachine.TxnOp{deleteOp(r)}})
	if err != nil {
		return nil, toGRPC(err)
	}
	budget := newAnswerBudget(s.maxAnswer)
	resp := deleteResponse(r, &res.Txn.Ops[0], budget)
	if budget.over() {
		// Deleted all the same, as etcd deletes a range whose answer
		// gRPC then refuses to send.
		return nil, budget.err()
	}
	resp.Header = header(s.b, res.KVRevision)
	return resp, nil
}

func (s *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := checkTxn(r, maxTxnOps); err != nil {
		return nil, err
	}
	// After checkTxn, as etcd does, so that a huge request is refused
	// before the quadratic check.
	if _, _, err := checkIntervals(r.Success); err != nil {
		return nil, err
	}
	if _, _, err := checkIntervals(r.Failure); err != nil {
		return nil, err
	}
	if err := s.authorizeTxn(ctx, r); err != nil {
		return nil, toGRPC(err)
	}
	t := txnOf(r)
	if !t.Writes() {
		var (
			res *statemachine.TxnResponse
			rev int64
		)
		err := s.b.Read(ctx, txnSerializable(r), func(m *statemachine.Machine) error {
			var err error
			rev = m.KVRevision()
			res, err = m.ReadTxn(t)
			return err
		})
		if err != nil {
			return nil, toGRPC(err)
		}
		resp, err := s.txnAnswer(r, res, txnRevs{begin: rev})
		if err != nil {
			return nil, err
		}
		resp.Header = header(s.b, rev)
		return resp, nil
	}
	res, err := s.b.Propose(ctx, t)
	if err != nil {
		return nil, toGRPC(err)
	}
	revs := txnRevs{begin: res.KVRevision}
	if txnChanged(r, res.Txn) {
		revs.begin--
	}
	resp, err := s.txnAnswer(r, res.Txn, revs)
	if err != nil {
		// Applied all the same, as etcd applies a Txn whose answer
		// gRPC then refuses to send.
		return nil, err
	}
	resp.Header = header(s.b, res.KVRevision)
	return resp, nil
}

func (s *kvServer) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	// etcd lets only an admin compact; here, whoever may write every key.
	if err := s.b.Authorize(ctx, VerbWrite, "\x00", "\x00"); err != nil {
		return nil, toGRPC(err)
	}
	// Physical needs nothing more: the versions are gone once it applies.
	res, err := s.b.Propose(ctx, statemachine.Compact{Revision: r.Revision})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.CompactionResponse{Header: header(s.b, res.KVRevision)}, nil
}

// authorizePut checks what etcd's checkPutAuth checks: write on the key,
// read on it for prev_kv, and, with a policy, write on every key already
// attached to the lease (who may not revoke the lease may not attach to
// it).
func (s *kvServer) authorizePut(ctx context.Context, r *pb.PutRequest) error {
	if err := s.b.Authorize(ctx, VerbWrite, string(r.Key), ""); err != nil {
		return err
	}
	if r.Lease != 0 && s.b.AuthEnabled() {
		if err := authorizeLeaseKeys(ctx, s.b, r.Lease); err != nil {
			return err
		}
	}
	if r.PrevKv {
		return s.b.Authorize(ctx, VerbRead, string(r.Key), "")
	}
	return nil
}

// authorizeLeaseKeys checks that the caller may write every key attached
// to etcd lease id, as etcd's checkLeasePuts does; a lease that is gone
// has none.
func authorizeLeaseKeys(ctx context.Context, b Backend, id int64) error {
	var keys []string
	err := b.Read(ctx, true, func(m *statemachine.Machine) error {
		if sess, ok := m.SessionByLease(id); ok {
			keys = m.SessionKeys(sess.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := b.Authorize(ctx, VerbWrite, k, ""); err != nil {
			return err
		}
	}
	return nil
}

func (s *kvServer) authorizeDelete(ctx context.Context, r *pb.DeleteRangeRequest) error {
	if err := s.b.Authorize(ctx, VerbWrite, string(r.Key), string(r.RangeEnd)); err != nil {
		return err
	}
	if r.PrevKv {
		return s.b.Authorize(ctx, VerbRead, string(r.Key), string(r.RangeEnd))
	}
	return nil
}

// authorizeTxn is etcd's checkTxnAuth: read on every compare's range, and
// each operation of both branches as if it were sent alone.
func (s *kvServer) authorizeTxn(ctx context.Context, r *pb.TxnRequest) error {
	for _, c := range r.Compare {
		if err := s.b.Authorize(ctx, VerbRead, string(c.Key), string(c.RangeEnd)); err != nil {
			return err
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			var err error
			switch u := op.GetRequest().(type) {
			case *pb.RequestOp_RequestRange:
				err = s.b.Authorize(ctx, VerbRead, string(u.RequestRange.Key), string(u.RequestRange.RangeEnd))
			case *pb.RequestOp_RequestPut:
				err = s.authorizePut(ctx, u.RequestPut)
			case *pb.RequestOp_RequestDeleteRange:
				err = s.authorizeDelete(ctx, u.RequestDeleteRange)
			case *pb.RequestOp_RequestTxn:
				err = s.authorizeTxn(ctx, u.RequestTxn)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
